package integration

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

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
	return newClusterWith(t, true)
}

// newClusterWith is newCluster, with kube-controller-manager's PV binder
// only when kcmBinder is set.
func newClusterWith(t *testing.T, kcmBinder bool) *cluster {
	t.Helper()
	upstream, err := e2e.UpstreamProvisioner()
	if err != nil {
		if os.Getenv(controlplane.RequireEnv) != "" || !errors.Is(err, controlplane.ErrBinariesMissing) {
			t.Fatalf("the multi-driver tests need upstream external-provisioner (hack/tools/build.sh external-provisioner): %v", err)
		}
		t.Skipf("multi-driver test skipped: %v", err)
	}
	controllers := controlplane.DefaultControllers
	if kcmBinder {
		controllers = append([]string{controlplane.PVBinderController}, controlplane.DefaultControllers...)
	}
	cp := controlplane.StartForTest(t, controlplane.Config{Controllers: controllers})
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

// TestSeveralDrivers: two sidecars of this product (drivers A and B, each
// with --leader-election in the same namespace), upstream
// external-provisioner (driver C) and kube-controller-manager's PV binder
// share a cluster. Each sidecar handles what is its own and writes nothing
// else:
//
//   - each takes a Lease of its own, and claims of the three drivers'
//     classes end Bound on a volume of their class's driver;
//   - a claim created with no class while no class was default takes B's
//     class once that becomes default, and is provisioned by B;
//   - a claim of class "" that nothing matches, and a claim of a class
//     whose provisioner runs nowhere, stay Pending with neither our
//     annotations nor our finalizer; a static PV of a driver that no
//     sidecar serves is bound by kube-controller-manager alone;
//   - static PVs of A and B with the same volume handle each bind their
//     claim; deleting B's claim deletes B's PV only: A's volume and PV
//     stay, and so does a Released PV (policy Delete) of a driver nobody
//     serves that names the same handle;
//   - no object outside a sidecar's scope gets a write (field manager
//     csi-provisioner-binder or external-provisioner) or an event from it.
func TestSeveralDrivers(t *testing.T) {
	c := newCluster(t)
	ctx := t.Context()
	le := []string{"--leader-election", "--leader-election-namespace=" + c.ns}
	a := c.startDriver("a", false, nil, le...)
	b := c.startDriver("b", false, nil, le...)
	up := c.startDriver("c", true, nil)
	gone := "x." + c.ns + ".csi.example" // served by nobody

	// One Lease per driver, each held.
	leases, err := c.c.CoordinationV1().Leases(c.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	holders := map[string]string{}
	for _, l := range leases.Items {
		if l.Spec.HolderIdentity != nil {
			holders[l.Name] = *l.Spec.HolderIdentity
		}
	}
	if len(holders) != 2 || holders[strings.ReplaceAll(a.Name, ".", "-")] == "" || holders[strings.ReplaceAll(b.Name, ".", "-")] == "" {
		t.Errorf("Leases in %s: %v, want one held Lease per driver (%s, %s)", c.ns, holders, a.Name, b.Name)
	}

	classA := c.createClass(testutil.NewSC(c.name("a"), a.Name)).Name
	classB := c.createClass(testutil.NewSC(c.name("b"), b.Name)).Name
	classC := c.createClass(testutil.NewSC(c.name("c"), up.Name)).Name
	classNobody := c.createClass(testutil.NewSC(c.name("nobody"), gone)).Name
	for _, class := range []string{classA, classB, classC} {
		c.createClaim(testutil.NewPVC(c.ns, "dyn-"+class).Class(class))
	}

	// A claim with no class, made while no class is default.
	noClass := c.createClaim(testutil.NewPVC(c.ns, "no-class"))
	if noClass.Spec.StorageClassName != nil {
		t.Fatalf("claim created with class %q: another class is default in this control plane", *noClass.Spec.StorageClassName)
	}
	testutil.SetDefaultClass(t, c.c, classB, true)

	// Claims nobody may provision.
	emptyClass := c.createClaim(testutil.NewPVC(c.ns, "empty-class").Class("").Selector(map[string]string{"pair": "none"}))
	nobody := c.createClaim(testutil.NewPVC(c.ns, "nobody").Class(classNobody))

	// A static PV of the driver nobody serves, and static PVs of A and B
	// with one handle, each selected by one claim of class "".
	shared := c.startVolume(a, "shared")
	static := func(name, driver, handle string) *corev1.PersistentVolume {
		pvb := testutil.NewPV(c.name(name), driver).Class("").Label("pair", name).
			Annotation(annProvisionedBy, driver)
		pvb.Obj().Spec.CSI.VolumeHandle = handle
		return c.createPV(pvb)
	}
	staticX := static("x", gone, "handle-x")
	staticA := static("a", a.Name, shared)
	staticB := static("b", b.Name, shared)
	for _, name := range []string{"x", "a", "b"} {
		c.createClaim(testutil.NewPVC(c.ns, "static-"+name).Class("").Selector(map[string]string{"pair": name}))
	}
	// A Released volume of the driver nobody serves, naming A's handle.
	orphanB := testutil.NewPV(c.name("orphan"), gone).Class("").ClaimRef(c.ns, "ghost", "ghost-uid").
		Annotation(annProvisionedBy, gone)
	orphanB.Obj().Spec.CSI.VolumeHandle = shared
	orphan := c.createPV(orphanB)
	// Registered after the objects' removal, so that it runs first.
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		ctx := context.Background()
		claims, _ := c.c.CoreV1().PersistentVolumeClaims(c.ns).List(ctx, metav1.ListOptions{})
		for _, pvc := range claims.Items {
			evs, _ := c.events(ctx, pvc.UID)
			t.Logf("claim %s: class %v phase %s volume %q annotations %v finalizers %v events %q", pvc.Name, pvc.Spec.StorageClassName, pvc.Status.Phase, pvc.Spec.VolumeName, pvc.Annotations, pvc.Finalizers, evs)
		}
		pvs, _ := c.c.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
		for _, pv := range pvs.Items {
			evs, _ := c.events(ctx, pv.UID)
			t.Logf("PV %s: class %q phase %s claimRef %v annotations %v events %q", pv.Name, pv.Spec.StorageClassName, pv.Status.Phase, pv.Spec.ClaimRef, pv.Annotations, evs)
		}
	})

	want := map[string]string{
		"dyn-" + classA: a.Name, "dyn-" + classB: b.Name, "dyn-" + classC: up.Name, "no-class": b.Name,
		"static-x": gone, "static-a": a.Name, "static-b": b.Name,
	}
	for name, driver := range want {
		claim := c.waitClaimPhase(name, corev1.ClaimBound)
		if pv := c.getPV(claim.Spec.VolumeName); pv.Spec.CSI == nil || pv.Spec.CSI.Driver != driver {
			t.Errorf("claim %s bound to %s of %+v, want a volume of %s", name, pv.Name, pv.Spec.CSI, driver)
		}
	}
	if got := c.getClaim("no-class").Spec.StorageClassName; got == nil || *got != classB {
		t.Errorf("claim without a class got class %v, want the default %s", got, classB)
	}
	if got := c.getClaim("static-a").Spec.VolumeName; got != staticA.Name {
		t.Errorf("claim static-a bound to %s, want %s", got, staticA.Name)
	}
	c.waitPVPhase(orphan.Name, corev1.VolumeReleased)

	// Deleting B's static claim deletes B's PV (DeleteVolume of the shared
	// handle on B's driver, which has no such volume) and nothing of A.
	c.deleteClaim("static-b")
	c.waitPVGone(staticB.Name)
	if ids, err := a.VolumeIDs(ctx); err != nil || !slices.Contains(ids, shared) {
		t.Errorf("driver A's volumes %v (err %v) lost %s after B's PV with that handle was deleted", ids, err, shared)
	}
	if pv := c.getPV(staticA.Name); pv.Status.Phase != corev1.VolumeBound {
		t.Errorf("A's PV %s is %s after B's PV with its handle was deleted", pv.Name, pv.Status.Phase)
	}
	if pv := c.getPV(orphan.Name); pv.DeletionTimestamp != nil || pv.Status.Phase != corev1.VolumeReleased {
		t.Errorf("Released PV %s of a driver nobody serves: deleting %v, phase %s", pv.Name, pv.DeletionTimestamp != nil, pv.Status.Phase)
	}

	for _, pvc := range []*corev1.PersistentVolumeClaim{emptyClass, nobody} {
		got := c.getClaim(pvc.Name)
		if got.Status.Phase != corev1.ClaimPending || inflight.Has(got) {
			t.Errorf("claim %s: phase %s, finalizers %v, want Pending without %s", got.Name, got.Status.Phase, got.Finalizers, inflight.Finalizer)
		}
		if p := got.Annotations[annStorageProv]; p == a.Name || p == b.Name {
			t.Errorf("claim %s handed to %s", got.Name, p)
		}
	}

	// Nothing out of our scope was written or reported on by a sidecar,
	// but for the claim of class "" that nothing fits: it is nobody's, and
	// gets one FailedBinding from kube-controller-manager's binder or, if
	// that has not posted it by their turn, from one sidecar's. Never from
	// two sidecars; from kube-controller-manager too only when its event
	// reached the API server after that sidecar's turn (its writes are
	// asynchronous, and slow under load).
	theirs := []metav1.Object{emptyClass, nobody, c.getClaim("static-x"), staticX, orphan, c.getClaim("dyn-" + classC)}
	theirs = append(theirs, c.getPV(c.getClaim("dyn-"+classC).Spec.VolumeName))
	unowned := func(ev corev1.Event) bool {
		return ev.InvolvedObject.UID == emptyClass.UID && ev.Reason == "FailedBinding"
	}
	for _, obj := range theirs {
		c.checkUntouched(obj, unowned, a.Name, b.Name)
	}
	testutil.Eventually(t, 0, "claim of class \"\" without its FailedBinding", func(ctx context.Context) (bool, error) {
		ours := func(ev corev1.Event) bool { return unowned(ev) && ev.Source.Component != kcmEventSource }
		kcm := func(ev corev1.Event) bool { return unowned(ev) && ev.Source.Component == kcmEventSource }
		fromOurs, err := c.eventSources(ctx, emptyClass.UID, ours)
		if err != nil {
			return false, err
		}
		fromKCM, err := c.eventSources(ctx, emptyClass.UID, kcm)
		return len(fromOurs)+len(fromKCM) >= 1, err
	})
}

// eventSources returns the components that posted the events about the
// claim with uid that match accepts; more than one is an error.
func (c *cluster) eventSources(ctx context.Context, uid types.UID, match func(corev1.Event) bool) ([]string, error) {
	list, err := c.c.CoreV1().Events(c.ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.uid=" + string(uid)})
	if err != nil {
		return nil, err
	}
	var from []string
	for _, ev := range list.Items {
		if match(ev) {
			from = append(from, ev.Source.Component)
		}
	}
	if len(from) > 1 {
		return nil, fmt.Errorf("%d matching events from %q, want one", len(from), from)
	}
	return from, nil
}

// startVolume creates a 1Gi volume named name in driver d and returns its ID.
func (c *cluster) startVolume(d *e2e.Driver, name string) string {
	c.t.Helper()
	id, err := d.CreateVolume(c.t.Context(), name)
	if err != nil {
		c.t.Fatal(err)
	}
	return id
}

// checkUntouched fails if the live object was written by this product's
// binder or provisioner, or has an event from them or from the library
// of one of drivers, other than those ignore accepts.
func (c *cluster) checkUntouched(obj metav1.Object, ignore func(corev1.Event) bool, drivers ...string) {
	c.t.Helper()
	ctx := c.t.Context()
	var managed []metav1.ManagedFieldsEntry
	if obj.GetNamespace() == "" {
		pv, err := c.c.CoreV1().PersistentVolumes().Get(ctx, obj.GetName(), metav1.GetOptions{})
		if err != nil {
			c.t.Fatal(err)
		}
		managed = pv.ManagedFields
	} else {
		managed = c.getClaim(obj.GetName()).ManagedFields
	}
	for _, m := range managed {
		if m.Manager == "csi-provisioner-binder" || m.Manager == "external-provisioner" {
			c.t.Errorf("%s written by %s (%s)", obj.GetName(), m.Manager, m.Subresource)
		}
	}
	events, err := c.c.CoreV1().Events("").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.uid=" + string(obj.GetUID())})
	if err != nil {
		c.t.Fatal(err)
	}
	for _, ev := range events.Items {
		from := ev.Source.Component
		if ignore(ev) {
			continue
		}
		if from == "csi-provisioner-binder" || slices.ContainsFunc(drivers, func(d string) bool { return strings.HasPrefix(from, d+"_") }) {
			c.t.Errorf("event on %s from %s: %s %s: %s", obj.GetName(), from, ev.Type, ev.Reason, ev.Message)
		}
	}
}
