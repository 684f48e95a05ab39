package provisioner

import (
	"testing"

	"github.com/kube-storage/csi-provisioner/pkg/inflight"
)

// TestEqualButInflightLeavesItsArguments: equalButInflight compares two
// informer objects (shared cache copies): it must not remove the recorded
// volume name from them, or VolumeName would no longer see it.
func TestEqualButInflightLeavesItsArguments(t *testing.T) {
	a := newClaim("c").Annotation(inflight.AnnVolumeName, "old-prefix-0d6e2f3a").Annotation("x", "y").Obj()
	inflight.Add(a, "")
	b := a.DeepCopy()
	b.ResourceVersion = "2"
	if !equalButInflight(a, b) {
		t.Fatal("equalButInflight = false for two versions that differ only in resourceVersion")
	}
	for _, c := range []*struct{ name, got string }{{"old", a.Annotations[inflight.AnnVolumeName]}, {"new", b.Annotations[inflight.AnnVolumeName]}} {
		if c.got != "old-prefix-0d6e2f3a" {
			t.Errorf("the %s claim's %s is %q after the comparison, want it untouched", c.name, inflight.AnnVolumeName, c.got)
		}
	}
}
