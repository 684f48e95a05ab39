package binder

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-storage/csi-provisioner/internal/events"
	"github.com/kube-storage/csi-provisioner/internal/testutil"
)

// TestWaitForPodScheduledNotRepeatedOnOtherUpdates: only a reschedule
// (selected-node removed) starts the wait again. Any other update of a
// waiting claim (a label, the provisioner's or the user's annotations)
// must not post WaitForPodScheduled again: one event per cause.
func TestWaitForPodScheduledNotRepeatedOnOtherUpdates(t *testing.T) {
	log := &eventLog{}
	claim := claimB("c1").Class("wait").Obj()
	pod := testutil.NewPod(ns, "p1", "", "c1")
	f := newFixture(t, objs(classWait(), claim, pod), WithEventRecorder(events.NewDeduplicator(log, 0)))
	sync := func() {
		t.Helper()
		f.loadInformers()
		if _, err := f.binder.syncClaim(f.ctx, ns+"/c1"); err != nil {
			t.Fatal(err)
		}
	}
	sync()
	if len(log.events) != 1 {
		t.Fatalf("events = %q, want one WaitForPodScheduled", log.events)
	}
	old := f.claim("c1")
	c := old.DeepCopy()
	metav1.SetMetaDataAnnotation(&c.ObjectMeta, "example.com/owner", "team-a")
	updated, err := f.client.CoreV1().PersistentVolumeClaims(ns).Update(f.ctx, c, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	f.binder.onClaimUpdate(old, updated)
	log.events = nil
	sync()
	if len(log.events) != 0 {
		t.Errorf("events after an unrelated update = %q, want none (the wait did not start again)", log.events)
	}
}
