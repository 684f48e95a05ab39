package provisioner

import (
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kube-storage/csi-provisioner/pkg/inflight"
)

// TestCrossNamespaceCloneRetryAfterGrantRevoked: a clone's CreateVolume
// timed out; its ReferenceGrant is deleted while the claim lives on. The
// retry must check the grant again and send nothing: only a claim being
// deleted skips it (to let a created volume go).
func TestCrossNamespaceCloneRetryAfterGrantRevoked(t *testing.T) {
	h, clone, class, grants := newGrantedClone(t)
	h.driver.createAnswers = []createAnswer{{err: csiErr(codes.DeadlineExceeded)}, {vol: &csi.Volume{VolumeId: "id-clone", CapacityBytes: 1 << 30}}}
	if _, _, err := h.provision(clone, class); err == nil {
		t.Fatal("the first Provision succeeded, want the timeout")
	}
	grants.allowed = nil // the ReferenceGrant is deleted
	out, state, err := h.provision(h.liveClaim(clone), class)
	if n := len(h.driver.createCalls()); n != 1 || err == nil {
		t.Errorf("retry after the grant was revoked: %d CreateVolume calls (want 1, the timed-out one), Provision = %v, %v, %v (want the grant error)", n, out != nil, state, err)
	}
}

// TestCrossNamespaceCloneFinalDeletedAfterGrantRevoked: the clone's last
// CreateVolume got a final answer (no volume exists), the grant is
// deleted and so is the clone. Nothing is in flight: the grant applies,
// and no CreateVolume may copy the other namespace's volume.
func TestCrossNamespaceCloneFinalDeletedAfterGrantRevoked(t *testing.T) {
	h, clone, class, grants := newGrantedClone(t)
	h.driver.createAnswers = []createAnswer{{err: csiErr(codes.InvalidArgument)}, {vol: &csi.Volume{VolumeId: "id-clone", CapacityBytes: 1 << 30}}}
	if _, _, err := h.provision(clone, class); err == nil {
		t.Fatal("the first Provision succeeded, want the final answer")
	}
	if s := h.p.attempts.state(clone.UID); s != attemptFinal {
		t.Fatalf("state %v after a final answer, want attemptFinal", s)
	}
	grants.allowed = nil
	deleting := h.deleteClaim(clone)
	if !inflight.Has(deleting) {
		t.Fatal("the finalizer was removed already")
	}
	if out, _, err := h.provision(deleting, class); out != nil {
		t.Errorf("Provision of the deleted clone = a PV, %v; want none", err)
	}
	if n := len(h.driver.createCalls()); n != 1 {
		t.Errorf("%d CreateVolume calls, want 1: none may follow a final answer once the grant is gone", n)
	}
}

// TestKeepsSourceOfByState: a cross-namespace clone without a grant keeps
// its source only while it carries the in-flight finalizer and this
// process sent a CreateVolume for it (answered finally or not).
func TestKeepsSourceOfByState(t *testing.T) {
	for _, tt := range []struct {
		name      string
		finalizer bool
		steps     func(l *ledger, uid types.UID)
		want      bool
	}{
		{name: "sent, finalizer", finalizer: true, steps: func(l *ledger, uid types.UID) { l.begin(uid) }, want: true},
		{name: "final answer, finalizer", finalizer: true, steps: func(l *ledger, uid types.UID) { l.begin(uid); l.final(uid) }, want: true},
		{name: "created, no finalizer (the binder removed it at bind)", steps: func(l *ledger, uid types.UID) { l.begin(uid); l.created(uid) }, want: false},
		{name: "user-set finalizer, nothing sent", finalizer: true, steps: func(*ledger, types.UID) {}, want: false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b := cloneOf("src")
			if tt.finalizer {
				b = b.Finalizers(inflight.Finalizer)
			}
			claim := fromNamespace(b.Obj(), sourceNS)
			h := newHarness(t, cloneCaps(), objs(claim), WithReferenceGrants(&fakeGrants{}))
			tt.steps(h.p.attempts, claim.UID)
			if got := h.p.keepsSourceOf(claim); got != tt.want {
				t.Errorf("keepsSourceOf = %t, want %t", got, tt.want)
			}
		})
	}
}

// TestCrossNamespaceCloneCreatedDeletedAfterGrantRevoked: the clone's
// CreateVolume succeeded but its PV was never saved (the library gives the
// claim back before its informer has the PV, or the save failed); the
// ReferenceGrant is then deleted and so is the clone. The volume exists in
// the backend: Provision must still return its PV (a repeated
// CreateVolume, answered from the existing volume), or the volume leaks
// and the claim keeps its in-flight finalizer for ever.
func TestCrossNamespaceCloneCreatedDeletedAfterGrantRevoked(t *testing.T) {
	h, clone, class, grants := newGrantedClone(t)
	vol := &csi.Volume{VolumeId: "id-clone", CapacityBytes: 1 << 30,
		ContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: "handle-pv-src"}}}}
	h.driver.createAnswers = []createAnswer{{vol: vol}, {vol: vol}}
	if out, _, err := h.provision(clone, class); err != nil || out == nil {
		t.Fatalf("first Provision = %v, %v; want the PV", out, err)
	}
	if s := h.p.attempts.state(clone.UID); s != attemptCreated {
		t.Fatalf("state %v after the create, want attemptCreated", s)
	}

	grants.allowed = nil // the ReferenceGrant is deleted
	deleting := h.deleteClaim(clone)
	pvOut, state, err := h.provision(deleting, class)
	if err != nil || pvOut == nil {
		t.Fatalf("Provision of the deleted clone whose volume was created = %v, %v, %v; want its volume's PV, so that it is released and deleted", pvOut, state, err)
	}
}
