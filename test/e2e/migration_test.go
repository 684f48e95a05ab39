package e2e

import (
	"context"
	"slices"
	"strconv"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	storagehelpers "k8s.io/component-helpers/storage/volume"

	"github.com/kube-storage/csi-provisioner/internal/testutil"
)

// TestInTreeMigration: the hostpath driver under the name ebs.csi.aws.com,
// the CSI migration target of the in-tree plugin kubernetes.io/aws-ebs.
// A claim of a StorageClass of that plugin is handed to the driver,
// provisioned from the translated class and
// bound to a PV with the in-tree awsElasticBlockStore source naming the
// driver's volume; deleting the claim deletes the volume through that
// in-tree PV; the CSI calls' metrics say migrated="true".
func TestInTreeMigration(t *testing.T) {
	endpoint := "127.0.0.1:" + strconv.Itoa(freePort(t))
	s := newStack(t, stackConfig{memory: true, driverName: "ebs.csi.aws.com", sidecarArgs: []string{"--http-endpoint=" + endpoint}})
	sc := testutil.NewSC(s.className+"-gp2", "kubernetes.io/aws-ebs").Param("type", "gp2").Param("fsType", "xfs").Obj()
	testutil.CreateClass(t, s.c, sc)
	claim := s.claim(testutil.NewPVC(s.ns, "data").Class(sc.Name).Size("1Gi"))
	bound, pv := s.waitBound(claim.Name)
	if got := bound.Annotations[storagehelpers.AnnStorageProvisioner]; got != s.driver.Name {
		t.Errorf("claim annotation %s = %q, want %s", storagehelpers.AnnStorageProvisioner, got, s.driver.Name)
	}
	if got := pv.Annotations[storagehelpers.AnnDynamicallyProvisioned]; got != sc.Provisioner {
		t.Errorf("PV provisioned-by = %q, want the class's %s", got, sc.Provisioner)
	}
	if got := pv.Annotations[storagehelpers.AnnMigratedTo]; got != s.driver.Name {
		t.Errorf("PV %s = %q, want %s", storagehelpers.AnnMigratedTo, got, s.driver.Name)
	}
	ebs := pv.Spec.AWSElasticBlockStore
	if pv.Spec.CSI != nil || ebs == nil || ebs.FSType != "xfs" {
		t.Fatalf("PV source CSI %+v, awsElasticBlockStore %+v; want the in-tree source with fsType xfs", pv.Spec.CSI, ebs)
	}
	vols, err := s.driver.ListVolumes(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(vols, func(v *csi.Volume) bool { return v.GetVolumeId() == ebs.VolumeID }) {
		t.Errorf("the in-tree PV names volume %q, which the driver does not have (%d volumes)", ebs.VolumeID, len(vols))
	}
	if pv.Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimDelete {
		t.Errorf("reclaim policy %s", pv.Spec.PersistentVolumeReclaimPolicy)
	}
	s.deleteAndWaitGone(claim.Name, pv.Name)
	// The CSI calls of the in-tree volume carry upstream's migrated label
	// (a call may have been retried: any count).
	for _, method := range []string{"CreateVolume", "DeleteVolume"} {
		waitMetrics(t, endpoint, []string{`csi_sidecar_operations_seconds_count{driver_name="ebs.csi.aws.com",grpc_status_code="OK",method_name="/csi.v1.Controller/` + method + `",migrated="true"} `})
	}
}

// TestInTreeVolumeProvisionedBeforeMigration: a volume the in-tree plugin
// provisioned before the migration carries kube-controller-manager's
// finalizer kubernetes.io/pv-controller, which only that controller's
// deleter removes. With no kube-controller-manager binder, ours removes it
// (and names the driver in pv.kubernetes.io/migrated-to), so deleting the
// claim deletes the volume through the driver and the PV goes too instead
// of staying Terminating.
func TestInTreeVolumeProvisionedBeforeMigration(t *testing.T) {
	s := newStack(t, stackConfig{memory: true, driverName: "ebs.csi.aws.com"})
	sc := testutil.NewSC(s.className+"-gp2", "kubernetes.io/aws-ebs").Param("type", "gp2").Obj()
	testutil.CreateClass(t, s.c, sc)
	id, err := s.driver.CreateVolume(t.Context(), "before-migration")
	if err != nil {
		t.Fatal(err)
	}
	pvName := s.ns + "-before-migration"
	claim := s.claim(testutil.NewPVC(s.ns, "data").Class(sc.Name).Size("1Gi").VolumeName(pvName))
	pv := testutil.NewPV(pvName, "").Class(sc.Name).BoundTo(claim).
		Annotation(storagehelpers.AnnDynamicallyProvisioned, sc.Provisioner).
		Finalizers(storagehelpers.PVDeletionInTreeProtectionFinalizer).RV("").Obj()
	pv.Spec.CSI = nil
	pv.Spec.AWSElasticBlockStore = &corev1.AWSElasticBlockStoreVolumeSource{VolumeID: id}
	if _, err := s.c.CoreV1().PersistentVolumes().Create(t.Context(), pv, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	_, bound := s.waitBound(claim.Name)
	testutil.Eventually(t, 0, "the in-tree finalizer stays on the PV", func(ctx context.Context) (bool, error) {
		got, err := s.c.CoreV1().PersistentVolumes().Get(ctx, pvName, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		bound = got
		return !slices.Contains(got.Finalizers, storagehelpers.PVDeletionInTreeProtectionFinalizer), nil
	})
	if got := bound.Annotations[storagehelpers.AnnMigratedTo]; got != s.driver.Name {
		t.Errorf("PV %s = %q, want %s", storagehelpers.AnnMigratedTo, got, s.driver.Name)
	}
	s.deleteAndWaitGone(claim.Name, pvName)
}

// TestStaticInTreeVolumeDelete: a static in-tree volume of the migrated
// plugin (no pv.kubernetes.io/provisioned-by) with reclaim policy Delete.
// Nobody deletes it once its claim goes: the in-tree plugin is gone, and
// the provisioner deletes in-tree volumes only when provisioned-by or
// pv.kubernetes.io/migrated-to names it (upstream's library check;
// kube-controller-manager marks such a volume Failed, "error getting
// deleter volume plugin"). The binder says so on the PV, and naming the
// driver in migrated-to, as the event suggests, has the volume deleted
// through the driver.
func TestStaticInTreeVolumeDelete(t *testing.T) {
	s := newStack(t, stackConfig{memory: true, driverName: "ebs.csi.aws.com"})
	sc := testutil.NewSC(s.className+"-gp2", "kubernetes.io/aws-ebs").Obj()
	testutil.CreateClass(t, s.c, sc)
	id, err := s.driver.CreateVolume(t.Context(), "static")
	if err != nil {
		t.Fatal(err)
	}
	pvName := s.ns + "-static"
	claim := s.claim(testutil.NewPVC(s.ns, "data").Class(sc.Name).Size("1Gi").VolumeName(pvName))
	pv := testutil.NewPV(pvName, "").Class(sc.Name).BoundTo(claim).RV("").Obj()
	pv.Spec.CSI = nil
	pv.Spec.AWSElasticBlockStore = &corev1.AWSElasticBlockStoreVolumeSource{VolumeID: id}
	created, err := s.c.CoreV1().PersistentVolumes().Create(t.Context(), pv, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s.waitBound(claim.Name)
	if err := s.c.CoreV1().PersistentVolumeClaims(s.ns).Delete(t.Context(), claim.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	s.waitClaimGone(claim.Name, "claim not deleted")
	s.waitEvent(metav1.NamespaceDefault, string(created.UID), corev1.EventTypeWarning, "VolumeFailedDelete", storagehelpers.AnnMigratedTo+"="+s.driver.Name)
	got, err := s.c.CoreV1().PersistentVolumes().Get(t.Context(), pvName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Status.Phase != corev1.VolumeReleased {
		t.Errorf("PV phase %s, want Released", got.Status.Phase)
	}
	metav1.SetMetaDataAnnotation(&got.ObjectMeta, storagehelpers.AnnMigratedTo, s.driver.Name)
	if _, err := s.c.CoreV1().PersistentVolumes().Update(t.Context(), got, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	s.waitGone(claim.Name, pvName)
}

// TestInTreeMigrationPortworxSecrets: the hostpath driver under the name
// pxd.portworx.com, the migration target of kubernetes.io/portworx-volume,
// whose class names its secret in the plugin's own terms
// (openstorage.io/auth-secret-name and -namespace). The translated class
// makes it the provisioner secret (and the other CSI secrets): CreateVolume
// carries it (the driver refuses calls without it), the in-tree
// portworxVolume PV records it in the deletion-secret annotations, and
// DeleteVolume carries it too.
func TestInTreeMigrationPortworxSecrets(t *testing.T) {
	s := newStack(t, stackConfig{memory: true, driverName: "pxd.portworx.com",
		driverArgs: []string{"--require-create-secret=auth-token=px", "--require-delete-secret=auth-token=px"}})
	if _, err := s.c.CoreV1().Secrets(s.ns).Create(t.Context(), &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "px-token"}, StringData: map[string]string{"auth-token": "px"},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	sc := testutil.NewSC(s.className+"-px", "kubernetes.io/portworx-volume").Param("repl", "1").
		Param("openstorage.io/auth-secret-name", "px-token").Param("openstorage.io/auth-secret-namespace", s.ns).Obj()
	testutil.CreateClass(t, s.c, sc)
	claim := s.claim(testutil.NewPVC(s.ns, "data").Class(sc.Name).Size("1Gi"))
	_, pv := s.waitBound(claim.Name)
	px := pv.Spec.PortworxVolume
	if pv.Spec.CSI != nil || px == nil || px.VolumeID == "" {
		t.Fatalf("PV source CSI %+v, portworxVolume %+v; want the in-tree source", pv.Spec.CSI, px)
	}
	for key, want := range map[string]string{
		storagehelpers.AnnDynamicallyProvisioned:                     sc.Provisioner,
		storagehelpers.AnnMigratedTo:                                 s.driver.Name,
		"volume.kubernetes.io/provisioner-deletion-secret-name":      "px-token",
		"volume.kubernetes.io/provisioner-deletion-secret-namespace": s.ns,
	} {
		if got := pv.Annotations[key]; got != want {
			t.Errorf("PV annotation %s = %q, want %q", key, got, want)
		}
	}
	s.deleteAndWaitGone(claim.Name, pv.Name)
}

// TestInTreeClaimAnnotatedForPlugin: with the binder off, a claim whose
// storage-provisioner annotations name the in-tree plugin while
// pv.kubernetes.io/migrated-to names the driver (kube-controller-manager
// annotated claims so before it wrote the driver's name, and it keeps
// such a claim's annotations) is the driver's, as upstream decides: it is
// provisioned, with the in-tree source. (With the binder on, the binder
// rewrites the annotations to the driver's name first.)
func TestInTreeClaimAnnotatedForPlugin(t *testing.T) {
	s := newStack(t, stackConfig{memory: true, driverName: "ebs.csi.aws.com", sidecarArgs: []string{"--enable-binder=false"}})
	const plugin = "kubernetes.io/aws-ebs"
	sc := testutil.NewSC(s.className+"-gp2", plugin).Param("type", "gp2").Obj()
	testutil.CreateClass(t, s.c, sc)
	claim := s.claim(testutil.NewPVC(s.ns, "data").Class(sc.Name).Size("1Gi").
		Annotation(storagehelpers.AnnStorageProvisioner, plugin).Annotation(storagehelpers.AnnBetaStorageProvisioner, plugin).
		Annotation(storagehelpers.AnnMigratedTo, s.driver.Name))
	name := "pvc-" + string(claim.UID)
	// Nobody binds (no binder runs): the PV stays with the claim's
	// claimRef, and is removed by hand.
	t.Cleanup(func() {
		ctx := context.Background()
		if pv, err := s.c.CoreV1().PersistentVolumes().Get(ctx, name, metav1.GetOptions{}); err == nil && len(pv.Finalizers) > 0 {
			pv.Finalizers = nil
			_, _ = s.c.CoreV1().PersistentVolumes().Update(ctx, pv, metav1.UpdateOptions{})
		}
		_ = s.c.CoreV1().PersistentVolumes().Delete(ctx, name, metav1.DeleteOptions{})
	})
	var pv *corev1.PersistentVolume
	testutil.Eventually(t, 0, "no PV "+name+" for the claim annotated for the in-tree plugin", func(ctx context.Context) (bool, error) {
		got, err := s.c.CoreV1().PersistentVolumes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, ignoreNotFound(err)
		}
		pv = got
		return true, nil
	})
	if ref := pv.Spec.ClaimRef; ref == nil || ref.UID != claim.UID {
		t.Errorf("PV claimRef %+v, want the claim's", ref)
	}
	if pv.Spec.AWSElasticBlockStore == nil || pv.Annotations[storagehelpers.AnnMigratedTo] != s.driver.Name {
		t.Errorf("PV source %+v, annotations %v; want the in-tree source, migrated to %s", pv.Spec.PersistentVolumeSource, pv.Annotations, s.driver.Name)
	}
}
