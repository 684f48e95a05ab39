package e2e

import (
	"context"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-storage/csi-provisioner/internal/testutil"
)

// TestUnusedCondition: kube-controller-manager v1.37's pvc-protection
// controller gives every Bound claim an Unused condition. Once the binder
// has seen one, it writes the condition itself when it binds a claim, so
// the controller has nothing to write: the next claim's condition is owned
// by the sidecar in managedFields, and no kube-controller-manager entry
// exists for the claim's status. Before v1.37 nothing maintains the
// condition, and the binder must not add one that would go stale.
func TestUnusedCondition(t *testing.T) {
	s := newStack(t, stackConfig{memory: true})
	sc := s.class("fs", nil)
	first := s.claim(testutil.NewPVC(s.ns, "first").Class(sc.Name).Size("1Gi"))
	_, firstPV := s.waitBound(first.Name)
	if minor := s.cp.Binaries.KubernetesMinor(); minor < 37 {
		second := s.claim(testutil.NewPVC(s.ns, "second").Class(sc.Name).Size("1Gi"))
		bound, pv := s.waitBound(second.Name)
		if hasUnused(bound) {
			t.Errorf("Kubernetes v1.%d maintains no Unused condition, yet the binder added one: %+v", minor, bound.Status.Conditions)
		}
		if err := s.c.CoreV1().PersistentVolumeClaims(s.ns).Delete(t.Context(), first.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		s.deleteAndWaitGone(second.Name, pv.Name)
		s.waitGone(first.Name, firstPV.Name)
		return
	}
	testutil.Eventually(t, 0, "kube-controller-manager gave the first claim no Unused condition", func(ctx context.Context) (bool, error) {
		c, err := s.c.CoreV1().PersistentVolumeClaims(s.ns).Get(ctx, first.Name, metav1.GetOptions{})
		return err == nil && hasUnused(c), err
	})

	second := s.claim(testutil.NewPVC(s.ns, "second").Class(sc.Name).Size("1Gi"))
	bound, pv := s.waitBound(second.Name)
	if !hasUnused(bound) {
		t.Fatalf("the second claim was Bound without the Unused condition: %+v", bound.Status.Conditions)
	}
	var statusManagers []string
	for _, m := range bound.ManagedFields {
		if m.Subresource == "status" {
			statusManagers = append(statusManagers, m.Manager)
		}
	}
	if len(statusManagers) == 0 || slices.ContainsFunc(statusManagers, func(m string) bool { return strings.Contains(m, "kube-controller-manager") }) {
		t.Errorf("status managers of the second claim %v: want the sidecar only", statusManagers)
	}
	if err := s.c.CoreV1().PersistentVolumeClaims(s.ns).Delete(t.Context(), first.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	s.deleteAndWaitGone(second.Name, pv.Name)
	s.waitGone(first.Name, firstPV.Name)
}

func hasUnused(c *corev1.PersistentVolumeClaim) bool {
	return slices.ContainsFunc(c.Status.Conditions, func(cond corev1.PersistentVolumeClaimCondition) bool {
		return cond.Type == corev1.PersistentVolumeClaimUnused
	})
}
