package e2e

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/kube-storage/csi-provisioner/internal/testutil"
	"github.com/kube-storage/csi-provisioner/pkg/inflight"
)

// TestKillDuringCreateVolumeThenBoundElsewhere: the sidecar is killed while
// the driver creates a claim's volume, and before it restarts the claim is
// bound to another (static) volume. The restarted sidecar cannot know
// whether a volume was created, so the claim keeps the in-flight finalizer
// and gets a Warning that says what to check; the claim works (Bound to the
// static volume). Following the Warning (delete the backend volume, remove
// the finalizer) lets the claim be deleted, and nothing is left.
func TestKillDuringCreateVolumeThenBoundElsewhere(t *testing.T) {
	s := newStack(t, stackConfig{driverArgs: []string{"--create-latency=4s"}, sidecarArgs: []string{"--timeout=30s"}})
	sc := s.class("slow", nil)
	claim := s.claim(testutil.NewPVC(s.ns, "rebound").Class(sc.Name))
	ctx := t.Context()
	s.waitCreateVolumeStarted(claim)
	s.kill()

	// An administrator binds the claim to a static volume meanwhile.
	static := testutil.NewPV(s.ns+"-static", s.driver.Name).RV("").Class(sc.Name).Size("1Gi").
		ReclaimPolicy(corev1.PersistentVolumeReclaimRetain).ClaimRef(s.ns, claim.Name, string(claim.UID)).Obj()
	static.Spec.CSI.VolumeHandle = "not-in-the-driver"
	if _, err := s.c.CoreV1().PersistentVolumes().Create(ctx, static, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = s.c.CoreV1().PersistentVolumes().Delete(context.Background(), static.Name, metav1.DeleteOptions{})
	})
	s.updateClaim(claim.Name, func(c *corev1.PersistentVolumeClaim) { c.Spec.VolumeName = static.Name })

	if err := s.sidecar.Restart(); err != nil {
		t.Fatal(err)
	}
	s.waitEvent(s.ns, string(claim.UID), "Warning", "ProvisioningFailed",
		"may have been in progress; finalizer "+inflight.Finalizer+" stays so that a volume named pvc-"+string(claim.UID)+" cannot leak")
	got, _ := s.waitBound(claim.Name)
	if got.Spec.VolumeName != static.Name || !inflight.Has(got) {
		t.Fatalf("claim bound to %q with finalizers %v, want %s with %s", got.Spec.VolumeName, got.Finalizers, static.Name, inflight.Finalizer)
	}
	vols, err := s.driver.ListVolumes(ctx)
	if err != nil || len(vols) != 1 {
		t.Fatalf("driver volumes = %v, %v; want the one whose create was in flight", vols, err)
	}

	// Follow the Warning.
	if err := s.driver.DeleteVolume(ctx, vols[0].GetVolumeId()); err != nil {
		t.Fatal(err)
	}
	s.updateClaim(claim.Name, func(c *corev1.PersistentVolumeClaim) { inflight.Remove(c) })
	if err := s.c.CoreV1().PersistentVolumeClaims(s.ns).Delete(ctx, claim.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	s.waitGone(claim.Name, "")
	s.waitPVPhase(static.Name, corev1.VolumeReleased) // Retain: kept, Released
}

// updateClaim applies change to the claim name, retrying on conflicts.
func (s *stack) updateClaim(name string, change func(*corev1.PersistentVolumeClaim)) {
	s.t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		c, err := s.c.CoreV1().PersistentVolumeClaims(s.ns).Get(s.t.Context(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		change(c)
		_, err = s.c.CoreV1().PersistentVolumeClaims(s.ns).Update(s.t.Context(), c, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		s.t.Fatalf("update claim %s: %v", name, err)
	}
}
