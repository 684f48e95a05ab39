package e2e

import (
	"context"
	"os"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-storage/csi-provisioner/internal/testutil"
	"github.com/kube-storage/csi-provisioner/pkg/inflight"
)

// TestTerminatingNamespaceExplained: the driver answers every CreateVolume
// with ALREADY_EXISTS (a volume of the claim's name with other
// parameters), so the claim keeps its in-flight finalizer. Its namespace
// is then deleted: the claim stays Terminating, and so does the
// namespace, and the API server refuses every new event there. The
// Warning that says what to do is then in the sidecar's log at the
// default verbosity, naming the claim.
func TestTerminatingNamespaceExplained(t *testing.T) {
	s := newStack(t, stackConfig{driverArgs: []string{"--fail-create-rate=1", "--fail-code=AlreadyExists"}})
	ctx := t.Context()
	sc := s.class("exists", nil)
	claim := s.claim(testutil.NewPVC(s.ns, "stuck").Class(sc.Name))
	s.waitEvent(s.ns, string(claim.UID), corev1.EventTypeWarning, "ProvisioningFailed", "AlreadyExists")
	if got := s.getClaim(claim.Name); !inflight.Has(got) {
		t.Fatalf("finalizers %v: want the in-flight finalizer after ALREADY_EXISTS", got.Finalizers)
	}

	if err := s.c.CoreV1().Namespaces().Delete(ctx, s.ns, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// Without kube-controller-manager's namespace controller, delete the
	// claim as it would.
	if err := s.c.CoreV1().PersistentVolumeClaims(s.ns).Delete(ctx, claim.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	want := []string{
		`"Warning event not written: its namespace is being deleted"`,
		`object="` + s.ns + `/` + claim.Name + `"`,
		`reason="ProvisioningFailed"`,
		"claim is being deleted but keeps finalizer " + inflight.Finalizer,
	}
	testutil.Eventually(t, 0, "no log line with "+strings.Join(want, " "), func(context.Context) (bool, error) {
		b, err := os.ReadFile(s.sidecar.LogPath)
		if err != nil {
			return false, err
		}
		for line := range strings.SplitSeq(string(b), "\n") {
			if containsAll(line, want) {
				return true, nil
			}
		}
		return false, nil
	})

	// Follow the explanation: nothing exists in the driver.
	s.updateClaim(claim.Name, func(c *corev1.PersistentVolumeClaim) { inflight.Remove(c) })
	s.waitClaimGone(claim.Name, "claim "+claim.Name+" not deleted once its finalizer was removed")
}

func containsAll(s string, fragments []string) bool {
	for _, f := range fragments {
		if !strings.Contains(s, f) {
			return false
		}
	}
	return true
}
