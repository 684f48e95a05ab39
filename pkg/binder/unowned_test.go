package binder

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// TestUnownedReportListsOnce checks that the events of a claim that is
// nobody's are listed once per events.RefreshInterval, not at every resync,
// whether this binder reported the claim or another one did, and that the
// cause is reported again once that interval has passed.
func TestUnownedReportListsOnce(t *testing.T) {
	claim := claimB("c1").Class("").Created(now.Add(-time.Hour)).Obj()
	other := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Namespace: ns, Name: "c1.kcm"},
		InvolvedObject: corev1.ObjectReference{Kind: "PersistentVolumeClaim", Namespace: ns, Name: "c1", UID: claim.UID},
		Type:           corev1.EventTypeNormal, Reason: reasonFailedBinding, Message: msgNoVolumeNoClass,
		Source: corev1.EventSource{Component: "persistentvolume-controller"}, LastTimestamp: metav1.NewTime(now.Add(-time.Minute)),
	}
	for _, tc := range []struct {
		name    string
		objects []runtime.Object
		// events posted at the first sync, and after RefreshInterval.
		first, later int
	}{
		{name: "reported by this binder", objects: objs(claim), first: 1, later: 1},
		// kube-controller-manager's event is a minute old when the clock
		// moves on: by then it is old too.
		{name: "reported by another binder", objects: objs(claim, other), first: 0, later: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, tc.objects)
			sync := func(wantLists, wantEvents int) {
				t.Helper()
				for range 3 {
					if _, err := f.binder.syncClaim(f.ctx, "ns/c1"); err != nil {
						t.Fatal(err)
					}
				}
				lists := 0
				for _, a := range f.client.Actions() {
					if a.GetVerb() == "list" && a.GetResource().Resource == "events" {
						lists++
					}
				}
				f.client.ClearActions()
				if got := len(f.events.take()); lists != wantLists || got != wantEvents {
					t.Errorf("three syncs listed events %d times and posted %d events, want %d and %d", lists, got, wantLists, wantEvents)
				}
			}
			sync(1, tc.first)
			f.clock.Step(30*time.Minute + time.Second)
			sync(1, tc.later)
		})
	}
}
