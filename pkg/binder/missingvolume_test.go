package binder

import (
	"errors"
	"testing"

	corev1 "k8s.io/api/core/v1"
	k8stesting "k8s.io/client-go/testing"
)

// TestMissingRequestedVolumeStatusRetried: the claim naming a missing
// volume gets its FailedBinding Warning, but the write of its Pending
// phase fails. The retry, which skips the read (the Warning is still
// fresh), must still write the phase: kube-controller-manager's claim is
// Pending, not without a phase.
func TestMissingRequestedVolumeStatusRetried(t *testing.T) {
	claim := claimB("c1").Class("fast").VolumeName("missing").Phase("").Obj() // just created
	f := newFixture(t, objs(classFast(), claim))
	failed := false
	f.api.fail = func(_ int, a k8stesting.Action) error {
		if a.GetSubresource() == "status" && !failed {
			failed = true
			return errors.New("etcdserver: request timed out")
		}
		return nil
	}
	f.loadInformers()
	if _, err := f.runSync("pvc/c1"); err == nil {
		t.Fatal("first sync: no error from the failed status write")
	}
	f.loadInformers()
	if _, err := f.runSync("pvc/c1"); err != nil {
		t.Fatalf("second sync: %v", err)
	}
	if got := f.claim("c1").Status.Phase; got != corev1.ClaimPending {
		t.Errorf("claim phase %q after the retry, want Pending", got)
	}
	if got := f.events.take(); len(got) != 1 {
		t.Errorf("events %q, want one FailedBinding", got)
	}
}
