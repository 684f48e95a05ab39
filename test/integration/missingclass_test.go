package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/kube-storage/csi-provisioner/internal/testutil"
	"github.com/kube-storage/csi-provisioner/pkg/binder"
)

// TestMissingClassReportedOnce: a claim that is nobody's is seen by every
// binder in the cluster, and each would post the same event: a claim naming
// a class that does not exist gets the Warning "storageclass.storage.k8s.io
// "x" not found", one without a class that no volume fits the Normal
// FailedBinding "no persistent volumes available for this claim and no
// storage class is set". With two sidecars of this product (drivers a and
// b) it gets one such event: from kube-controller-manager's binder when that
// runs (it reports at once, and both sidecars find its event at their
// turn), else from the sidecar whose turn comes first (the other finds that
// one's event).
func TestMissingClassReportedOnce(t *testing.T) {
	for _, kcm := range []bool{true, false} {
		t.Run(fmt.Sprintf("kube-controller-manager binder %v", kcm), func(t *testing.T) {
			c := newClusterWith(t, kcm)
			a := c.startDriver("a", false, nil)
			b := c.startDriver("b", false, nil)
			class := c.name("no-such-class")
			t.Run("missing class", func(t *testing.T) {
				reportedOnce(t, c, a.Name, b.Name, kcm, func(i int) *testutil.PVCBuilder {
					return testutil.NewPVC(c.ns, fmt.Sprintf("ghost-%d", i)).Class(class)
				},
					corev1.EventTypeWarning, fmt.Sprintf(`storageclass.storage.k8s.io %q not found`, class))
			})
			t.Run("no class, nothing fits", func(t *testing.T) {
				reportedOnce(t, c, a.Name, b.Name, kcm, func(i int) *testutil.PVCBuilder {
					return testutil.NewPVC(c.ns, fmt.Sprintf("none-%d", i)).Class("").Selector(map[string]string{"none": c.ns})
				}, corev1.EventTypeNormal, "no persistent volumes available for this claim and no storage class is set")
			})
		})
	}
}

// reportedOnce creates claims newClaim(0), newClaim(1)... until one has turns
// of the binders of drivers a and b at least 300ms apart, and checks that it
// gets exactly one event of eventType with message, from
// kube-controller-manager's binder when kcm.
func reportedOnce(t *testing.T, c *cluster, a, b string, kcm bool, newClaim func(i int) *testutil.PVCBuilder, eventType, want string) {
	// Two binders whose turns are close can both report (a known
	// limit): take a claim whose turns are 300ms apart or more.
	var claim *corev1.PersistentVolumeClaim
	var turnA, turnB time.Duration
	for i := 0; ; i++ {
		claim = c.createClaim(newClaim(i))
		turnA, turnB = binder.MissingClassTurn(claim.UID, a), binder.MissingClassTurn(claim.UID, b)
		if (turnA - turnB).Abs() >= 300*time.Millisecond {
			break
		}
		c.deleteClaim(claim.Name)
		if i == 20 {
			t.Fatal("no claim with turns 300ms apart in 21 tries")
		}
	}
	t.Logf("claim %s: turn of a %v, of b %v", claim.Name, turnA, turnB)

	reported := func(ctx context.Context) ([]string, error) {
		return c.eventSources(ctx, claim.UID, func(e corev1.Event) bool { return e.Type == eventType && e.Message == want })
	}
	// The binders that do not report say so in their log (-v=4).
	quiet := []string{"a", "b"}
	if !kcm {
		quiet = []string{"b"}
		if turnB < turnA {
			quiet = []string{"a"}
		}
	}
	for _, short := range quiet {
		log := filepath.Join(c.dir, short, "provisioner.log")
		testutil.Eventually(t, 0, "sidecar "+short+" did not find the other binder's event", func(ctx context.Context) (bool, error) {
			if _, err := reported(ctx); err != nil {
				return false, err
			}
			data, err := os.ReadFile(log)
			if err != nil {
				return false, err
			}
			for _, line := range strings.Split(string(data), "\n") {
				if strings.Contains(line, "another binder has said so") && strings.Contains(line, claim.Name) {
					return true, nil
				}
			}
			return false, nil
		})
	}
	sources, err := reported(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(sources) != 1 {
		t.Errorf("events %q from %q, want one", want, sources)
	}
	if kcm && len(sources) == 1 && sources[0] != "persistentvolume-controller" {
		t.Errorf("event from %q, want kube-controller-manager's (persistentvolume-controller)", sources[0])
	}
}
