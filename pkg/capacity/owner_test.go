package capacity

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	metadatafake "k8s.io/client-go/metadata/fake"
	"k8s.io/utils/ptr"
)

func TestLookupOwner(t *testing.T) {
	const ns = "csi"
	object := func(apiVersion, kind, name string, controller *metav1.PartialObjectMetadata) *metav1.PartialObjectMetadata {
		obj := &metav1.PartialObjectMetadata{
			TypeMeta:   metav1.TypeMeta{APIVersion: apiVersion, Kind: kind},
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("uid-" + name)},
		}
		if controller != nil {
			obj.OwnerReferences = []metav1.OwnerReference{
				// A non-controller owner first: it must be skipped.
				{APIVersion: "v1", Kind: "ConfigMap", Name: "not-controller", UID: "uid-cm"},
				{APIVersion: controller.APIVersion, Kind: controller.Kind, Name: controller.Name, UID: controller.UID, Controller: ptr.To(true)},
			}
		}
		return obj
	}
	deployment := object("apps/v1", "Deployment", "provisioner", nil)
	replicaSet := object("apps/v1", "ReplicaSet", "provisioner-5d4f", deployment)
	pod := object("v1", "Pod", "provisioner-5d4f-xyz", replicaSet)
	orphan := object("v1", "Pod", "orphan", nil)
	ref := func(apiVersion, kind, name string) *metav1.OwnerReference {
		return &metav1.OwnerReference{APIVersion: apiVersion, Kind: kind, Name: name, UID: types.UID("uid-" + name), Controller: ptr.To(true)}
	}

	tests := []struct {
		name  string
		pod   string
		level int
		// noOwnerObject leaves the owner itself out of the API: its
		// controller reference names it, so it is never read.
		noOwnerObject bool
		want          *metav1.OwnerReference
		wantErr       string // substring of the error
	}{
		{name: "level 0 is the pod", pod: pod.Name, level: 0, want: ref("v1", "Pod", pod.Name)},
		{name: "level 1 is the ReplicaSet", pod: pod.Name, level: 1, want: ref("apps/v1", "ReplicaSet", replicaSet.Name)},
		{name: "level 2 is the Deployment", pod: pod.Name, level: 2, want: ref("apps/v1", "Deployment", deployment.Name)},
		{name: "level 2 without reading the Deployment", pod: pod.Name, level: 2, noOwnerObject: true, want: ref("apps/v1", "Deployment", deployment.Name)},
		{name: "level 3: the Deployment has no controller", pod: pod.Name, level: 3, wantErr: "Deployment csi/provisioner has no controller"},
		{name: "pod without controller", pod: orphan.Name, level: 1, wantErr: "Pod csi/orphan has no controller"},
		{name: "pod missing", pod: "missing", level: 0, wantErr: "get Pod csi/missing"},
		{name: "negative level", pod: pod.Name, level: -1, wantErr: "must not be negative"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			scheme := metadatafake.NewTestScheme()
			if err := metav1.AddMetaToScheme(scheme); err != nil {
				t.Fatal(err)
			}
			objects := []runtime.Object{replicaSet, pod, orphan}
			if !tt.noOwnerObject {
				objects = append(objects, deployment)
			}
			client := metadatafake.NewSimpleMetadataClient(scheme, objects...)
			got, err := LookupOwner(testContext(t), client, ns, tt.pod, tt.level)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("LookupOwner: got error %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("LookupOwner: %v", err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("owner (-want +got):\n%s", diff)
			}
		})
	}
}
