package integration

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-storage/csi-provisioner/internal/controlplane"
	"github.com/kube-storage/csi-provisioner/internal/e2e"
	"github.com/kube-storage/csi-provisioner/internal/testutil"
	"github.com/kube-storage/csi-provisioner/pkg/inflight"
)

// cluster is a control plane whose kube-controller-manager runs its PV
// binder, with several CSI drivers, each with a provisioner of its own
// (this sidecar or upstream's), as a real cluster has.
type cluster struct {
	*env
	bins     e2e.Binaries
	upstream string
	dir      string
}

// newCluster starts the control plane; it starts no driver. It skips when
// upstream external-provisioner is not built, as the switchover tests do.
func newCluster(t *testing.T) *cluster {
	t.Helper()
	upstream, err := e2e.UpstreamProvisioner()
	if err != nil {
		if os.Getenv(controlplane.RequireEnv) != "" || !errors.Is(err, controlplane.ErrBinariesMissing) {
			t.Fatalf("the multi-driver tests need upstream external-provisioner (hack/tools/build.sh external-provisioner): %v", err)
		}
		t.Skipf("multi-driver test skipped: %v", err)
	}
	cp := controlplane.StartForTest(t, controlplane.Config{
		Controllers: append([]string{controlplane.PVBinderController}, controlplane.DefaultControllers...),
	})
	bins, err := e2e.Build(t.Context(), "")
	if err != nil {
		t.Fatal(err)
	}
	return &cluster{env: newEnv(t, cp), bins: bins, upstream: upstream, dir: t.TempDir()}
}

// startDriver starts a hostpath driver (memory backend) named
// <short>.<namespace>.csi.example and a provisioner for it: upstream's when
// upstream is set, else this sidecar with args. It returns the driver.
func (c *cluster) startDriver(short string, upstream bool, driverArgs []string, args ...string) *e2e.Driver {
	c.t.Helper()
	ctx := c.t.Context()
	dir := filepath.Join(c.dir, short)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		c.t.Fatal(err)
	}
	d, err := e2e.StartDriver(ctx, c.bins.Driver, e2e.DriverConfig{
		Dir: dir, Name: short + "." + c.ns + ".csi.example", Memory: true, Args: driverArgs,
	})
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { _ = d.Stop(5 * time.Second) })
	bin := c.upstream
	args = append([]string{"-v=4", "--retry-interval-start=200ms", "--retry-interval-max=2s"}, args...)
	if !upstream {
		bin = c.bins.Sidecar
		args = append(args, "--binder-resync-period=1s")
	}
	p, err := e2e.StartSidecar(bin, e2e.SidecarConfig{
		Kubeconfig: c.cp.KubeconfigPath, Socket: d.Socket, LogPath: filepath.Join(dir, "provisioner.log"), Args: args,
	})
	if err != nil {
		c.t.Fatal(err)
	}
	p.StopAtCleanup(c.t, d)
	if err := p.WaitLog(ctx, "Started provisioner controller"); err != nil {
		c.t.Fatal(err)
	}
	return d
}

// TestClaimHandedToAnotherProvisioner: a claim of a class of driver A
// cannot be provisioned (too large for A's backend), so it keeps the
// in-flight finalizer that this sidecar added when it took it. The
// administrator recreates the class with driver C's provisioner (upstream
// external-provisioner); kube-controller-manager hands the claim to C
// (storage-provisioner annotations), C provisions it and it is Bound. A's
// last CreateVolume got a final answer, so no volume of A can appear any
// more: A's finalizer must come off, and deleting the claim must delete it
// and C's volume, as it does when the sidecar is upstream's.
func TestClaimHandedToAnotherProvisioner(t *testing.T) {
	c := newCluster(t)
	ctx := t.Context()
	a := c.startDriver("a", false, []string{"--max-volume-size=1Gi"})
	other := c.startDriver("c", true, nil)

	class := testutil.NewSC(c.name("swap"), a.Name)
	c.createClass(class)
	claim := c.createClaim(testutil.NewPVC(c.ns, "handed").Class(c.name("swap")).Size("2Gi"))
	c.waitEvent(claim.UID, corev1.EventTypeWarning, "ProvisioningFailed", "")
	c.waitClaim(claim.Name, "taken by driver A with the in-flight finalizer", func(pvc *corev1.PersistentVolumeClaim) bool {
		return inflight.Has(pvc) && pvc.Annotations[annStorageProv] == a.Name
	})

	// The class is recreated with the other driver's provisioner.
	if err := c.c.StorageV1().StorageClasses().Delete(ctx, c.name("swap"), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 0, "class not deleted", func(ctx context.Context) (bool, error) {
		_, err := c.c.StorageV1().StorageClasses().Get(ctx, c.name("swap"), metav1.GetOptions{})
		return apierrors.IsNotFound(err), ignoreNotFound(err)
	})
	c.createClass(testutil.NewSC(c.name("swap"), other.Name))

	bound := c.waitClaimPhase(claim.Name, corev1.ClaimBound)
	pv := c.getPV(bound.Spec.VolumeName)
	if pv.Spec.CSI == nil || pv.Spec.CSI.Driver != other.Name {
		t.Fatalf("claim bound to %s of %+v, want a volume of %s", pv.Name, pv.Spec.CSI, other.Name)
	}
	c.waitClaim(claim.Name, "without the in-flight finalizer of driver A", func(pvc *corev1.PersistentVolumeClaim) bool {
		return !inflight.Has(pvc)
	})
	c.deleteClaim(claim.Name)
	testutil.Eventually(t, 0, "claim not deleted", func(ctx context.Context) (bool, error) {
		_, err := c.c.CoreV1().PersistentVolumeClaims(c.ns).Get(ctx, claim.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), ignoreNotFound(err)
	})
	c.waitPVGone(pv.Name)
	for _, d := range []*e2e.Driver{a, other} {
		if ids, err := d.VolumeIDs(ctx); err != nil || len(ids) > 0 {
			t.Errorf("driver %s has volumes %v (err %v), want none", d.Name, ids, err)
		}
	}
}

func ignoreNotFound(err error) error {
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}
