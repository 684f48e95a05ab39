package provisioner

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	storagehelpers "k8s.io/component-helpers/storage/volume"

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
			claims := libraryClient{Interface: client, attempts: l}.CoreV1().PersistentVolumeClaims(testNS)
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
