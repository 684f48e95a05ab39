package binder

import (
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
