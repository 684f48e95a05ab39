package binder

import (
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/cache"

	"github.com/kube-storage/csi-provisioner/internal/testutil"
)

func TestEventHandlers(t *testing.T) {
	pending := claimB("pending").Class("fast").Obj()
	pendingOther := claimB("pending-other").Class("slow").Obj()
	boundClaim := claimB("c1").Class("fast").VolumeName("pv1").Annotation(annBindCompleted, "yes").Obj()
	available := volumeB("pv1").Class("fast").Obj()
	newPending := volumeB("pv1").Class("fast").Phase(corev1.VolumePending).Obj()
	reserved := volumeB("pv1").Class("fast").ClaimRef(ns, "c1", "uid-c1").Obj()
	reservedOther := volumeB("pv1").Class("fast").ClaimRef(ns, "c2", "uid-c2").Obj()
	foreign := testutil.NewPV("pv1", otherDriver).Class("fast").Obj()
	unscheduled := testutil.NewPod(ns, "p1", "", "c1", "c2")
	scheduled := testutil.NewPod(ns, "p1", "node-1", "c1")

	tests := []struct {
		name    string
		objects []runtime.Object
		handle  func(b *Binder)
		want    []string
	}{
		{
			name:    "a volume that becomes Available queues the pending claims of its class",
			objects: []runtime.Object{pending, pendingOther, boundClaim},
			handle:  func(b *Binder) { b.onVolumeUpdate(newPending, available) },
			want:    []string{"pvc/ns/pending", "pv/pv1"},
		},
		{
			name:    "a new Available volume queues the pending claims of its class",
			objects: []runtime.Object{pending, pendingOther},
			handle:  func(b *Binder) { b.onVolumeAdd(available) },
			want:    []string{"pvc/ns/pending", "pv/pv1"},
		},
		{
			name:    "an Available volume that does not change queues no claims",
			objects: []runtime.Object{pending},
			handle:  func(b *Binder) { b.onVolumeUpdate(available, available) },
			want:    []string{"pv/pv1"},
		},
		{
			name:   "a volume with a claimRef queues that claim",
			handle: func(b *Binder) { b.onVolumeAdd(reserved) },
			want:   []string{"pvc/ns/c1", "pv/pv1"},
		},
		{
			name:   "a claimRef that changes queues both claims",
			handle: func(b *Binder) { b.onVolumeUpdate(reservedOther, reserved) },
			want:   []string{"pvc/ns/c1", "pvc/ns/c2", "pv/pv1"},
		},
		{
			name:   "a deleted volume queues its claim (tombstone)",
			handle: func(b *Binder) { b.onVolumeDelete(cache.DeletedFinalStateUnknown{Key: "pv1", Obj: reserved}) },
			want:   []string{"pvc/ns/c1"},
		},
		{
			name: "a volume of another driver is ignored",
			handle: func(b *Binder) {
				b.onVolumeAdd(foreign)
				b.onVolumeUpdate(foreign, foreign)
				b.onVolumeDelete(foreign)
			},
		},
		{
			name:    "a claim is queued with the volumes that point at its name",
			objects: []runtime.Object{reserved},
			handle:  func(b *Binder) { b.onClaimAdd(claimB("c1").Obj()) },
			want:    []string{"pvc/ns/c1", "pv/pv1"},
		},
		{
			name:   "a claim that gets a volumeName queues the volume",
			handle: func(b *Binder) { b.onClaimUpdate(claimB("c1").Obj(), boundClaim) },
			want:   []string{"pvc/ns/c1", "pv/pv1"},
		},
		{
			name:   "a deleted claim queues its volume (tombstone)",
			handle: func(b *Binder) { b.onClaimDelete(cache.DeletedFinalStateUnknown{Key: "ns/c1", Obj: boundClaim}) },
			want:   []string{"pv/pv1"},
		},
		{
			name:    "a class change queues its pending claims",
			objects: []runtime.Object{pending, pendingOther},
			handle:  func(b *Binder) { b.onClass(classFast()) },
			want:    []string{"pvc/ns/pending"},
		},
		{
			name:   "an unscheduled pod queues its claims",
			handle: func(b *Binder) { b.onPod(unscheduled) },
			want:   []string{"pvc/ns/c1", "pvc/ns/c2"},
		},
		{
			name:   "a scheduled pod queues nothing",
			handle: func(b *Binder) { b.onPod(scheduled) },
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, tt.objects)
			tt.handle(f.binder)
			if diff := cmp.Diff(tt.want, f.queued()); diff != "" {
				t.Errorf("queued (-want +got):\n%s", diff)
			}
		})
	}
}

// TestUIDNamedVolumesNotIndexed checks the memory WithUIDNamedVolumes saves:
// a claim and a volume named after the claim's UID take no entry in the
// binder's indexes; a static binding still does.
func TestUIDNamedVolumesNotIndexed(t *testing.T) {
	c1 := claimB("c1").Class("fast").VolumeName("pvc-uid-c1").Annotation(annBindCompleted, "yes").Phase(corev1.ClaimBound).Obj()
	c2 := claimB("c2").Class("fast").VolumeName("pv-static").Annotation(annBindCompleted, "yes").Phase(corev1.ClaimBound).Obj()
	pv1 := volumeB("pvc-uid-c1").Class("fast").BoundTo(c1).Phase(corev1.VolumeBound).Obj()
	pv2 := volumeB("pv-static").Class("fast").BoundTo(c2).Phase(corev1.VolumeBound).Obj()
	for _, tc := range []struct {
		prefix            string
		claimKeys, pvKeys []string
	}{
		{"", []string{"pv-static", "pvc-uid-c1"}, []string{ns + "/c1", ns + "/c2"}},
		{"pvc", []string{"pv-static"}, []string{ns + "/c2"}},
	} {
		f := newFixture(t, objs(classFast(), c1, c2, pv1, pv2), WithUIDNamedVolumes(tc.prefix))
		claimKeys := f.binder.pvcInformer.GetIndexer().ListIndexFuncValues(indexClaimByVolume)
		pvKeys := f.binder.pvInformer.GetIndexer().ListIndexFuncValues(f.binder.volumes.Name())
		slices.Sort(claimKeys)
		slices.Sort(pvKeys)
		if !slices.Equal(claimKeys, tc.claimKeys) || !slices.Equal(pvKeys, tc.pvKeys) {
			t.Errorf("prefix %q: claim index keys %v, want %v; volume index keys %v, want %v", tc.prefix, claimKeys, tc.claimKeys, pvKeys, tc.pvKeys)
		}
		// Lookups still find both.
		if got := f.binder.otherClaimBoundTo(pv1, &corev1.ObjectReference{Namespace: ns, Name: "c1", UID: "uid-other"}); got == nil || got.Name != "c1" {
			t.Errorf("prefix %q: otherClaimBoundTo(%s) = %v, want c1", tc.prefix, pv1.Name, got)
		}
		if got := f.binder.volumesReferencing(c1); len(got) != 1 || got[0].Name != pv1.Name {
			t.Errorf("prefix %q: volumesReferencing(c1) = %v, want %s", tc.prefix, got, pv1.Name)
		}
	}
}
