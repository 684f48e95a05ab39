package e2e

import (
	"context"
	"slices"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-storage/csi-provisioner/internal/testutil"
	"github.com/kube-storage/csi-provisioner/pkg/provisioner"
)

// TestClone: a claim whose data source is a Bound claim is provisioned by
// the hostpath driver from the source's volume; the source carries the
// cloning-protection finalizer, and once deleted it stays as long as a
// clone of it is Pending (here a clone too small to be provisioned, which
// gets a Warning) and goes when that clone goes.
func TestClone(t *testing.T) {
	s := newStack(t, stackConfig{memory: true})
	sc := s.class("fs", nil)
	src := s.claim(testutil.NewPVC(s.ns, "src").Class(sc.Name).Size("1Gi"))
	_, srcPV := s.waitBound(src.Name)

	clone := s.claim(testutil.NewPVC(s.ns, "copy").Class(sc.Name).Size("2Gi").DataSource(nil, "PersistentVolumeClaim", src.Name))
	_, clonePV := s.waitBound(clone.Name)
	if from := s.contentSource(clonePV.Spec.CSI.VolumeHandle).GetVolume().GetVolumeId(); from != srcPV.Spec.CSI.VolumeHandle {
		t.Errorf("the clone's volume was created from %q, want the source's %s", from, srcPV.Spec.CSI.VolumeHandle)
	}
	live := s.getClaim(src.Name)
	if !slices.Contains(live.Finalizers, provisioner.CloneFinalizer) {
		t.Errorf("source finalizers %v, want %s", live.Finalizers, provisioner.CloneFinalizer)
	}

	small := s.claim(testutil.NewPVC(s.ns, "too-small").Class(sc.Name).Size("512Mi").DataSource(nil, "PersistentVolumeClaim", src.Name))
	s.waitEvent(s.ns, string(small.UID), corev1.EventTypeWarning, "ProvisioningFailed", "new PVC request must be greater than or equal in size")
	if err := s.c.CoreV1().PersistentVolumeClaims(s.ns).Delete(t.Context(), src.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// Once kube-controller-manager's protection controller has let the
	// source go, only the cloning protection holds it: the pending clone
	// keeps it.
	testutil.Eventually(t, 0, "the source never lost its pvc-protection finalizer", func(ctx context.Context) (bool, error) {
		c, err := s.c.CoreV1().PersistentVolumeClaims(s.ns).Get(ctx, src.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return c.DeletionTimestamp != nil && !slices.Contains(c.Finalizers, "kubernetes.io/pvc-protection"), nil
	})
	if got := s.getClaim(src.Name); !slices.Equal(got.Finalizers, []string{provisioner.CloneFinalizer}) {
		t.Errorf("source being deleted with a clone pending: finalizers %v, want only %s", got.Finalizers, provisioner.CloneFinalizer)
	}
	if err := s.c.CoreV1().PersistentVolumeClaims(s.ns).Delete(t.Context(), small.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	s.waitClaimGone(src.Name, "the source stayed after its last pending clone went")
	s.deleteAndWaitGone(clone.Name, clonePV.Name)
}

// TestCloneBeforeSource: a clone created before its source fails (a
// Warning) and is provisioned as soon as the source is Bound, although the
// provisioning library would retry it only after ten minutes.
func TestCloneBeforeSource(t *testing.T) {
	s := newStack(t, stackConfig{memory: true, sidecarArgs: slowRetries})
	sc := s.class("fs", nil)
	clone := s.claim(testutil.NewPVC(s.ns, "copy").Class(sc.Name).Size("1Gi").DataSource(nil, "PersistentVolumeClaim", "src"))
	s.waitEvent(s.ns, string(clone.UID), corev1.EventTypeWarning, "ProvisioningFailed", "error getting PVC src")

	src := s.claim(testutil.NewPVC(s.ns, "src").Class(sc.Name).Size("1Gi"))
	_, srcPV := s.waitBound(src.Name)
	_, clonePV := s.waitBound(clone.Name)
	if from := s.contentSource(clonePV.Spec.CSI.VolumeHandle).GetVolume().GetVolumeId(); from != srcPV.Spec.CSI.VolumeHandle {
		t.Errorf("the clone's volume was created from %q, want the source's %s", from, srcPV.Spec.CSI.VolumeHandle)
	}
	if err := s.c.CoreV1().PersistentVolumeClaims(s.ns).Delete(t.Context(), src.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	s.deleteAndWaitGone(clone.Name, clonePV.Name)
	s.waitGone(src.Name, srcPV.Name)
}

// slowRetries are sidecar flags under which the provisioning library
// retries a failed claim only after ten minutes, longer than any wait of a
// test: a claim provisioned after a failure was queued by the provisioner.
var slowRetries = []string{"--retry-interval-start=10m", "--retry-interval-max=10m"}

// TestCloneSourceIgnoredByDriver: a driver that ignores the content source
// answers a clone with an empty volume. The sidecar deletes that volume
// again instead of binding it (as upstream): the claim stays Pending with
// a Warning, and nothing is left behind once it is deleted.
func TestCloneSourceIgnoredByDriver(t *testing.T) {
	s := newStack(t, stackConfig{memory: true, driverArgs: []string{"--ignore-content-source"}})
	sc := s.class("fs", nil)
	src := s.claim(testutil.NewPVC(s.ns, "src").Class(sc.Name).Size("1Gi"))
	_, srcPV := s.waitBound(src.Name)

	clone := s.claim(testutil.NewPVC(s.ns, "copy").Class(sc.Name).Size("1Gi").DataSource(nil, "PersistentVolumeClaim", src.Name))
	s.waitEvent(s.ns, string(clone.UID), corev1.EventTypeWarning, "ProvisioningFailed", "volume content source missing")
	if got := s.getClaim(clone.Name); got.Spec.VolumeName != "" || got.Status.Phase != corev1.ClaimPending {
		t.Errorf("clone of an ignored source: volumeName %q, phase %s; want Pending without a volume", got.Spec.VolumeName, got.Status.Phase)
	}
	if pv := s.pvOf(clone.UID); pv != nil {
		t.Errorf("clone of an ignored source got PV %s", pv.Name)
	}
	if err := s.c.CoreV1().PersistentVolumeClaims(s.ns).Delete(t.Context(), clone.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	s.waitClaimGone(clone.Name, "the clone was not deleted")
	// Only the source's volume is left, and it goes with its claim.
	s.deleteAndWaitGone(src.Name, srcPV.Name)
}

// contentSource returns what the driver says the volume with id was
// created from (nil for nothing, or when there is no such volume).
func (s *stack) contentSource(id string) *csi.VolumeContentSource {
	s.t.Helper()
	vols, err := s.driver.ListVolumes(s.t.Context())
	if err != nil {
		s.t.Fatal(err)
	}
	for _, v := range vols {
		if v.GetVolumeId() == id {
			return v.GetContentSource()
		}
	}
	return nil
}

// getClaim reads a claim of the stack's namespace from the API server.
func (s *stack) getClaim(name string) *corev1.PersistentVolumeClaim {
	s.t.Helper()
	c, err := s.c.CoreV1().PersistentVolumeClaims(s.ns).Get(s.t.Context(), name, metav1.GetOptions{})
	if err != nil {
		s.t.Fatal(err)
	}
	return c
}
