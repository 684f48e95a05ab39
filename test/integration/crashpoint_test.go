package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kube-storage/csi-provisioner/internal/controlplane"
	"github.com/kube-storage/csi-provisioner/internal/e2e"
	"github.com/kube-storage/csi-provisioner/internal/testutil"
	"github.com/kube-storage/csi-provisioner/pkg/inflight"
)

// The crash-point tests kill the sidecar (SIGKILL) at every write it makes
// in a flow, one write at a time: a first clean run records the sidecar's
// mutating requests (POST, PUT, PATCH, DELETE; events are recorded but not
// killed at, they carry no state the flow depends on), then for each of
// them a run in a namespace of its own kills the sidecar right after the
// API server made the change and before the sidecar saw the answer, and a
// fresh sidecar must bring the flow to its end: the claim Bound to exactly
// one PV and the driver holding exactly its volume, no finalizer left, and
// once the claim is deleted no PV and no volume. Two more runs kill the
// sidecar before the first write after the driver's CreateVolume returned
// (the PV is not written yet) and before the first write after its
// DeleteVolume returned (the PV is not deleted yet).

// crashWrite is one mutating request of the sidecar, as the proxy saw it.
type crashWrite struct {
	// kind is the method and resource, as "PATCH persistentvolumeclaims"
	// or "PUT persistentvolumes/status".
	kind string
	// n is its rank among the run's writes of its kind, from 1.
	n int
	// creates and deletes count the driver's CreateVolume and DeleteVolume
	// calls that had returned when the write was sent.
	creates, deletes int
}

func (w crashWrite) String() string {
	return fmt.Sprintf("%s #%d (%d created, %d deleted)", w.kind, w.n, w.creates, w.deletes)
}

// crashPoint is where a run kills the sidecar: at the n-th write of kind,
// after the API server made it, or before it is sent with before.
type crashPoint struct {
	kind   string
	n      int
	before bool
}

func (p crashPoint) String() string {
	if p.before {
		return fmt.Sprintf("before %s #%d", p.kind, p.n)
	}
	return fmt.Sprintf("after %s #%d", p.kind, p.n)
}

// writeKind names a request's method and resource (with its subresource).
func writeKind(r *http.Request) string {
	path := strings.TrimPrefix(r.URL.Path, "/")
	parts := strings.Split(path, "/")
	switch {
	case len(parts) >= 2 && parts[0] == "api":
		parts = parts[2:]
	case len(parts) >= 3 && parts[0] == "apis":
		parts = parts[3:]
	}
	if len(parts) > 2 && parts[0] == "namespaces" {
		parts = parts[2:]
	}
	kind := r.Method + " " + parts[0]
	if len(parts) > 2 {
		kind += "/" + parts[2]
	}
	return kind
}

// isEventWrite reports whether a write kind is an event's.
func isEventWrite(kind string) bool { return strings.HasSuffix(kind, " events") }

// crashRecorder is the fault proxy's decider for one run: it records the
// sidecar's writes once armed and kills the sidecar at the run's point.
type crashRecorder struct {
	driverLog            string
	baseCreate, baseDele int
	point                *crashPoint
	armed                atomic.Bool

	mu     sync.Mutex
	writes []crashWrite
	counts map[string]int
	hit    bool
}

func newCrashRecorder(driverLog string, point *crashPoint) *crashRecorder {
	return &crashRecorder{driverLog: driverLog, point: point, counts: map[string]int{}}
}

// arm starts recording: the driver calls made so far do not count.
func (r *crashRecorder) arm() {
	r.mu.Lock()
	r.baseCreate, r.baseDele = driverCalls(r.driverLog, "CreateVolume"), driverCalls(r.driverLog, "DeleteVolume")
	r.mu.Unlock()
	r.armed.Store(true)
}

// driverCalls counts the driver's calls of a controller method that
// returned successfully.
func driverCalls(log, method string) int {
	return countLogLines(log, `method="/csi.v1.Controller/`+method+`"`, `"gRPC call"`)
}

func (r *crashRecorder) decide(req *http.Request, watch bool, _ *rand.Rand) fault {
	// Access reviews (the start-up permission checks) are POSTs that
	// change nothing: no crash point.
	if watch || req.Method == http.MethodGet || !r.armed.Load() || strings.HasPrefix(req.URL.Path, "/apis/authorization.k8s.io/") {
		return faultNone
	}
	kind := writeKind(req)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.counts[kind]++
	w := crashWrite{kind: kind, n: r.counts[kind],
		creates: driverCalls(r.driverLog, "CreateVolume") - r.baseCreate,
		deletes: driverCalls(r.driverLog, "DeleteVolume") - r.baseDele}
	r.writes = append(r.writes, w)
	if p := r.point; p != nil && !r.hit && p.kind == w.kind && p.n == w.n {
		r.hit = true
		if p.before {
			return faultCrashBefore
		}
		return faultCrash
	}
	return faultNone
}

// count returns how many writes of kind the run made so far.
func (r *crashRecorder) count(kind string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.counts[kind]
}

func (r *crashRecorder) recorded() []crashWrite {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.writes)
}

// crashPoints returns the points of a flow whose clean run made writes: one
// after each write that is not an event's, one before the first write sent
// after a CreateVolume returned, and one before the first write sent after
// a DeleteVolume returned.
func crashPoints(writes []crashWrite) []crashPoint {
	var points []crashPoint
	var afterCreate, afterDelete bool
	for _, w := range writes {
		if w.creates > 0 && !afterCreate {
			afterCreate = true
			points = append(points, crashPoint{kind: w.kind, n: w.n, before: true})
		}
		if w.deletes > 0 && !afterDelete {
			afterDelete = true
			points = append(points, crashPoint{kind: w.kind, n: w.n, before: true})
		}
		if !isEventWrite(w.kind) {
			points = append(points, crashPoint{kind: w.kind, n: w.n})
		}
	}
	return points
}

// crashFlow is one flow whose writes are killed at.
type crashFlow struct {
	// wffc makes the class WaitForFirstConsumer (the driver then reports
	// topology and its node is registered).
	wffc       bool
	driverArgs []string
	// binderOff runs the sidecar with --enable-binder=false, on a control
	// plane whose kube-controller-manager binds.
	binderOff bool
	// setup runs with the first sidecar before its writes are recorded.
	setup func(r *crashRun)
	// act makes the flow's changes, as a user or the scheduler would.
	act func(r *crashRun)
	// check waits until the flow reached its end, with whichever sidecar
	// runs; afterwards the claim is deleted (unless gone) and everything
	// must go.
	check func(r *crashRun)
	// wantDelete: the clean run must call DeleteVolume.
	wantDelete bool
}

// crashFixture is what the runs of one flow share: the driver (whose
// volumes are all gone after each run), its class and the binaries.
type crashFixture struct {
	t      *testing.T
	cp     *controlplane.ControlPlane
	bins   e2e.Binaries
	driver *e2e.Driver
	name   string
	class  *storagev1.StorageClass
	flow   crashFlow
	// unreached counts the points a run ended before (see run).
	unreached atomic.Int32
}

// crashRun is one run of a flow, in its own namespace.
type crashRun struct {
	*crashFixture
	e     *env
	first *e2e.Sidecar
	claim *corev1.PersistentVolumeClaim
}

var crashSidecarArgs = []string{"-v=4", "--binder-resync-period=1s", "--retry-interval-start=200ms", "--retry-interval-max=2s"}

func newCrashFixture(t *testing.T, cp *controlplane.ControlPlane, flow crashFlow) *crashFixture {
	e := newEnv(t, cp)
	ctx := t.Context()
	bins, err := e2e.Build(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	f := &crashFixture{t: t, cp: e.cp, bins: bins, name: e.driver, flow: flow}
	cfg := e2e.DriverConfig{Dir: t.TempDir(), Name: e.driver, Memory: true, Args: flow.driverArgs}
	if flow.wffc {
		cfg.Topology, cfg.NodeID = true, e.name("node")
	}
	f.driver, err = e2e.StartDriver(ctx, bins.Driver, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.driver.Stop(5 * time.Second) })
	sc := testutil.NewSC(e.name("sc"), e.driver)
	if flow.wffc {
		if err := f.driver.RegisterNode(ctx, e.c); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = e.c.StorageV1().CSINodes().Delete(context.Background(), cfg.NodeID, metav1.DeleteOptions{})
			_ = e.c.CoreV1().Nodes().Delete(context.Background(), cfg.NodeID, metav1.DeleteOptions{})
		})
		m := storagev1.VolumeBindingWaitForFirstConsumer
		sc.Obj().VolumeBindingMode = &m
	}
	f.class = e.createClass(sc)
	return f
}

// startSidecar starts a sidecar on kubeconfig that stops when t ends.
func (f *crashFixture) startSidecar(t *testing.T, kubeconfig, log string) *e2e.Sidecar {
	t.Helper()
	args := crashSidecarArgs
	if f.flow.binderOff {
		args = append(slices.Clip(args), "--enable-binder=false")
	}
	s, err := e2e.StartSidecar(f.bins.Sidecar, e2e.SidecarConfig{
		Kubeconfig: kubeconfig, Socket: f.driver.Socket, LogPath: filepath.Join(t.TempDir(), log), Args: args,
	})
	if err != nil {
		t.Fatal(err)
	}
	s.StopAtCleanup(t, f.driver)
	if err := s.WaitLog(t.Context(), "Started provisioner controller"); err != nil {
		t.Fatal(err)
	}
	return s
}

// run runs the flow once in a namespace of its own, killing the sidecar at
// point (none if nil), and returns the writes the first sidecar made.
func (f *crashFixture) run(t *testing.T, point *crashPoint) []crashWrite {
	r := &crashRun{crashFixture: f, e: &env{t: t, cp: f.cp, c: f.cp.Client(), ns: newNamespace(t, f.cp), driver: f.name}}
	rec := newCrashRecorder(f.driver.LogPath, point)
	proxy, kubeconfig := startFaultProxy(t, f.cp, 1, rec.decide)
	var first atomic.Pointer[e2e.Sidecar]
	proxy.setCrash(func() {
		if s := first.Load(); s != nil {
			_ = s.Kill()
		}
	})
	if f.flow.setup == nil {
		rec.arm()
	}
	r.first = f.startSidecar(t, kubeconfig, "sidecar-1.log")
	first.Store(r.first)
	if f.flow.setup != nil {
		f.flow.setup(r)
		rec.arm()
	}
	f.flow.act(r)
	if point != nil {
		select {
		case <-r.first.Exited():
		case <-time.After(30 * time.Second):
			if rec.count(point.kind) >= point.n {
				t.Fatalf("kill point %s passed without a kill; writes: %v", point, rec.recorded())
			}
			// The flow's writes of a kind vary between runs (a claim
			// update the clean run retried after a conflict): this run
			// ended before the point. It must still converge.
			f.flow.check(r)
			writes := rec.recorded()
			r.deleteAll()
			f.unreached.Add(1)
			t.Skipf("kill point %s not reached: this run made fewer %s writes (%v)", point, point.kind, writes)
		}
		if err := r.first.ExitErr(); err == nil || !strings.Contains(err.Error(), "killed") {
			t.Fatalf("first sidecar exited with %v, want killed", err)
		}
		f.startSidecar(t, f.cp.KubeconfigPath, "sidecar-2.log")
	}
	f.flow.check(r)
	rec.armed.Store(false)
	writes := rec.recorded()
	r.deleteAll()
	return writes
}

// deleteAll deletes the claim if it still exists and waits until the
// claim, its PVs and the driver's volumes are gone.
func (r *crashRun) deleteAll() {
	t, e := r.e.t, r.e
	err := e.c.CoreV1().PersistentVolumeClaims(e.ns).Delete(t.Context(), r.claim.Name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	r.waitAllGone()
}

// waitAllGone waits until the claim is gone (no finalizer holds it), no PV
// of the driver remains (none holds a finalizer) and the driver holds no
// volume.
func (r *crashRun) waitAllGone() {
	e := r.e
	testutil.Eventually(e.t, 0, "claim not gone", func(ctx context.Context) (bool, error) {
		_, err := e.c.CoreV1().PersistentVolumeClaims(e.ns).Get(ctx, r.claim.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, err
	})
	var left []string
	testutil.Eventually(e.t, 0, "PVs of the driver left", func(ctx context.Context) (bool, error) {
		var err error
		left, err = r.driverPVs(ctx)
		return len(left) == 0, err
	})
	var ids []string
	testutil.Eventually(e.t, 0, "driver volumes left", func(ctx context.Context) (bool, error) {
		var err error
		ids, err = r.driver.VolumeIDs(ctx)
		return len(ids) == 0, err
	})
}

// driverPVs returns the names of the PVs of the fixture's driver, with
// their finalizers.
func (r *crashRun) driverPVs(ctx context.Context) ([]string, error) {
	pvs, err := r.e.c.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	var names []string
	for _, pv := range pvs.Items {
		if pv.Spec.CSI != nil && pv.Spec.CSI.Driver == r.name {
			names = append(names, fmt.Sprintf("%s%v", pv.Name, pv.Finalizers))
		}
	}
	return names, nil
}

// createClaim creates the run's claim of the fixture's class.
func (r *crashRun) createClaim() {
	r.claim = r.e.createClaim(testutil.NewPVC(r.e.ns, "data").Class(r.class.Name))
}

// waitBound waits until the claim is Bound to a PV that is Bound to it, the
// only PV of the driver, whose volume is the only one the driver holds, and
// the claim has no in-flight finalizer left.
func (r *crashRun) waitBound() {
	e := r.e
	var state string
	testutil.Eventually(e.t, 0, "claim not bound to exactly one PV and volume", func(ctx context.Context) (bool, error) {
		claim, err := e.c.CoreV1().PersistentVolumeClaims(e.ns).Get(ctx, r.claim.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		pvs, err := r.driverPVs(ctx)
		if err != nil {
			return false, err
		}
		ids, err := r.driver.VolumeIDs(ctx)
		if err != nil {
			return false, err
		}
		state = fmt.Sprintf("claim %s volumeName %q finalizers %v; PVs %v; volumes %v", claim.Status.Phase, claim.Spec.VolumeName, claim.Finalizers, pvs, ids)
		if claim.Status.Phase != corev1.ClaimBound || inflight.Has(claim) || len(pvs) != 1 || len(ids) != 1 {
			return false, nil
		}
		pv, err := e.c.CoreV1().PersistentVolumes().Get(ctx, claim.Spec.VolumeName, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		state += fmt.Sprintf("; PV %s %s claimRef %v handle %s", pv.Name, pv.Status.Phase, pv.Spec.ClaimRef, pv.Spec.CSI.VolumeHandle)
		return pv.Status.Phase == corev1.VolumeBound && pv.Spec.ClaimRef != nil && pv.Spec.ClaimRef.UID == claim.UID &&
			pv.Spec.CSI.VolumeHandle == ids[0], nil
	})
	e.t.Logf("converged: %s", state)
}

// testCrashPoints records the flow's writes in a clean run, then kills the
// sidecar at each point, in a run of its own.
func testCrashPoints(t *testing.T, cp *controlplane.ControlPlane, flow crashFlow) {
	f := newCrashFixture(t, cp, flow)
	var writes []crashWrite
	if !t.Run("clean", func(t *testing.T) { writes = f.run(t, nil) }) {
		t.FailNow()
	}
	points := crashPoints(writes)
	t.Logf("writes of the clean run: %v", writes)
	var creates, deletes bool
	for _, w := range writes {
		creates, deletes = creates || w.creates > 0, deletes || w.deletes > 0
	}
	if len(points) == 0 || !creates && !flow.wantDelete || flow.wantDelete && !deletes {
		t.Fatalf("the clean run made writes %v (after CreateVolume: %v, after DeleteVolume: %v): the flow does not exercise what it should", writes, creates, deletes)
	}
	for _, p := range points {
		t.Run(p.String(), func(t *testing.T) { f.run(t, &p) })
	}
	if n := int(f.unreached.Load()); n > len(points)/2 {
		t.Errorf("%d of %d kill points not reached: the flow's writes differ too much from the clean run's", n, len(points))
	}
}

// provisionFlow: an Immediate claim is provisioned and bound.
var provisionFlow = crashFlow{
	act:   (*crashRun).createClaim,
	check: (*crashRun).waitBound,
}

// deleteFlow: the claim of a provisioned and bound volume is deleted: the
// PV is Released, its volume deleted, its finalizer removed and the PV
// deleted.
var deleteFlow = crashFlow{
	setup: func(r *crashRun) {
		r.createClaim()
		r.waitBound()
	},
	act:        func(r *crashRun) { r.e.deleteClaim(r.claim.Name) },
	check:      (*crashRun).waitAllGone,
	wantDelete: true,
}

// TestCrashPointsProvision: the sidecar is killed at each write of
// provisionFlow.
func TestCrashPointsProvision(t *testing.T) {
	testCrashPoints(t, controlplane.Need(t, shared), provisionFlow)
}

// TestCrashPointsWaitForFirstConsumer: a WaitForFirstConsumer claim is
// provisioned once the test, as the scheduler would, selects the driver's
// node.
func TestCrashPointsWaitForFirstConsumer(t *testing.T) {
	testCrashPoints(t, controlplane.Need(t, shared), crashFlow{
		wffc: true,
		act: func(r *crashRun) {
			r.createClaim()
			patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, annSelectedNode, r.driver.NodeID)
			_, err := r.e.c.CoreV1().PersistentVolumeClaims(r.e.ns).Patch(r.e.t.Context(), r.claim.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
			if err != nil {
				r.e.t.Fatal(err)
			}
		},
		check: (*crashRun).waitBound,
	})
}

// TestCrashPointsDelete: the sidecar is killed at each write of
// deleteFlow.
func TestCrashPointsDelete(t *testing.T) {
	testCrashPoints(t, controlplane.Need(t, shared), deleteFlow)
}

// deleteDuringCreateFlow: the claim is deleted while its CreateVolume is in
// flight (the driver answers 1s late), or, if the sidecar was killed before
// that, while no sidecar runs. The in-flight finalizer keeps the claim
// until the volume is known and deleted.
var deleteDuringCreateFlow = crashFlow{
	driverArgs: []string{"--create-latency=1s"},
	act: func(r *crashRun) {
		r.createClaim()
		testutil.Eventually(r.e.t, 0, "CreateVolume not started", func(ctx context.Context) (bool, error) {
			select {
			case <-r.first.Exited():
				return true, nil
			default:
			}
			ids, err := r.driver.VolumeIDs(ctx)
			return len(ids) == 1, err
		})
		r.e.deleteClaim(r.claim.Name)
	},
	check:      (*crashRun).waitAllGone,
	wantDelete: true,
}

// TestCrashPointsDeleteDuringCreate: the sidecar is killed at each write of
// deleteDuringCreateFlow.
func TestCrashPointsDeleteDuringCreate(t *testing.T) {
	testCrashPoints(t, controlplane.Need(t, shared), deleteDuringCreateFlow)
}

// TestCrashPointsControllerManagerBinder: with the sidecar's binder off
// (upstream's deployment), kube-controller-manager hands the claim over,
// binds and releases; the sidecar is killed at each of its own writes of
// provisionFlow and deleteFlow. deleteDuringCreateFlow is not run here:
// its PV is created while the claim still exists (the in-flight finalizer
// holds it) and is bound to nothing, so kube-controller-manager finds it
// Released only at its periodic resync (15 s), which every point would
// wait for.
func TestCrashPointsControllerManagerBinder(t *testing.T) {
	cp := controlplane.StartForTest(t, controlplane.Config{
		Controllers: append([]string{controlplane.PVBinderController}, controlplane.DefaultControllers...),
	})
	for name, flow := range map[string]crashFlow{"provision": provisionFlow, "delete": deleteFlow} {
		flow.binderOff = true
		t.Run(name, func(t *testing.T) { testCrashPoints(t, cp, flow) })
	}
}
