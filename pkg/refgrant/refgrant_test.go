package refgrant

import (
	"errors"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	fakediscovery "k8s.io/client-go/discovery/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
)

// newGrant returns a ReferenceGrant in namespace with the given from and to
// entries, as the API server would hand them to an informer.
func newGrant(namespace, name string, from []map[string]interface{}, to []map[string]interface{}) *unstructured.Unstructured {
	toSlice := func(ms []map[string]interface{}) []interface{} {
		out := make([]interface{}, len(ms))
		for i, m := range ms {
			out[i] = m
		}
		return out
	}
	return &unstructured.Unstructured{Object: map[string]interface{}{
		"apiVersion": Group + "/v1beta1",
		"kind":       "ReferenceGrant",
		"metadata":   map[string]interface{}{"namespace": namespace, "name": name},
		"spec":       map[string]interface{}{"from": toSlice(from), "to": toSlice(to)},
	}}
}

func fromClaims(ns string) map[string]interface{} {
	return map[string]interface{}{"group": "", "kind": "PersistentVolumeClaim", "namespace": ns}
}

func toKind(group, kind string, name ...string) map[string]interface{} {
	m := map[string]interface{}{"group": group, "kind": kind}
	if len(name) > 0 {
		m["name"] = name[0]
	}
	return m
}

func TestAllows(t *testing.T) {
	snapshot := Reference{Namespace: "src", Group: "snapshot.storage.k8s.io", Kind: "VolumeSnapshot", Name: "snap"}
	claim := Reference{Namespace: "src", Group: "", Kind: "PersistentVolumeClaim", Name: "data"}
	from := []map[string]interface{}{fromClaims("dst")}
	tests := []struct {
		name   string
		grants []*unstructured.Unstructured
		to     Reference
		want   bool
	}{
		{name: "no grant", to: claim},
		{name: "claim of any name", grants: []*unstructured.Unstructured{newGrant("src", "g", from, []map[string]interface{}{toKind("", "PersistentVolumeClaim")})}, to: claim, want: true},
		{name: "claim by name", grants: []*unstructured.Unstructured{newGrant("src", "g", from, []map[string]interface{}{toKind("", "PersistentVolumeClaim", "data")})}, to: claim, want: true},
		{name: "empty name is any name", grants: []*unstructured.Unstructured{newGrant("src", "g", from, []map[string]interface{}{toKind("", "PersistentVolumeClaim", "")})}, to: claim, want: true},
		{name: "another name", grants: []*unstructured.Unstructured{newGrant("src", "g", from, []map[string]interface{}{toKind("", "PersistentVolumeClaim", "other")})}, to: claim},
		{name: "snapshot", grants: []*unstructured.Unstructured{newGrant("src", "g", from, []map[string]interface{}{toKind("snapshot.storage.k8s.io", "VolumeSnapshot")})}, to: snapshot, want: true},
		{name: "snapshot kind in the core group", grants: []*unstructured.Unstructured{newGrant("src", "g", from, []map[string]interface{}{toKind("", "VolumeSnapshot")})}, to: snapshot},
		{name: "claim kind in another group", grants: []*unstructured.Unstructured{newGrant("src", "g", from, []map[string]interface{}{toKind("example.com", "PersistentVolumeClaim")})}, to: claim},
		{name: "grant for snapshots, reference to a claim", grants: []*unstructured.Unstructured{newGrant("src", "g", from, []map[string]interface{}{toKind("snapshot.storage.k8s.io", "VolumeSnapshot")})}, to: claim},
		{name: "grant in another namespace", grants: []*unstructured.Unstructured{newGrant("dst", "g", from, []map[string]interface{}{toKind("", "PersistentVolumeClaim")})}, to: claim},
		{name: "from another namespace", grants: []*unstructured.Unstructured{newGrant("src", "g", []map[string]interface{}{fromClaims("elsewhere")}, []map[string]interface{}{toKind("", "PersistentVolumeClaim")})}, to: claim},
		{
			name:   "from another kind",
			grants: []*unstructured.Unstructured{newGrant("src", "g", []map[string]interface{}{{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "namespace": "dst"}}, []map[string]interface{}{toKind("", "PersistentVolumeClaim")})},
			to:     claim,
		},
		{
			name:   "from and to must be in the same grant",
			grants: []*unstructured.Unstructured{newGrant("src", "a", from, []map[string]interface{}{toKind("", "Secret")}), newGrant("src", "b", []map[string]interface{}{fromClaims("elsewhere")}, []map[string]interface{}{toKind("", "PersistentVolumeClaim")})},
			to:     claim,
		},
		{
			name:   "one of several entries",
			grants: []*unstructured.Unstructured{newGrant("src", "g", []map[string]interface{}{fromClaims("elsewhere"), fromClaims("dst")}, []map[string]interface{}{toKind("", "Secret"), toKind("", "PersistentVolumeClaim", "data")})},
			to:     claim, want: true,
		},
		{
			name: "an unreadable grant is skipped",
			grants: []*unstructured.Unstructured{
				{Object: map[string]interface{}{"metadata": map[string]interface{}{"namespace": "src", "name": "bad"}, "spec": map[string]interface{}{"from": "not a list"}}},
				newGrant("src", "good", from, []map[string]interface{}{toKind("", "PersistentVolumeClaim")}),
			},
			to: claim, want: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			indexer := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
			for _, g := range tt.grants {
				if err := indexer.Add(g); err != nil {
					t.Fatal(err)
				}
			}
			got, err := NewLister(indexer).Allows("dst", tt.to)
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("Allows(dst, %+v) = %v, want %v", tt.to, got, tt.want)
			}
		})
	}
}

func TestDiscover(t *testing.T) {
	served := func(gv string, names ...string) *metav1.APIResourceList {
		l := &metav1.APIResourceList{GroupVersion: gv}
		for _, n := range names {
			l.APIResources = append(l.APIResources, metav1.APIResource{Name: n, Namespaced: true, Kind: "ReferenceGrant"})
		}
		return l
	}
	tests := []struct {
		name      string
		resources []*metav1.APIResourceList
		want      schema.GroupVersionResource
		notServed bool
	}{
		{name: "both versions: v1", resources: []*metav1.APIResourceList{served(Group+"/v1beta1", Resource), served(Group+"/v1", Resource)}, want: schema.GroupVersionResource{Group: Group, Version: "v1", Resource: Resource}},
		{name: "v1beta1 only", resources: []*metav1.APIResourceList{served(Group+"/v1beta1", Resource, "httproutes")}, want: schema.GroupVersionResource{Group: Group, Version: "v1beta1", Resource: Resource}},
		{name: "the group without ReferenceGrants", resources: []*metav1.APIResourceList{served(Group+"/v1", "gateways")}, notServed: true},
		{name: "no Gateway API", notServed: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := &fakediscovery.FakeDiscovery{Fake: &clienttesting.Fake{Resources: tt.resources}}
			got, err := Discover(t.Context(), d)
			if tt.notServed {
				if !errors.Is(err, ErrNotServed) {
					t.Errorf("Discover() = %v, %v; want ErrNotServed", got, err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Errorf("Discover() = %v, %v; want %v", got, err, tt.want)
			}
		})
	}
}

func TestDiscoverError(t *testing.T) {
	d := &fakediscovery.FakeDiscovery{Fake: &clienttesting.Fake{}}
	d.AddReactor("get", "resource", func(clienttesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("connection refused")
	})
	if _, err := Discover(t.Context(), d); err == nil || errors.Is(err, ErrNotServed) {
		t.Errorf("Discover() with a failing API server: %v, want an error that is not ErrNotServed", err)
	}
}
