package e2e

import (
	"context"
	"slices"
	"strconv"
	"testing"

	snapclient "github.com/kubernetes-csi/external-snapshotter/client/v8/clientset/versioned"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/kube-storage/csi-provisioner/internal/e2e"
	"github.com/kube-storage/csi-provisioner/internal/testutil"
	"github.com/kube-storage/csi-provisioner/pkg/provisioner"
)

// TestRestoreFromSnapshot: the hostpath driver snapshots a provisioned
// volume; the test plays the snapshot-controller (the VolumeSnapshot CRDs
// of external-snapshotter, a pre-provisioned content, ready statuses); a
// claim with that VolumeSnapshot as data source is provisioned by the
// sidecar from the snapshot's handle, and the snapshot's source protection
// is gone once the volume exists. A claim asking for less than the
// snapshot's restore size gets a Warning and no volume. Once that claim is
// deleted, the sweep (reading the sidecar's snapshot cache: the CRDs exist
// when it starts) removes a source protection left on the snapshot.
func TestRestoreFromSnapshot(t *testing.T) {
	s := newStack(t, stackConfig{memory: true, beforeSidecar: installSnapshotCRDs(t), sidecarArgs: []string{"--snapshot-orphan-sweep-interval=1s"}})
	ctx := t.Context()
	snaps, err := snapclient.NewForConfig(s.cp.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	sc := s.class("fs", nil)
	src := s.claim(testutil.NewPVC(s.ns, "src").Class(sc.Name).Size("1Gi"))
	_, srcPV := s.waitBound(src.Name)
	handle, size := s.readySnapshot(snaps, s.ns, srcPV)

	group := "snapshot.storage.k8s.io"
	restored := s.claim(testutil.NewPVC(s.ns, "restored").Class(sc.Name).Size("2Gi").DataSource(&group, "VolumeSnapshot", "snap"))
	_, pv := s.waitBound(restored.Name)
	if from := s.contentSource(pv.Spec.CSI.VolumeHandle).GetSnapshot().GetSnapshotId(); from != handle {
		t.Errorf("the restored volume was created from snapshot %q, want %s", from, handle)
	}
	waitUnprotected(t, snaps, s.ns, "snap", "the snapshot kept its source protection after the restore")

	small := s.claim(testutil.NewPVC(s.ns, "too-small").Class(sc.Name).Size("512Mi").DataSource(&group, "VolumeSnapshot", "snap"))
	s.waitEvent(s.ns, string(small.UID), corev1.EventTypeWarning, "ProvisioningFailed", "is less than the size "+strconv.FormatInt(size, 10))
	if got := s.getClaim(small.Name); got.Status.Phase != corev1.ClaimPending || got.Spec.VolumeName != "" {
		t.Errorf("too small restore: phase %s, volumeName %q; want Pending, none", got.Status.Phase, got.Spec.VolumeName)
	}

	// An orphaned source protection (as a crash would leave it): the sweep
	// removes it, since no pending claim restores from the snapshot.
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		got, err := snaps.SnapshotV1().VolumeSnapshots(s.ns).Get(ctx, "snap", metav1.GetOptions{})
		if err != nil {
			return err
		}
		got.Finalizers = append(got.Finalizers, provisioner.SnapshotFinalizer)
		_, err = snaps.SnapshotV1().VolumeSnapshots(s.ns).Update(ctx, got, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.c.CoreV1().PersistentVolumeClaims(s.ns).Delete(ctx, small.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitUnprotected(t, snaps, s.ns, "snap", "the sweep left an orphaned source protection")

	s.deleteRestore(handle, src.Name, srcPV.Name, restored.Name, pv.Name)
}

// TestRestoreBeforeSnapshot: a claim restoring from a VolumeSnapshot that
// does not exist yet gets a Warning, and is provisioned as soon as the
// snapshot is ready, although the provisioning library would retry it only
// after ten minutes.
func TestRestoreBeforeSnapshot(t *testing.T) {
	s := newStack(t, stackConfig{memory: true, beforeSidecar: installSnapshotCRDs(t), sidecarArgs: slowRetries})
	snaps, err := snapclient.NewForConfig(s.cp.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	sc := s.class("fs", nil)
	src := s.claim(testutil.NewPVC(s.ns, "src").Class(sc.Name).Size("1Gi"))
	_, srcPV := s.waitBound(src.Name)

	group := "snapshot.storage.k8s.io"
	restored := s.claim(testutil.NewPVC(s.ns, "restored").Class(sc.Name).Size("1Gi").DataSource(&group, "VolumeSnapshot", "snap"))
	s.waitEvent(s.ns, string(restored.UID), corev1.EventTypeWarning, "ProvisioningFailed", "error getting snapshot snap from api server")

	// Created without a status, then made ready, as the snapshot-controller
	// does.
	handle, _ := s.readySnapshot(snaps, s.ns, srcPV)
	_, pv := s.waitBound(restored.Name)
	if from := s.contentSource(pv.Spec.CSI.VolumeHandle).GetSnapshot().GetSnapshotId(); from != handle {
		t.Errorf("the restored volume was created from snapshot %q, want %s", from, handle)
	}
	waitUnprotected(t, snaps, s.ns, "snap", "the snapshot kept its source protection after the restore")

	s.deleteRestore(handle, src.Name, srcPV.Name, restored.Name, pv.Name)
}

// TestRestoreVolumeModeConversion: with --prevent-volume-mode-conversion
// (the default), restoring a snapshot of a Filesystem volume into a Block
// claim is refused with upstream's Warning and no CreateVolume is sent;
// once the VolumeSnapshotContent carries
// snapshot.storage.kubernetes.io/allow-volume-mode-change: "true" the
// sidecar sends CreateVolume with the snapshot's handle and a block
// capability. The example driver cannot turn a directory into a block
// device and refuses that restore (INVALID_ARGUMENT, naming the snapshot):
// its refusal, as a Warning on the claim, is what shows that the request
// was sent.
func TestRestoreVolumeModeConversion(t *testing.T) {
	s := newStack(t, stackConfig{memory: true, beforeSidecar: installSnapshotCRDs(t)})
	ctx := t.Context()
	snaps, err := snapclient.NewForConfig(s.cp.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	sc := s.class("fs", nil)
	src := s.claim(testutil.NewPVC(s.ns, "src").Class(sc.Name).Size("1Gi"))
	_, srcPV := s.waitBound(src.Name)
	handle, _ := s.readySnapshot(snaps, s.ns, srcPV)
	content := e2e.SnapshotContentName(s.ns, "snap")

	group := "snapshot.storage.k8s.io"
	block := s.claim(testutil.NewPVC(s.ns, "block").Class(sc.Name).Size("1Gi").Block().DataSource(&group, "VolumeSnapshot", "snap"))
	s.waitEvent(s.ns, string(block.UID), corev1.EventTypeWarning, "ProvisioningFailed",
		"requested volume "+s.ns+"/block modifies the mode of the source volume but does not have permission to do so. "+
			"snapshot.storage.kubernetes.io/allow-volume-mode-change annotation is not present on snapshotcontent "+content)
	if ids, err := s.driver.VolumeIDs(ctx); err != nil || !slices.Equal(ids, []string{srcPV.Spec.CSI.VolumeHandle}) {
		t.Errorf("driver volumes = %v (%v) after the refused restore, want only the source's %s", ids, err, srcPV.Spec.CSI.VolumeHandle)
	}
	if got := s.getClaim(block.Name); got.Status.Phase != corev1.ClaimPending || got.Spec.VolumeName != "" {
		t.Errorf("refused restore: phase %s, volumeName %q; want Pending, none", got.Status.Phase, got.Spec.VolumeName)
	}

	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		got, err := snaps.SnapshotV1().VolumeSnapshotContents().Get(ctx, content, metav1.GetOptions{})
		if err != nil {
			return err
		}
		metav1.SetMetaDataAnnotation(&got.ObjectMeta, "snapshot.storage.kubernetes.io/allow-volume-mode-change", "true")
		_, err = snaps.SnapshotV1().VolumeSnapshotContents().Update(ctx, got, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	s.waitEvent(s.ns, string(block.UID), corev1.EventTypeWarning, "ProvisioningFailed",
		"source snapshot \""+handle+"\" is a mount snapshot; cannot restore it to a block volume")

	s.deleteRestore(handle, src.Name, srcPV.Name, block.Name, "")
}

// readySnapshot snapshots the volume of pv in the driver and creates in
// namespace a ready VolumeSnapshot "snap" of it (the test plays the
// snapshot-controller), deleted when the test ends. It returns the
// driver's snapshot handle and size.
func (s *stack) readySnapshot(snaps snapclient.Interface, namespace string, pv *corev1.PersistentVolume) (string, int64) {
	s.t.Helper()
	ctx := s.t.Context()
	handle, size, err := s.driver.CreateSnapshot(ctx, pv.Spec.CSI.VolumeHandle, s.ns+"-snap")
	if err != nil {
		s.t.Fatal(err)
	}
	if _, err := e2e.CreateReadySnapshot(ctx, snaps, namespace, "snap", s.driver.Name, handle, size); err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() { _ = e2e.DeleteSnapshot(context.WithoutCancel(ctx), snaps, namespace, "snap") })
	return handle, size
}

// deleteRestore deletes the driver's snapshot handle (the hostpath driver
// keeps a volume that has snapshots), the source claim and the restored
// claim, and waits until they, their PVs and every driver volume are gone.
func (s *stack) deleteRestore(handle, src, srcPV, restored, restoredPV string) {
	s.t.Helper()
	if err := s.driver.DeleteSnapshot(s.t.Context(), handle); err != nil {
		s.t.Fatal(err)
	}
	if err := s.c.CoreV1().PersistentVolumeClaims(s.ns).Delete(s.t.Context(), src, metav1.DeleteOptions{}); err != nil {
		s.t.Fatal(err)
	}
	s.deleteAndWaitGone(restored, restoredPV)
	s.waitGone(src, srcPV)
}

// installSnapshotCRDs returns a stackConfig.beforeSidecar hook that
// installs external-snapshotter's CRDs, so that the sidecar finds them at
// start.
func installSnapshotCRDs(t *testing.T) func(*stack) {
	return func(s *stack) {
		if err := e2e.InstallSnapshotCRDs(t.Context(), s.cp.AdminConfig()); err != nil {
			t.Fatal(err)
		}
	}
}

// waitUnprotected waits until the snapshot namespace/name has no
// provisioner.SnapshotFinalizer, failing with msg.
func waitUnprotected(t *testing.T, snaps snapclient.Interface, namespace, name, msg string) {
	t.Helper()
	testutil.Eventually(t, 0, msg, func(ctx context.Context) (bool, error) {
		got, err := snaps.SnapshotV1().VolumeSnapshots(namespace).Get(ctx, name, metav1.GetOptions{})
		return err == nil && !slices.Contains(got.Finalizers, provisioner.SnapshotFinalizer), err
	})
}
