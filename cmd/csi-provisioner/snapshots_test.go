package main

import (
	"errors"
	"testing"

	snapfake "github.com/kubernetes-csi/external-snapshotter/client/v8/clientset/versioned/fake"
	authv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kube-storage/csi-provisioner/pkg/csiclient"
)

// TestSnapshotInformer: the VolumeSnapshot informer exists only for a
// driver that restores snapshots, an API server that serves them and RBAC
// that lets the sidecar list and watch them; an access review that fails
// leaves it out too (restores work without it).
func TestSnapshotInformer(t *testing.T) {
	served := func(resources ...string) []*metav1.APIResourceList {
		return apiResources("snapshot.storage.k8s.io/v1", resources...)
	}
	tests := []struct {
		name      string
		restores  bool // CREATE_DELETE_SNAPSHOT
		resources []*metav1.APIResourceList
		denied    string // the verb the access review refuses
		reviewErr error
		want      bool
		wantErr   bool
	}{
		{name: "all there", restores: true, resources: served("volumesnapshots", "volumesnapshotcontents"), want: true},
		{name: "driver does not snapshot", resources: served("volumesnapshots")},
		{name: "group not served", restores: true},
		{name: "volumesnapshots not served", restores: true, resources: served("volumesnapshotcontents")},
		{name: "list refused", restores: true, resources: served("volumesnapshots"), denied: "list"},
		{name: "watch refused", restores: true, resources: served("volumesnapshots"), denied: "watch"},
		// Optional: the sidecar goes on without the cache.
		{name: "access review fails", restores: true, resources: served("volumesnapshots"), reviewErr: errors.New("boom")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			client := fake.NewClientset()
			client.Resources = tt.resources
			var reviewed []string
			client.PrependReactor("create", "selfsubjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
				review := a.(k8stesting.CreateAction).GetObject().(*authv1.SelfSubjectAccessReview)
				attrs := review.Spec.ResourceAttributes
				reviewed = append(reviewed, attrs.Verb+" "+attrs.Resource+"."+attrs.Group)
				review.Status.Allowed = attrs.Verb != tt.denied
				return true, review, tt.reviewErr
			})
			caps := csiclient.Capabilities{CreateDeleteSnapshot: tt.restores}
			inf, err := snapshotInformer(t.Context(), caps, client, snapfake.NewSimpleClientset(), client.Discovery()) //nolint:staticcheck // this clientset has no NewClientset
			if (err != nil) != tt.wantErr {
				t.Fatalf("error %v, want one: %v", err, tt.wantErr)
			}
			if (inf != nil) != tt.want {
				t.Errorf("informer %v, want one: %v", inf != nil, tt.want)
			}
			if tt.want && len(reviewed) != 2 {
				t.Errorf("access reviews %v, want list and watch of volumesnapshots.snapshot.storage.k8s.io", reviewed)
			}
		})
	}
}

// apiResources is what a fake clientset's discovery serves: groupVersion
// with the named resources.
func apiResources(groupVersion string, resources ...string) []*metav1.APIResourceList {
	l := &metav1.APIResourceList{GroupVersion: groupVersion}
	for _, r := range resources {
		l.APIResources = append(l.APIResources, metav1.APIResource{Name: r})
	}
	return []*metav1.APIResourceList{l}
}
