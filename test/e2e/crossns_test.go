package e2e

import (
	"context"
	"slices"
	"testing"

	snapclient "github.com/kubernetes-csi/external-snapshotter/client/v8/clientset/versioned"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-storage/csi-provisioner/internal/e2e"
	"github.com/kube-storage/csi-provisioner/internal/testutil"
	"github.com/kube-storage/csi-provisioner/pkg/provisioner"
)

// TestCrossNamespaceDataSource: with the CrossNamespaceVolumeDataSource
// gate (on in this package's kube-apiserver and the sidecar) and the
// Gateway API's ReferenceGrant CRD, a claim whose dataSourceRef names a
// claim of another namespace gets a Warning and stays Pending until a
// ReferenceGrant there allows it, and is then cloned (at once, not at the
// library's next retry, ten minutes later) from that claim's volume, which carries the cloning protection; a claim restoring from a
// VolumeSnapshot of that namespace is provisioned from its handle once a
// grant for that snapshot exists. A granted clone that cannot be made keeps
// its deleted source until the grant is deleted.
func TestCrossNamespaceDataSource(t *testing.T) {
	ctx := t.Context()
	install := func(s *stack) {
		if err := e2e.InstallReferenceGrantCRD(ctx, s.cp.AdminConfig()); err != nil {
			t.Fatal(err)
		}
		if err := e2e.InstallSnapshotCRDs(ctx, s.cp.AdminConfig()); err != nil {
			t.Fatal(err)
		}
	}
	s := newStack(t, stackConfig{
		memory: true, beforeSidecar: install,
		sidecarArgs: append([]string{"--feature-gates=CrossNamespaceVolumeDataSource=true"}, slowRetries...),
	})
	admin := s.cp.AdminConfig()
	srcNS, err := s.c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: s.ns + "-src"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sc := s.class("fs", nil)
	src := testutil.NewPVC(srcNS.Name, "src").Class(sc.Name).Size("1Gi").RV("").Obj()
	if src, err = s.c.CoreV1().PersistentVolumeClaims(srcNS.Name).Create(ctx, src, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var srcPV *corev1.PersistentVolume
	testutil.Eventually(t, 0, "source claim not Bound", func(ctx context.Context) (bool, error) {
		c, err := s.c.CoreV1().PersistentVolumeClaims(srcNS.Name).Get(ctx, src.Name, metav1.GetOptions{})
		if err != nil || c.Status.Phase != corev1.ClaimBound {
			return false, err
		}
		srcPV, err = s.c.CoreV1().PersistentVolumes().Get(ctx, c.Spec.VolumeName, metav1.GetOptions{})
		return err == nil, err
	})

	clone := s.claim(crossNamespace(testutil.NewPVC(s.ns, "copy").Class(sc.Name).Size("1Gi").DataSource(nil, "PersistentVolumeClaim", src.Name), srcNS.Name))
	s.waitEvent(s.ns, string(clone.UID), corev1.EventTypeWarning, "ProvisioningFailed",
		"accessing "+srcNS.Name+"/src of PersistentVolumeClaim dataSource from "+s.ns+"/copy isn't allowed")
	if got := s.getClaim(clone.Name); got.Status.Phase != corev1.ClaimPending || got.Spec.VolumeName != "" {
		t.Fatalf("clone without a grant: phase %s, volume %q; want Pending, none", got.Status.Phase, got.Spec.VolumeName)
	}
	if err := e2e.CreateReferenceGrant(ctx, admin, e2e.ReferenceGrant{
		Namespace: srcNS.Name, Name: "clones", FromNamespace: s.ns, Kind: "PersistentVolumeClaim",
	}); err != nil {
		t.Fatal(err)
	}
	_, clonePV := s.waitBound(clone.Name)
	if from := s.contentSource(clonePV.Spec.CSI.VolumeHandle).GetVolume().GetVolumeId(); from != srcPV.Spec.CSI.VolumeHandle {
		t.Errorf("the clone's volume was created from %q, want the source's %s", from, srcPV.Spec.CSI.VolumeHandle)
	}
	live, err := s.c.CoreV1().PersistentVolumeClaims(srcNS.Name).Get(ctx, src.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(live.Finalizers, provisioner.CloneFinalizer) {
		t.Errorf("source finalizers %v, want %s", live.Finalizers, provisioner.CloneFinalizer)
	}

	// A restore from a snapshot of the other namespace: the grant above is
	// for claims only.
	snaps, err := snapclient.NewForConfig(admin)
	if err != nil {
		t.Fatal(err)
	}
	handle, _ := s.readySnapshot(snaps, srcNS.Name, srcPV)
	group := "snapshot.storage.k8s.io"
	restored := s.claim(crossNamespace(testutil.NewPVC(s.ns, "restored").Class(sc.Name).Size("1Gi").DataSource(&group, "VolumeSnapshot", "snap"), srcNS.Name))
	s.waitEvent(s.ns, string(restored.UID), corev1.EventTypeWarning, "ProvisioningFailed", "of VolumeSnapshot dataSource from "+s.ns+"/restored isn't allowed")
	if err := e2e.CreateReferenceGrant(ctx, admin, e2e.ReferenceGrant{
		Namespace: srcNS.Name, Name: "snap", FromNamespace: s.ns, Group: group, Kind: "VolumeSnapshot", ToName: "snap",
	}); err != nil {
		t.Fatal(err)
	}
	_, restoredPV := s.waitBound(restored.Name)
	if from := s.contentSource(restoredPV.Spec.CSI.VolumeHandle).GetSnapshot().GetSnapshotId(); from != handle {
		t.Errorf("the restored volume was created from snapshot %q, want %s", from, handle)
	}
	waitUnprotected(t, snaps, srcNS.Name, "snap", "the snapshot kept its source protection after the restore")

	// A clone of the source from a namespace that no grant names: it
	// stays Pending, refused, and must not keep the source from being
	// deleted (any namespace could otherwise pin a claim it may not read).
	otherNS, err := s.c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: s.ns + "-other"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = s.c.CoreV1().Namespaces().Delete(context.Background(), otherNS.Name, metav1.DeleteOptions{})
	})
	ungranted := crossNamespace(testutil.NewPVC(otherNS.Name, "pin").Class(sc.Name).Size("1Gi").DataSource(nil, "PersistentVolumeClaim", src.Name), srcNS.Name).RV("").Obj()
	if ungranted, err = s.c.CoreV1().PersistentVolumeClaims(otherNS.Name).Create(ctx, ungranted, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	s.waitEvent(otherNS.Name, string(ungranted.UID), corev1.EventTypeWarning, "ProvisioningFailed",
		"accessing "+srcNS.Name+"/src of PersistentVolumeClaim dataSource from "+otherNS.Name+"/pin isn't allowed")

	// A granted clone that can never be made (smaller than its source)
	// stays Pending and keeps the source while the grant allows it.
	small := s.claim(crossNamespace(testutil.NewPVC(s.ns, "small").Class(sc.Name).Size("512Mi").DataSource(nil, "PersistentVolumeClaim", src.Name), srcNS.Name))
	s.waitEvent(s.ns, string(small.UID), corev1.EventTypeWarning, "ProvisioningFailed", "new PVC request must be greater than or equal in size to the specified PVC data source")

	// The hostpath driver keeps a volume that has snapshots: delete the
	// snapshot first. The source is deleted; its Bound clone does not keep
	// it, the ungranted one does not count, and the small one keeps it
	// until its grant is deleted: then the cloning protection lets it go at
	// once (not at the informers' resync, an hour later).
	if err := s.driver.DeleteSnapshot(ctx, handle); err != nil {
		t.Fatal(err)
	}
	if err := s.c.CoreV1().PersistentVolumeClaims(srcNS.Name).Delete(ctx, src.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := s.c.CoreV1().PersistentVolumeClaims(s.ns).Delete(ctx, restored.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if live, err := s.c.CoreV1().PersistentVolumeClaims(srcNS.Name).Get(ctx, src.Name, metav1.GetOptions{}); err != nil || !slices.Contains(live.Finalizers, provisioner.CloneFinalizer) {
		t.Fatalf("source after its deletion: %v, %v; want it kept by %s for the pending clone", live, err, provisioner.CloneFinalizer)
	}
	if err := e2e.DeleteReferenceGrant(ctx, admin, srcNS.Name, "clones"); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 0, "the source's PV stayed", func(ctx context.Context) (bool, error) {
		_, err := s.c.CoreV1().PersistentVolumes().Get(ctx, srcPV.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), ignoreNotFound(err)
	})
	if err := s.c.CoreV1().PersistentVolumeClaims(s.ns).Delete(ctx, small.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	s.waitClaimGone(small.Name, "the small clone stayed")
	s.deleteAndWaitGone(clone.Name, clonePV.Name)
	s.waitGone(restored.Name, restoredPV.Name)
}

// crossNamespace points the claim's data source into namespace: through
// dataSourceRef only, as the API server stores such a claim.
func crossNamespace(b *testutil.PVCBuilder, namespace string) *testutil.PVCBuilder {
	c := b.Obj()
	c.Spec.DataSource = nil
	c.Spec.DataSourceRef.Namespace = &namespace
	return b
}
