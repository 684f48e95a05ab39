package integration

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	storagehelpers "k8s.io/component-helpers/storage/volume"

	"github.com/kube-storage/csi-provisioner/internal/controlplane"
	"github.com/kube-storage/csi-provisioner/internal/e2e"
	"github.com/kube-storage/csi-provisioner/internal/testutil"
)

// stack is the real hostpath driver (memory backend) and the real
// csi-provisioner sidecar, with its binder on, serving the test's driver
// name.
type stack struct {
	e       *env
	driver  *e2e.Driver
	sidecar *e2e.Sidecar
}

// startStack builds (once per test binary) and starts the two programs and
// waits until the sidecar runs its controllers. Both stop when the test
// ends.
func (e *env) startStack(driverArgs ...string) *stack {
	e.t.Helper()
	return e.startStackWith(stackConfig{
		driver:      e2e.DriverConfig{Args: driverArgs},
		sidecarArgs: []string{"-v=4", "--binder-resync-period=1s", "--retry-interval-start=200ms", "--retry-interval-max=2s"},
	})
}

// stackConfig is what differs between the tests' stacks.
type stackConfig struct {
	// driver is completed with the test's directory, driver name and the
	// memory backend; with Topology, the node is registered as the
	// kubelet would.
	driver      e2e.DriverConfig
	sidecarArgs []string
	sidecarEnv  []string
	// kubeconfig, if set, replaces the control plane's admin kubeconfig
	// (for a sidecar that reaches kube-apiserver through a proxy).
	kubeconfig string
	// noWait returns once the sidecar runs, without waiting for its
	// provisioning controller to start (for a test of its start-up).
	noWait bool
}

// startStackWith starts the stack described by cfg; see startStack.
func (e *env) startStackWith(cfg stackConfig) *stack {
	e.t.Helper()
	ctx := e.t.Context()
	bins, err := e2e.Build(ctx, "")
	if err != nil {
		e.t.Fatal(err)
	}
	dir := e.t.TempDir()
	s := &stack{e: e}
	cfg.driver.Dir, cfg.driver.Name, cfg.driver.Memory = dir, e.driver, true
	s.driver, err = e2e.StartDriver(ctx, bins.Driver, cfg.driver)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = s.driver.Stop(5 * time.Second) })
	if cfg.driver.Topology {
		if err := s.driver.RegisterNode(ctx, e.c); err != nil {
			e.t.Fatal(err)
		}
	}
	kubeconfig := e.cp.KubeconfigPath
	if cfg.kubeconfig != "" {
		kubeconfig = cfg.kubeconfig
	}
	s.sidecar, err = e2e.StartSidecar(bins.Sidecar, e2e.SidecarConfig{
		Kubeconfig: kubeconfig, Socket: s.driver.Socket, LogPath: filepath.Join(dir, "sidecar.log"),
		Args: cfg.sidecarArgs, Env: cfg.sidecarEnv,
	})
	if err != nil {
		e.t.Fatal(err)
	}
	s.sidecar.StopAtCleanup(e.t, s.driver)
	if cfg.noWait {
		return s
	}
	if err := s.sidecar.WaitLog(ctx, "Started provisioner controller"); err != nil {
		e.t.Fatal(err)
	}
	return s
}

// waitAllBound waits until the test's namespace holds n claims, all Bound,
// and returns them.
func (e *env) waitAllBound(n int) []corev1.PersistentVolumeClaim {
	e.t.Helper()
	var claims []corev1.PersistentVolumeClaim
	testutil.Eventually(e.t, 0, "not every claim became Bound", func(ctx context.Context) (bool, error) {
		list, err := e.c.CoreV1().PersistentVolumeClaims(e.ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		claims = list.Items
		return len(claims) == n && !slices.ContainsFunc(claims, func(c corev1.PersistentVolumeClaim) bool { return !isBound(&c) }), nil
	})
	return claims
}

// createVolume creates a 1Gi volume named name in the driver, as an
// administrator would before writing a static PV for it, and returns its ID.
func (s *stack) createVolume(name string) string {
	s.e.t.Helper()
	id, err := s.driver.CreateVolume(s.e.t.Context(), name)
	if err != nil {
		s.e.t.Fatal(err)
	}
	return id
}

// volumeIDs returns the sorted IDs of the driver's volumes.
func (s *stack) volumeIDs(ctx context.Context) ([]string, error) {
	return s.driver.VolumeIDs(ctx)
}

// waitVolumeIDs waits until the driver has exactly the volumes want.
func (s *stack) waitVolumeIDs(want ...string) {
	s.e.t.Helper()
	slices.Sort(want)
	var got []string
	testutil.Eventually(s.e.t, 0, "driver volumes never became the expected ones", func(ctx context.Context) (bool, error) {
		var err error
		got, err = s.volumeIDs(ctx)
		return slices.Equal(got, want), err
	})
}

// staticPV returns a builder of a static PV for the driver volume id.
func (s *stack) staticPV(name, id string) *testutil.PVBuilder {
	b := testutil.NewPV(name, s.e.driver)
	b.Obj().Spec.CSI.VolumeHandle = id
	return b
}

// everReleased reports whether the history shows the volume in phase
// Released.
func everReleased(h *history, name string) bool {
	return len(h.volumes(func(s pvState) bool { return s.name == name && s.phase == corev1.VolumeReleased })) > 0
}

// TestSidecarReclaim: with the real sidecar and driver, deleting a claim
// releases its volume; with Delete the driver volume and the PV are
// deleted, for a provisioned and for a static volume alike; with Retain the
// PV stays Released and the driver volume stays.
func TestSidecarReclaim(t *testing.T) {
	e := newEnv(t, controlplane.Need(t, shared))
	s := e.startStack()
	del := e.createClass(testutil.NewSC(e.name("delete"), e.driver))
	ret := e.createClass(testutil.NewSC(e.name("retain"), e.driver).ReclaimPolicy(corev1.PersistentVolumeReclaimRetain))
	// The static volume has a class of its own, or the claim of the Delete
	// class could take it.
	stc := e.createClass(testutil.NewSC(e.name("static"), e.driver))
	hist := recordHistory(t, e.c, e.ns)

	staticID := s.createVolume(e.name("static"))
	static := e.createPV(s.staticPV(e.name("static"), staticID).Class(stc.Name).Label("pv", "static"))
	e.waitPVPhase(static.Name, corev1.VolumeAvailable)

	e.createClaim(testutil.NewPVC(e.ns, "delete").Class(del.Name))
	e.createClaim(testutil.NewPVC(e.ns, "retain").Class(ret.Name))
	e.createClaim(testutil.NewPVC(e.ns, "static").Class(stc.Name).Selector(map[string]string{"pv": "static"}))
	pvcDel := e.waitClaim("delete", "Bound", isBound)
	pvcRet := e.waitClaim("retain", "Bound", isBound)
	pvcStatic := e.waitClaim("static", "Bound", isBound)
	if pvcStatic.Spec.VolumeName != static.Name {
		t.Fatalf("claim with the static volume's selector bound to %s, want %s", pvcStatic.Spec.VolumeName, static.Name)
	}
	pvDel, pvRet := e.getPV(pvcDel.Spec.VolumeName), e.getPV(pvcRet.Spec.VolumeName)
	if pvRet.Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimRetain {
		t.Fatalf("PV of the Retain class has policy %s", pvRet.Spec.PersistentVolumeReclaimPolicy)
	}
	s.waitVolumeIDs(staticID, pvDel.Spec.CSI.VolumeHandle, pvRet.Spec.CSI.VolumeHandle)

	for _, name := range []string{"delete", "retain", "static"} {
		e.deleteClaim(name)
	}
	// Delete: the driver volume and the PV go, provisioned or static.
	e.waitPVGone(pvDel.Name)
	e.waitPVGone(static.Name)
	s.waitVolumeIDs(pvRet.Spec.CSI.VolumeHandle)
	for _, name := range []string{pvDel.Name, static.Name} {
		if !everReleased(hist, name) {
			t.Errorf("PV %s was deleted without being Released first: %v", name, hist.volumes(func(s pvState) bool { return s.name == name }))
		}
	}
	// Retain: by the time the others are gone, it is Released and stays.
	got := e.waitPVPhase(pvRet.Name, corev1.VolumeReleased)
	if got.DeletionTimestamp != nil || got.Spec.ClaimRef == nil || got.Spec.ClaimRef.UID != pvcRet.UID {
		t.Errorf("retained PV: deletionTimestamp %v, claimRef %+v; want nil, the deleted claim", got.DeletionTimestamp, got.Spec.ClaimRef)
	}
	if ids, err := s.volumeIDs(t.Context()); err != nil || !slices.Equal(ids, []string{pvRet.Spec.CSI.VolumeHandle}) {
		t.Errorf("driver volumes = %v (%v), want only the retained one %s", ids, err, pvRet.Spec.CSI.VolumeHandle)
	}
}

// TestSidecarSelectedNodeNotStatic (seed bug 1): a claim of a
// WaitForFirstConsumer class with a selected node is provisioned by the
// sidecar and never bound to a matching Available static volume; a claim of
// that class without a selected node waits and is not bound either.
func TestSidecarSelectedNodeNotStatic(t *testing.T) {
	e := newEnv(t, controlplane.Need(t, shared))
	// Without topology the provisioner needs no Node or CSINode objects.
	s := e.startStack("--enable-topology=false")
	sc := e.createClass(testutil.NewSC(e.name("wffc"), e.driver).WaitForFirstConsumer())
	hist := recordHistory(t, e.c, e.ns)
	static := e.createPV(s.staticPV(e.name("static"), "not-in-the-driver").Class(sc.Name).Size("5Gi").ReclaimPolicy(corev1.PersistentVolumeReclaimRetain))
	e.waitPVPhase(static.Name, corev1.VolumeAvailable)

	waiting := e.createClaim(testutil.NewPVC(e.ns, "waiting").Class(sc.Name))
	e.waitEvent(waiting.UID, corev1.EventTypeNormal, "WaitForFirstConsumer", "waiting for first consumer")

	claim := e.createClaim(testutil.NewPVC(e.ns, "scheduled").Class(sc.Name).Annotation(annSelectedNode, "node-"+e.ns))
	pvc := e.waitClaim(claim.Name, "Bound", isBound)
	if want := "pvc-" + string(claim.UID); pvc.Spec.VolumeName != want {
		t.Fatalf("claim with a selected node bound to %s, want the provisioned %s", pvc.Spec.VolumeName, want)
	}
	for _, k := range []string{annStorageProv, annBetaStorageProv} {
		if pvc.Annotations[k] != e.driver {
			t.Errorf("claim annotation %s = %q, want %s", k, pvc.Annotations[k], e.driver)
		}
	}
	pv := e.getPV(pvc.Spec.VolumeName)
	checkBound(t, pvc, pv, true, false)
	if pv.Annotations[annProvisionedBy] != e.driver {
		t.Errorf("PV provisioned-by = %q, want %s", pv.Annotations[annProvisionedBy], e.driver)
	}
	s.waitVolumeIDs(pv.Spec.CSI.VolumeHandle)

	if got := e.getClaim(waiting.Name); got.Spec.VolumeName != "" || got.Status.Phase != corev1.ClaimPending {
		t.Errorf("claim without a selected node: volumeName %q phase %s, want none, Pending", got.Spec.VolumeName, got.Status.Phase)
	}
	for _, st := range hist.volumes(func(s pvState) bool { return s.name == static.Name }) {
		if st.claimRef != "" || (st.phase != corev1.VolumeAvailable && st.phase != corev1.VolumePending) {
			t.Errorf("static PV was touched: %v", st)
		}
	}

	e.deleteClaim(claim.Name)
	e.deleteClaim(waiting.Name)
	e.waitPVGone(pv.Name)
	s.waitVolumeIDs()
	if got := e.getPV(static.Name); got.Spec.ClaimRef != nil || got.Status.Phase != corev1.VolumeAvailable {
		t.Errorf("static PV at the end: claimRef %+v phase %s, want none, Available", got.Spec.ClaimRef, got.Status.Phase)
	}
}

// TestSidecarRetroactiveDefaultClass: a claim created without a class while
// no class is default keeps no class (the admission plugin had none to give
// it). Once a class of the driver becomes default, the sidecar's binder gives
// the claim that class, and the claim is provisioned and Bound, as
// kube-controller-manager's binder (not running here) would do. A claim
// with the explicit class "" keeps it. The test runs on a control plane of
// its own: a default class would give a class to every new classless claim
// of the tests that share one.
func TestSidecarRetroactiveDefaultClass(t *testing.T) {
	e := newEnv(t, controlplane.StartForTest(t, controlplane.Config{}))
	s := e.startStack()
	sc := e.createClass(testutil.NewSC(e.name("later-default"), e.driver))
	classless := e.createClaim(testutil.NewPVC(e.ns, "classless"))
	if classless.Spec.StorageClassName != nil {
		t.Fatalf("claim created with class %q while no class is default", *classless.Spec.StorageClassName)
	}
	empty := e.createClaim(testutil.NewPVC(e.ns, "empty").Class(""))

	testutil.SetDefaultClass(t, e.c, sc.Name, true)

	pvc := e.waitClaim(classless.Name, "Bound", isBound)
	if got := storagehelpers.GetPersistentVolumeClaimClass(pvc); got != sc.Name {
		t.Errorf("claim class = %q, want the default %s", got, sc.Name)
	}
	if want := "pvc-" + string(classless.UID); pvc.Spec.VolumeName != want {
		t.Errorf("claim bound to %s, want the provisioned %s", pvc.Spec.VolumeName, want)
	}
	pv := e.getPV(pvc.Spec.VolumeName)
	checkBound(t, pvc, pv, true, false)
	s.waitVolumeIDs(pv.Spec.CSI.VolumeHandle)
	if got := e.getClaim(empty.Name); got.Spec.StorageClassName == nil || *got.Spec.StorageClassName != "" || got.Spec.VolumeName != "" {
		t.Errorf("claim of class \"\": class %v, volumeName %q; want \"\" and none", got.Spec.StorageClassName, got.Spec.VolumeName)
	}

	e.deleteClaim(classless.Name)
	e.deleteClaim(empty.Name)
	e.waitPVGone(pv.Name)
	s.waitVolumeIDs()
}

// TestSidecarDefaultClassHandedBack: a claim without a class waits while
// another provisioner's class is the default (the newer of two default
// classes wins). When that class stops being default, the driver's older
// default class is the one the claim gets, at once: the binder's resync is
// 10 minutes here, so before the class update queued the claim it stayed
// Pending until the resync.
func TestSidecarDefaultClassHandedBack(t *testing.T) {
	e := newEnv(t, controlplane.StartForTest(t, controlplane.Config{}))
	s := e.startStackWith(stackConfig{sidecarArgs: []string{"--binder-resync-period=10m", "-v=5"}})
	ours := e.createClass(testutil.NewSC(e.name("ours-default"), e.driver))
	classless := e.createClaim(testutil.NewPVC(e.ns, "classless"))
	if classless.Spec.StorageClassName != nil {
		t.Fatalf("claim created with class %q while no class is default", *classless.Spec.StorageClassName)
	}
	// Newer than ours, or of the same second with a lower name: the
	// default while both are.
	other := e.createClass(testutil.NewSC(e.name("another-default"), "other.csi.example").
		Default(testutil.DefaultClassAnnotation))
	// A claim without a class that no volume fits is explained at the
	// binder's turn, 1 to 3 s after its creation; after that, syncs of it
	// only log.
	e.waitEvent(classless.UID, corev1.EventTypeNormal, "FailedBinding", "no storage class is set")
	synced := func() int {
		return s.logCount(`"Claim is nobody's" logger="binder" pvc="` + e.ns + `/classless"`)
	}
	before := synced()
	testutil.SetDefaultClass(t, e.c, ours.Name, true)
	// Ours becoming default queues the claim; wait until the binder has
	// synced it with both classes default, so the next update is what
	// must queue it again.
	testutil.Eventually(t, 0, "the binder syncs the claim while two classes are default", func(context.Context) (bool, error) {
		return synced() > before, nil
	})
	if c := e.getClaim(classless.Name); c.Spec.StorageClassName != nil {
		t.Fatalf("claim given class %q while another provisioner's class is the default", *c.Spec.StorageClassName)
	}
	testutil.SetDefaultClass(t, e.c, other.Name, false)

	pvc := e.waitClaim(classless.Name, "Bound", isBound)
	if got := storagehelpers.GetPersistentVolumeClaimClass(pvc); got != ours.Name {
		t.Errorf("claim class = %q, want the driver's default %s", got, ours.Name)
	}
	e.deleteClaim(classless.Name)
	e.waitPVGone(pvc.Spec.VolumeName)
	s.waitVolumeIDs()
}

// logCount returns how many lines of the sidecar's log contain substr.
func (s *stack) logCount(substr string) int {
	s.e.t.Helper()
	b, err := os.ReadFile(s.sidecar.LogPath)
	if err != nil {
		s.e.t.Fatal(err)
	}
	n := 0
	for line := range strings.Lines(string(b)) {
		if strings.Contains(line, substr) {
			n++
		}
	}
	return n
}
