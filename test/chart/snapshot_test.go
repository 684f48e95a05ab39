package chart

import (
	"context"
	"slices"

	snapclient "github.com/kubernetes-csi/external-snapshotter/client/v8/clientset/versioned"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-storage/csi-provisioner/internal/e2e"
	"github.com/kube-storage/csi-provisioner/internal/testutil"
	"github.com/kube-storage/csi-provisioner/pkg/provisioner"
)

// snapshotGroup is the API group of VolumeSnapshots.
const snapshotGroup = "snapshot.storage.k8s.io"

// snapshots returns an admin client of the snapshot API; the CRDs must be
// installed (e2e.InstallSnapshotCRDs).
func (s *rbacStack) snapshots() snapclient.Interface {
	s.t.Helper()
	c, err := snapclient.NewForConfig(s.cp.AdminConfig())
	if err != nil {
		s.t.Fatal(err)
	}
	return c
}

// restore creates, as the admin, a claim of the class, waits until it is
// Bound, snapshots its volume in the driver, plays the snapshot-controller
// for that snapshot, and creates a claim restored from it, which it
// returns. The driver's snapshot is deleted when the test ends.
func (s *rbacStack) restore() *corev1.PersistentVolumeClaim {
	s.t.Helper()
	ctx, c := s.t.Context(), s.cp.Client()
	src := s.claim("restore-src", "")
	pv, err := c.CoreV1().PersistentVolumes().Get(ctx, s.waitClaimBound(src.Name), metav1.GetOptions{})
	if err != nil {
		s.t.Fatal(err)
	}
	handle, size, err := s.driver.CreateSnapshot(ctx, pv.Spec.CSI.VolumeHandle, s.ns+"-snap")
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() { _ = s.driver.DeleteSnapshot(context.Background(), handle) })
	snaps := s.snapshots()
	if _, err := e2e.CreateReadySnapshot(ctx, snaps, s.ns, "snap", s.driver.Name, handle, size); err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() { _ = e2e.DeleteSnapshot(context.Background(), snaps, s.ns, "snap") })
	group := snapshotGroup
	b := testutil.NewPVC(s.ns, "restored").Class(s.className).Size("1Gi").RV("").DataSource(&group, "VolumeSnapshot", "snap")
	created, err := c.CoreV1().PersistentVolumeClaims(s.ns).Create(ctx, b.Obj(), metav1.CreateOptions{})
	if err != nil {
		s.t.Fatal(err)
	}
	return created
}

// checkRestored waits until the restored claim is Bound and the snapshot's
// source protection is gone again.
func (s *rbacStack) checkRestored(claim *corev1.PersistentVolumeClaim) {
	s.t.Helper()
	s.waitClaimBound(claim.Name)
	snaps := s.snapshots()
	testutil.Eventually(s.t, 0, "the snapshot kept its source protection under the chart's RBAC", func(ctx context.Context) (bool, error) {
		got, err := snaps.SnapshotV1().VolumeSnapshots(s.ns).Get(ctx, "snap", metav1.GetOptions{})
		return err == nil && !slices.Contains(got.Finalizers, provisioner.SnapshotFinalizer), err
	})
}
