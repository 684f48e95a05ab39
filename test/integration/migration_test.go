package integration

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	storagehelpers "k8s.io/component-helpers/storage/volume"

	"github.com/kube-storage/csi-provisioner/internal/controlplane"
	"github.com/kube-storage/csi-provisioner/internal/testutil"
)

// TestMigrationWithControllerManagerBinder: with the sidecar's binder off
// (--enable-binder=false, upstream's deployment), kube-controller-manager's
// persistentvolume-binder hands a claim of the in-tree class
// kubernetes.io/aws-ebs to ebs.csi.aws.com (CSI migration is always on for
// that plugin) and binds it to the in-tree PV the sidecar provisions;
// deleting the claim deletes the driver's volume.
func TestMigrationWithControllerManagerBinder(t *testing.T) {
	cp := controlplane.StartForTest(t, controlplane.Config{
		Controllers: append([]string{controlplane.PVBinderController}, controlplane.DefaultControllers...),
	})
	e := newEnv(t, cp)
	e.driver = "ebs.csi.aws.com" // the migration target; this control plane is the test's own
	s := e.startStackWith(stackConfig{sidecarArgs: []string{"-v=4", "--enable-binder=false", "--retry-interval-start=200ms", "--retry-interval-max=2s"}})
	class := e.createClass(testutil.NewSC(e.name("gp2"), "kubernetes.io/aws-ebs").Param("type", "gp2"))
	claim := e.createClaim(testutil.NewPVC(e.ns, "data").Class(class.Name))
	bound := e.waitClaimPhase(claim.Name, corev1.ClaimBound)
	if got := bound.Annotations[storagehelpers.AnnStorageProvisioner]; got != e.driver {
		t.Errorf("claim %s = %q, want %s (set by kube-controller-manager)", storagehelpers.AnnStorageProvisioner, got, e.driver)
	}
	t.Logf("claim annotations set by kube-controller-manager: %v", bound.Annotations)
	pv := e.waitPVPhase(bound.Spec.VolumeName, corev1.VolumeBound)
	if got := pv.Annotations[storagehelpers.AnnMigratedTo]; got != e.driver {
		t.Errorf("PV %s = %q, want %s", storagehelpers.AnnMigratedTo, got, e.driver)
	}
	if pv.Spec.AWSElasticBlockStore == nil || pv.Spec.CSI != nil {
		t.Fatalf("PV %s source: CSI %+v, awsElasticBlockStore %+v; want the in-tree source", pv.Name, pv.Spec.CSI, pv.Spec.AWSElasticBlockStore)
	}
	ids, err := s.volumeIDs(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != 1 || ids[0] != pv.Spec.AWSElasticBlockStore.VolumeID {
		t.Errorf("driver volumes %v, want the PV's %s", ids, pv.Spec.AWSElasticBlockStore.VolumeID)
	}
	e.deleteClaim(claim.Name)
	e.waitPVGone(pv.Name)
	testutil.Eventually(t, 0, "the driver's volume stayed", func(ctx context.Context) (bool, error) {
		ids, err := s.volumeIDs(ctx)
		return len(ids) == 0, err
	})
}
