package provisioner

import (
	"testing"

	"github.com/kube-storage/csi-provisioner/pkg/inflight"
)

// TestChangeInflightNoWriteWhenAsWanted: adding the finalizer to a claim
// that has it, or removing it from one that does not, writes nothing.
func TestChangeInflightNoWriteWhenAsWanted(t *testing.T) {
	clean := newClaim("c").Obj()
	guarded := newClaim("g").Finalizers(inflight.Finalizer).Obj()
	h := newHarness(t, baseCaps(), objs(clean, guarded))
	h.client.ClearActions()
	if err := h.p.removeInflight(h.ctx, clean); err != nil {
		t.Fatal(err)
	}
	if err := h.p.addInflight(h.ctx, guarded); err != nil {
		t.Fatal(err)
	}
	for _, a := range h.client.Actions() {
		if a.GetVerb() == "update" {
			t.Errorf("%s %s: the finalizer was already as wanted", a.GetVerb(), a.GetResource().Resource)
		}
	}
}
