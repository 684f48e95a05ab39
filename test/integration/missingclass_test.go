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
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-storage/csi-provisioner/internal/testutil"
	"github.com/kube-storage/csi-provisioner/pkg/binder"
)

// TestMissingClassReportedOnce: a claim naming a class that does not exist
// is seen by every binder in the cluster, and each would post the same
// Warning "storageclass.storage.k8s.io "x" not found". With two sidecars of
// this product (drivers a and b) it gets one such Warning: from
// kube-controller-manager's binder when that runs (it reports at once, and
// both sidecars find its event at their turn), else from the sidecar whose
// turn comes first (the other finds that one's event).
func TestMissingClassReportedOnce(t *testing.T) {
	for _, kcm := range []bool{true, false} {
		t.Run(fmt.Sprintf("kube-controller-manager binder %v", kcm), func(t *testing.T) {
			c := newClusterWith(t, kcm)
			a := c.startDriver("a", false, nil)
			b := c.startDriver("b", false, nil)
			class := c.name("no-such-class")

			// Two binders whose turns are close can both report (a known
			// limit): take a claim whose turns are 300ms apart or more.
			var claim *corev1.PersistentVolumeClaim
			var turnA, turnB time.Duration
			for i := 0; ; i++ {
				claim = c.createClaim(testutil.NewPVC(c.ns, fmt.Sprintf("ghost-%d", i)).Class(class))
				turnA, turnB = binder.MissingClassTurn(claim.UID, a.Name), binder.MissingClassTurn(claim.UID, b.Name)
				if (turnA - turnB).Abs() >= 300*time.Millisecond {
					break
				}
				c.deleteClaim(claim.Name)
				if i == 20 {
					t.Fatal("no claim with turns 300ms apart in 21 tries")
				}
			}
			t.Logf("claim %s: turn of a %v, of b %v", claim.Name, turnA, turnB)

			want := fmt.Sprintf(`storageclass.storage.k8s.io %q not found`, class)
			warnings := func(ctx context.Context) ([]string, error) {
				list, err := c.c.CoreV1().Events(c.ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.uid=" + string(claim.UID)})
				if err != nil {
					return nil, err
				}
				var sources []string
				for _, e := range list.Items {
					if e.Type == corev1.EventTypeWarning && e.Message == want {
						sources = append(sources, e.Source.Component)
					}
				}
				if len(sources) > 1 {
					return nil, fmt.Errorf("Warnings %q from %q, want one", want, sources)
				}
				return sources, nil
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
				testutil.Eventually(t, 0, "sidecar "+short+" did not find the other binder's Warning", func(ctx context.Context) (bool, error) {
					if _, err := warnings(ctx); err != nil {
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
			sources, err := warnings(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if len(sources) != 1 {
				t.Errorf("Warnings %q from %q, want one", want, sources)
			}
			if kcm && len(sources) == 1 && sources[0] != "persistentvolume-controller" {
				t.Errorf("Warning from %q, want kube-controller-manager's (persistentvolume-controller)", sources[0])
			}
		})
	}
}
