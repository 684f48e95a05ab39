package provisioner

import (
	"errors"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	storagehelpers "k8s.io/component-helpers/storage/volume"
	"sigs.k8s.io/sig-storage-lib-external-provisioner/v13/controller"

	"github.com/kube-storage/csi-provisioner/internal/testutil"
	"github.com/kube-storage/csi-provisioner/pkg/inflight"
)

// TestLibraryReschedule covers the library's reschedule Update: it also
// removes the in-flight finalizer exactly when nothing can be in flight.
func TestLibraryReschedule(t *testing.T) {
	// rescheduled is the claim as the library sends it: selected-node removed.
	rescheduled := func() *testutil.PVCBuilder { return newClaim("c").Finalizers(inflight.Finalizer) }
	tests := []struct {
		name     string
		claim    *corev1.PersistentVolumeClaim
		ledger   func(*ledger)
		wantKept bool
	}{
		{name: "after a final answer: removed", claim: rescheduled().Obj(), ledger: func(l *ledger) { l.final("uid-c") }},
		{name: "nothing sent since seen clean (the node is gone): removed", claim: rescheduled().Obj(), ledger: func(l *ledger) { l.observeClean("uid-c") }},
		{name: "create in flight: kept", claim: rescheduled().Obj(), ledger: func(l *ledger) { l.begin("uid-c") }, wantKept: true},
		{name: "nothing known (after a restart): kept", claim: rescheduled().Obj(), wantKept: true},
		{
			name: "still has a selected node: not a reschedule, kept", ledger: func(l *ledger) { l.final("uid-c") }, wantKept: true,
			claim: rescheduled().Annotation(storagehelpers.AnnSelectedNode, "n1").Obj(),
		},
		{name: "bound: kept", claim: rescheduled().VolumeName("pv").Obj(), ledger: func(l *ledger) { l.final("uid-c") }, wantKept: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			client := fake.NewClientset(tt.claim)
			l := newLedger()
			if tt.ledger != nil {
				tt.ledger(l)
			}
			claims := libraryClient{Interface: client, libraryHooks: &libraryHooks{attempts: l}}.CoreV1().PersistentVolumeClaims(testNS)
			sent := tt.claim.DeepCopy()
			got, err := claims.Update(t.Context(), sent, metav1.UpdateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if inflight.Has(got) != tt.wantKept {
				t.Errorf("finalizers after the update %v, want in-flight kept %v", got.Finalizers, tt.wantKept)
			}
			if !inflight.Has(sent) {
				t.Error("the library's object was changed")
			}
		})
	}
}

// TestLibraryRescheduleConflict: the library's reschedule Update comes from
// its copy of the claim, which lacks the in-flight finalizer the
// provisioner added in Provision when the binder is off. Such a conflict is
// resolved on the live claim, so that the library does not call
// CreateVolume again; any other change since the copy is left to the
// library's retry.
func TestLibraryRescheduleConflict(t *testing.T) {
	live := func() *testutil.PVCBuilder {
		return newClaim("c").RV("2").Annotation(storagehelpers.AnnSelectedNode, "n1").Finalizers(inflight.Finalizer)
	}
	// copied is the library's copy, taken before the finalizer was added,
	// as the library sends it: selected-node removed.
	copied := func() *testutil.PVCBuilder { return newClaim("c").RV("1") }
	tests := []struct {
		name        string
		live, sent  *corev1.PersistentVolumeClaim
		unnoted     bool // Provision did not answer Reschedule for the claim
		wantErr     bool
		wantUpdates int
	}{
		{name: "the live claim adds only the in-flight finalizer: rescheduled", live: live().Obj(), sent: copied().Obj(), wantUpdates: 2},
		{
			// The library saw n1; n2 was set by hand since: the reschedule
			// was for n1 and must not remove n2.
			name: "the live claim's selected node was changed by hand: conflict", wantErr: true, wantUpdates: 1,
			live: live().Annotation(storagehelpers.AnnSelectedNode, "n2").Obj(), sent: copied().Obj(),
		},
		{name: "no reschedule answer noted for the claim: conflict", live: live().Obj(), sent: copied().Obj(), unnoted: true, wantErr: true, wantUpdates: 1},
		{name: "the live claim has another change: conflict", live: live().Annotation("a", "b").Obj(), sent: copied().Obj(), wantErr: true, wantUpdates: 1},
		{name: "the live claim is another one: conflict", live: live().UID("uid-other").Obj(), sent: copied().Obj(), wantErr: true, wantUpdates: 1},
		{
			name: "not a reschedule: conflict", live: live().Obj(), wantErr: true, wantUpdates: 1,
			sent: copied().Annotation(storagehelpers.AnnSelectedNode, "n1").Annotation("a", "b").Obj(),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			client := fake.NewClientset(tt.live)
			updates := 0
			client.PrependReactor("update", "persistentvolumeclaims", func(a k8stesting.Action) (bool, runtime.Object, error) {
				updates++
				obj := a.(k8stesting.UpdateAction).GetObject().(*corev1.PersistentVolumeClaim)
				if obj.ResourceVersion != tt.live.ResourceVersion {
					return true, nil, apierrors.NewConflict(corev1.Resource("persistentvolumeclaims"), obj.Name, errors.New("the object has been modified"))
				}
				return false, nil, nil
			})
			l := newLedger()
			l.final("uid-c")
			notes := newRescheduleNotes()
			if !tt.unnoted {
				// Provision answered Reschedule for the library's copy,
				// which had selected-node n1.
				notes.note(newClaim("c").Annotation(storagehelpers.AnnSelectedNode, "n1").Obj())
			}
			claims := libraryClient{Interface: client, libraryHooks: &libraryHooks{attempts: l, reschedules: notes}}.CoreV1().PersistentVolumeClaims(testNS)
			got, err := claims.Update(t.Context(), tt.sent, metav1.UpdateOptions{})
			if _, noted := notes.take("uid-c"); noted && !metav1.HasAnnotation(tt.sent.ObjectMeta, storagehelpers.AnnSelectedNode) {
				t.Error("the note is still held after the reschedule Update")
			}
			if updates != tt.wantUpdates {
				t.Errorf("%d updates, want %d", updates, tt.wantUpdates)
			}
			if tt.wantErr {
				if !apierrors.IsConflict(err) {
					t.Errorf("err = %v, want the conflict", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if _, ok := got.Annotations[storagehelpers.AnnSelectedNode]; ok || inflight.Has(got) {
				t.Errorf("claim after the reschedule: annotations %v, finalizers %v; want neither selected-node nor the in-flight finalizer", got.Annotations, got.Finalizers)
			}
		})
	}
}

// TestProvisionNotesReschedule: Provision notes the selected node of the
// library's copy exactly when it answers ProvisioningReschedule, and a
// deleted claim's note is dropped.
func TestProvisionNotesReschedule(t *testing.T) {
	claim := newClaim("c").Annotation(storagehelpers.AnnSelectedNode, "gone").Obj()
	class := newClass().WaitForFirstConsumer().Obj()
	h := newHarness(t, topologyCaps(), append(cluster(), claim, class))
	if _, state, _ := h.provision(claim, class); state != controller.ProvisioningReschedule {
		t.Fatalf("state %v, want Reschedule", state)
	}
	if node, noted := h.p.reschedules.take(claim.UID); !noted || node != "gone" {
		t.Errorf("noted %q, %v; want the library's selected node %q", node, noted, "gone")
	}

	h.p.reschedules.note(claim)
	h.p.forgetClaim(claim)
	if _, noted := h.p.reschedules.take(claim.UID); noted {
		t.Error("a deleted claim's note is kept")
	}
}
