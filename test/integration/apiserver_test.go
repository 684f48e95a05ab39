package integration

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-storage/csi-provisioner/internal/controlplane"
	"github.com/kube-storage/csi-provisioner/internal/e2e"
	"github.com/kube-storage/csi-provisioner/internal/testutil"
)

// TestAPIServerOutage: kube-apiserver stops while the sidecar provisions
// and deletes volumes, and starts again once every CreateVolume and
// DeleteVolume of the run has been answered, so that each PV create, PV
// finalizer removal and PV delete that follows meets a refused connection
// and has to be retried. Afterwards every new claim is Bound to a PV of
// its own, every Released Delete volume is gone with its driver volume
// deleted by the driver once and DeleteVolume called once per volume,
// the driver holds exactly the PVs' volumes, and the sidecar (no leader
// election) is still the same process.
func TestAPIServerOutage(t *testing.T) {
	testAPIServerOutage(t, false)
}

// TestAPIServerOutageLeaderElection: as TestAPIServerOutage, with
// --leader-election and its default timings. The leader cannot renew its
// Lease while kube-apiserver is down and exits with status 1 once its
// renew deadline has passed (as upstream); the outage lasts until it has.
// Started again (its Deployment would restart it), it takes the Lease and
// finishes the work: volumes whose CreateVolume was answered while no PV
// could be written are found again under the same name, not created twice.
func TestAPIServerOutageLeaderElection(t *testing.T) {
	testAPIServerOutage(t, true)
}

func testAPIServerOutage(t *testing.T, leaderElection bool) {
	// Each variant has a control plane of its own and spends most of its
	// minute waiting out the outage and the retries after it: the two run
	// side by side (after the package's other tests) instead of one after
	// the other.
	t.Parallel()
	const newClaims, oldClaims, outage = 6, 4, 15 * time.Second
	cp := controlplane.StartForTest(t, controlplane.Config{})
	e := newEnv(t, cp)
	args := []string{"-v=4", "--binder-resync-period=1s", "--retry-interval-start=200ms", "--retry-interval-max=2s", "--worker-threads=20"}
	if leaderElection {
		args = append(args, "--leader-election", "--leader-election-namespace="+e.ns)
	}
	s := e.startStackWith(stackConfig{
		driver:      e2e.DriverConfig{Args: []string{"--create-latency=3s", "--delete-latency=3s"}},
		sidecarArgs: args,
	})
	sc := e.createClass(testutil.NewSC(e.name("sc"), e.driver))
	for i := range oldClaims {
		e.createClaim(testutil.NewPVC(e.ns, fmt.Sprintf("old-%d", i)).Class(sc.Name))
	}
	old := e.waitAllBound(oldClaims)
	var oldPVs, oldIDs []string
	for _, c := range old {
		pv := e.getPV(c.Spec.VolumeName)
		oldPVs, oldIDs = append(oldPVs, pv.Name), append(oldIDs, pv.Spec.CSI.VolumeHandle)
	}
	driverLog := s.driver.LogPath
	createdBefore := countLogLines(driverLog, `"Created volume"`)

	for i := range newClaims {
		e.createClaim(testutil.NewPVC(e.ns, fmt.Sprintf("new-%d", i)).Class(sc.Name))
	}
	for _, c := range old {
		e.deleteClaim(c.Name)
	}
	// Every call has reached the driver (the volumes exist or are gone)
	// before the API server stops; the answers come during the outage.
	testutil.Eventually(t, 0, "the driver did not get every call", func(context.Context) (bool, error) {
		return countLogLines(driverLog, `"Created volume"`) == createdBefore+newClaims &&
			countLogLines(driverLog, `"Deleted volume"`) == oldClaims, nil
	})
	if err := cp.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	down := time.Now()
	// The driver answers the calls (3 s latency) with no API server to
	// record their outcome; the outage lasts at least outage, as an
	// upgrade's restart of kube-apiserver may.
	testutil.Eventually(t, 0, "the driver did not answer every call", func(context.Context) (bool, error) {
		return countLogLines(driverLog, `"gRPC call"`, `method="/csi.v1.Controller/CreateVolume"`) >= createdBefore+newClaims &&
			countLogLines(driverLog, `"gRPC call"`, `method="/csi.v1.Controller/DeleteVolume"`) >= oldClaims &&
			time.Since(down) >= outage, nil
	})
	if leaderElection {
		waitCtx, cancel := context.WithTimeout(t.Context(), time.Minute)
		err := s.sidecar.WaitExit(waitCtx)
		cancel()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 1 {
			t.Fatalf("the leader did not exit with status 1 after losing its Lease: %v", err)
		}
	}
	if err := cp.StartAPIServer(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Logf("kube-apiserver was down for %s", time.Since(down).Round(100*time.Millisecond))
	if leaderElection {
		if err := s.sidecar.Restart(); err != nil {
			t.Fatal(err)
		}
	}

	claims := e.waitAllBound(newClaims)
	for _, name := range oldPVs {
		e.waitPVGone(name)
	}
	ours := s.waitOnlyVolumesOf(claims)
	if len(ours) != newClaims {
		t.Errorf("PVs of the driver = %v, want one for each of the %d claims", ours, newClaims)
	}
	for _, id := range oldIDs {
		if n := countLogLines(driverLog, `"Deleted volume"`, `volumeID="`+id+`"`); n != 1 {
			t.Errorf("volume %s deleted %d times by the driver, want 1", id, n)
		}
	}
	// The library retries a deletion whose PV it could not delete after
	// DeleteVolume; the sidecar does not call DeleteVolume again for it.
	// A restarted leader does not know, and may call it once more.
	calls, want := countLogLines(driverLog, `method="/csi.v1.Controller/DeleteVolume"`, `"gRPC call`), oldClaims
	if leaderElection {
		want = 2 * oldClaims
	}
	if calls > want {
		t.Errorf("%d DeleteVolume calls for %d volumes, want at most %d", calls, oldClaims, want)
	}
	if got := countLogLines(driverLog, `"Created volume"`); got != createdBefore+newClaims {
		t.Errorf("driver created %d volumes, want %d", got, createdBefore+newClaims)
	}
	select {
	case <-s.sidecar.Exited():
		t.Fatalf("the sidecar exited: %v", s.sidecar.ExitErr())
	default:
	}
	for _, c := range claims {
		if !slices.Contains(ours, c.Spec.VolumeName) {
			t.Errorf("claim %s bound to %s, which is not a PV of the driver", c.Name, c.Spec.VolumeName)
		}
	}
	e.waitEvent(claims[0].UID, corev1.EventTypeNormal, "ProvisioningSucceeded", "Successfully provisioned volume")
}

// waitOnlyVolumesOf waits until the driver holds exactly the volumes of
// the Bound claims, then returns the names of the PVs of the driver.
func (s *stack) waitOnlyVolumesOf(claims []corev1.PersistentVolumeClaim) []string {
	e := s.e
	var ids []string
	for _, c := range claims {
		ids = append(ids, e.getPV(c.Spec.VolumeName).Spec.CSI.VolumeHandle)
	}
	s.waitVolumeIDs(ids...)
	pvs, err := e.c.CoreV1().PersistentVolumes().List(e.t.Context(), metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	var names []string
	for _, pv := range pvs.Items {
		if pv.Spec.CSI != nil && pv.Spec.CSI.Driver == e.driver {
			names = append(names, pv.Name)
		}
	}
	return names
}

// countLogLines counts the lines of the log at path that contain every one
// of subs.
func countLogLines(path string, subs ...string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	n := 0
	for line := range strings.SplitSeq(string(b), "\n") {
		if !slices.ContainsFunc(subs, func(s string) bool { return !strings.Contains(line, s) }) {
			n++
		}
	}
	return n
}

// groupVersionPath is the path of a discovery read of one API group
// version.
var groupVersionPath = regexp.MustCompile(`^/apis/[^/]+/[^/]+$`)

// TestAPIFaults: the sidecar reaches kube-apiserver through a proxy that
// answers about a third of its writes with 429 (Retry-After: 1), 500 or
// 503 without making them, or makes them and then closes the connection
// unanswered (a lost response: the retry finds the PV already created,
// the claim changed, the PV gone); fails a tenth of its reads with 503,
// and its first discovery read at start;
// answers some watches from a resourceVersion with 410 Gone (the informer
// lists again) and cuts every watch after 1 to 3 s. Claims are created,
// some deleted: every remaining claim ends Bound to a PV of its own, the
// deleted claims' PVs are gone with their volumes deleted once, the driver
// holds exactly the PVs' volumes, and the claims have their
// ProvisioningSucceeded events.
func TestAPIFaults(t *testing.T) {
	const claims, deleted = 10, 5
	cp := controlplane.StartForTest(t, controlplane.Config{})
	e := newEnv(t, cp)
	seed := uint64(time.Now().UnixNano())
	// The first watch that can be answered 410 is, and the first four
	// faulted writes get one fault of each kind, so that every run injects
	// every fault; after that the faults are random. (A run of a few
	// seconds makes only some ten watches from a resourceVersion: at 0.2
	// each, one run in ten had no 410.)
	// The first discovery read of a group version (the sidecar's start-up
	// checks) is answered 503: the sidecar must try it again, not exit.
	writeFaults := []fault{fault429, fault500, fault503, faultLost}
	goneSent, writesFaulted, discoveryFailed := false, 0, false
	proxy, kubeconfig := startFaultProxy(t, cp, seed, func(r *http.Request, watch bool, rng *rand.Rand) fault {
		x := rng.Float64()
		switch {
		case r.Method == http.MethodGet && !discoveryFailed && groupVersionPath.MatchString(r.URL.Path):
			discoveryFailed = true
			return fault503
		case watch:
			rv := r.URL.Query().Get("resourceVersion")
			if rv != "" && rv != "0" && r.URL.Query().Get("sendInitialEvents") == "" && (!goneSent || x < 0.2) {
				goneSent = true
				return faultGone
			}
		case r.Method == http.MethodGet:
			if x < 0.1 {
				return fault503
			}
		case x < 0.33:
			f := writeFaults[rng.IntN(len(writeFaults))]
			if writesFaulted < len(writeFaults) {
				f = writeFaults[writesFaulted]
			}
			writesFaulted++
			return f
		}
		return faultNone
	})
	s := e.startStackWith(stackConfig{
		sidecarArgs: []string{"-v=4", "--binder-resync-period=1s", "--retry-interval-start=200ms", "--retry-interval-max=2s"},
		kubeconfig:  kubeconfig,
	})
	sc := e.createClass(testutil.NewSC(e.name("sc"), e.driver))
	for i := range claims {
		e.createClaim(testutil.NewPVC(e.ns, fmt.Sprintf("data-%d", i)).Class(sc.Name))
	}
	bound := e.waitAllBound(claims)
	var gonePVs, goneIDs []string
	for _, c := range bound[:deleted] {
		pv := e.getPV(c.Spec.VolumeName)
		gonePVs, goneIDs = append(gonePVs, pv.Name), append(goneIDs, pv.Spec.CSI.VolumeHandle)
		e.deleteClaim(c.Name)
	}
	for _, name := range gonePVs {
		e.waitPVGone(name)
	}
	kept := e.waitAllBound(claims - deleted)
	ours := s.waitOnlyVolumesOf(kept)
	if len(ours) != claims-deleted {
		t.Errorf("PVs of the driver = %v, want one for each of the %d claims", ours, claims-deleted)
	}
	driverLog := s.driver.LogPath
	for _, id := range goneIDs {
		if n := countLogLines(driverLog, `"Deleted volume"`, `volumeID="`+id+`"`); n != 1 {
			t.Errorf("volume %s deleted %d times by the driver, want 1", id, n)
		}
	}
	if n := countLogLines(driverLog, `method="/csi.v1.Controller/DeleteVolume"`, `"gRPC call`); n != deleted {
		t.Errorf("%d DeleteVolume calls for %d volumes, want one each", n, deleted)
	}
	if n := countLogLines(driverLog, `"Created volume"`); n != claims {
		t.Errorf("driver created %d volumes, want %d", n, claims)
	}
	for _, c := range kept {
		e.waitEvent(c.UID, corev1.EventTypeNormal, "ProvisioningSucceeded", "Successfully provisioned volume "+c.Spec.VolumeName)
	}
	counts := proxy.counts()
	t.Logf("faults injected: %v", counts)
	if !discoveryFailed {
		t.Errorf("the sidecar read no group version at start: the start-up retry went untested")
	}
	for _, f := range []fault{fault429, fault500, fault503, faultLost, faultGone} {
		if counts[f] == 0 {
			t.Errorf("no %s fault injected (seed %d): the run proves nothing about it", f, seed)
		}
	}
	select {
	case <-s.sidecar.Exited():
		t.Fatalf("the sidecar exited: %v", s.sidecar.ExitErr())
	default:
	}
}

// TestAPIFaultsCapacity: with --enable-capacity, the sidecar publishes
// CSIStorageCapacity objects through the fault proxy of TestAPIFaults
// (writes only: half the creates lose their answer, a third of the other
// writes fail or lose theirs). A create whose answer
// was lost leaves an object the sidecar does not know it made, and its
// retry makes a second one (generated names); a lost delete is retried
// into NotFound. In the end each WaitForFirstConsumer class has exactly one
// object, and a deleted class none.
func TestAPIFaultsCapacity(t *testing.T) {
	const classes, deleted = 8, 3
	cp := controlplane.StartForTest(t, controlplane.Config{})
	e := newEnv(t, cp)
	seed := uint64(time.Now().UnixNano())
	// The first create loses its answer, so that every run has one.
	lostSent := false
	proxy, kubeconfig := startFaultProxy(t, cp, seed, func(r *http.Request, watch bool, rng *rand.Rand) fault {
		x := rng.Float64()
		switch {
		case watch || r.Method == http.MethodGet || !strings.Contains(r.URL.Path, "/csistoragecapacities"):
			return faultNone
		case r.Method == http.MethodPost && (!lostSent || x < 0.5):
			lostSent = true
			return faultLost
		case x < 0.33:
			return []fault{fault429, fault500, fault503, faultLost}[rng.IntN(4)]
		}
		return faultNone
	})
	e.startStackWith(stackConfig{
		driver: e2e.DriverConfig{Topology: true, Args: []string{"--capacity=10Gi"}},
		sidecarArgs: []string{"-v=4", "--retry-interval-start=200ms", "--retry-interval-max=2s",
			"--enable-capacity", "--capacity-ownerref-level=-1", "--capacity-poll-interval=500ms"},
		sidecarEnv: []string{"NAMESPACE=" + e.ns},
		kubeconfig: kubeconfig,
	})
	var names []string
	for i := range classes {
		sc := e.createClass(testutil.NewSC(e.name(fmt.Sprintf("sc-%d", i)), e.driver).WaitForFirstConsumer())
		names = append(names, sc.Name)
	}
	waitCapacityPerClass := func(want map[string]int) {
		t.Helper()
		var got map[string]int
		testutil.Eventually(t, 0, "CSIStorageCapacity objects per class", func(ctx context.Context) (bool, error) {
			list, err := e.c.StorageV1().CSIStorageCapacities(e.ns).List(ctx, metav1.ListOptions{})
			if err != nil {
				return false, err
			}
			got = map[string]int{}
			for _, c := range list.Items {
				got[c.StorageClassName]++
			}
			return maps.Equal(got, want), nil
		})
	}
	want := map[string]int{}
	for _, name := range names {
		want[name] = 1
	}
	waitCapacityPerClass(want)
	for _, name := range names[:deleted] {
		if err := e.c.StorageV1().StorageClasses().Delete(t.Context(), name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		delete(want, name)
	}
	waitCapacityPerClass(want)
	counts := proxy.counts()
	t.Logf("faults injected: %v", counts)
	if counts[faultLost] == 0 {
		t.Errorf("no lost answer injected (seed %d): the run proves nothing about it", seed)
	}
}

// TestWatchGapClaimRecreated: the sidecar's watches and lists fail (503)
// for a while, as when kube-apiserver is overloaded; meanwhile a Bound
// claim of a Delete class is deleted and created again under the same
// name. When its informers list again, the sidecar must neither bind the
// new claim to the old claim's volume nor keep that volume: the old
// volume is deleted (its claim is gone), once, and the new claim gets a
// volume of its own.
func TestWatchGapClaimRecreated(t *testing.T) {
	cp := controlplane.StartForTest(t, controlplane.Config{})
	e := newEnv(t, cp)
	var gap atomic.Bool
	proxy, kubeconfig := startFaultProxy(t, cp, 1, func(r *http.Request, _ bool, _ *rand.Rand) fault {
		if gap.Load() && r.Method == http.MethodGet {
			return fault503
		}
		return faultNone
	})
	s := e.startStackWith(stackConfig{
		sidecarArgs: []string{"-v=4", "--binder-resync-period=1s", "--retry-interval-start=200ms", "--retry-interval-max=2s"},
		kubeconfig:  kubeconfig,
	})
	sc := e.createClass(testutil.NewSC(e.name("sc"), e.driver))
	e.createClaim(testutil.NewPVC(e.ns, "data").Class(sc.Name))
	old := e.waitAllBound(1)[0]
	oldPV := e.getPV(old.Spec.VolumeName)

	// The proxy cuts every watch within 3 s; from then on the sidecar
	// sees nothing until the gap ends.
	gap.Store(true)
	testutil.Eventually(t, 0, "the sidecar's watches did not end", func(context.Context) (bool, error) {
		return proxy.watches.Load() == 0, nil
	})
	e.deleteClaim("data")
	testutil.Eventually(t, 0, "the old claim is not gone", func(ctx context.Context) (bool, error) {
		_, err := e.c.CoreV1().PersistentVolumeClaims(e.ns).Get(ctx, "data", metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	recreated := e.createClaim(testutil.NewPVC(e.ns, "data").Class(sc.Name))
	if proxy.watches.Load() != 0 {
		t.Fatal("a watch of the sidecar got through during the gap")
	}
	gap.Store(false)

	e.waitPVGone(oldPV.Name)
	bound := e.waitAllBound(1)[0]
	if bound.UID != recreated.UID || bound.Spec.VolumeName == oldPV.Name {
		t.Errorf("claim %s (UID %s) bound to %s, want the new claim %s bound to a new volume", bound.Name, bound.UID, bound.Spec.VolumeName, recreated.UID)
	}
	newPV := e.getPV(bound.Spec.VolumeName)
	s.waitVolumeIDs(newPV.Spec.CSI.VolumeHandle)
	if n := countLogLines(s.driver.LogPath, `"Deleted volume"`, `volumeID="`+oldPV.Spec.CSI.VolumeHandle+`"`); n != 1 {
		t.Errorf("the old volume was deleted %d times by the driver, want 1", n)
	}
}

// TestLostPVCreateNotRepeatedAfterDeletion: the answer to the create of a
// claim's PV is lost (the PV exists) and the provisioning library's
// background retries of that create fail until the claim has been bound,
// deleted and its volume reclaimed. The library's next retry must not
// create the PV again: such a PV names a volume that DeleteVolume already
// deleted, and reclaiming it would call DeleteVolume once more (a driver
// that answers NotFound for a volume it no longer has would leave it
// Released for ever). Seen once in CI as a second DeleteVolume call in
// TestAPIFaults.
func TestLostPVCreateNotRepeatedAfterDeletion(t *testing.T) {
	cp := controlplane.StartForTest(t, controlplane.Config{})
	e := newEnv(t, cp)
	var pvCreates, createsAfter atomic.Int32
	var blocked atomic.Bool
	blocked.Store(true)
	_, kubeconfig := startFaultProxy(t, cp, 1, func(r *http.Request, _ bool, _ *rand.Rand) fault {
		if r.Method != http.MethodPost || r.URL.Path != "/api/v1/persistentvolumes" {
			return faultNone
		}
		switch {
		case pvCreates.Add(1) == 1:
			return faultLost
		case blocked.Load():
			return fault503
		}
		createsAfter.Add(1)
		return faultNone
	})
	s := e.startStackWith(stackConfig{
		sidecarArgs: []string{"-v=4", "--retry-interval-start=200ms", "--retry-interval-max=1s"},
		kubeconfig:  kubeconfig,
	})
	sc := e.createClass(testutil.NewSC(e.name("sc"), e.driver))
	e.createClaim(testutil.NewPVC(e.ns, "data").Class(sc.Name))
	claim := e.waitAllBound(1)[0]
	pv := e.getPV(claim.Spec.VolumeName)
	testutil.Eventually(t, 0, "the library did not retry the PV create", func(context.Context) (bool, error) {
		return pvCreates.Load() >= 2, nil
	})
	e.deleteClaim(claim.Name)
	e.waitPVGone(pv.Name)
	s.waitVolumeIDs()

	blocked.Store(false)
	const skipped = "Not creating the persistentvolume again"
	testutil.Eventually(t, 0, "the library's retry of the PV create never came", func(context.Context) (bool, error) {
		return createsAfter.Load() > 0 || countLogLines(s.sidecar.LogPath, skipped, pv.Name) > 0, nil
	})
	if n := createsAfter.Load(); n > 0 {
		t.Errorf("PV %s created again after its volume %s was deleted (%d creates)", pv.Name, pv.Spec.CSI.VolumeHandle, n)
		e.waitPVGone(pv.Name) // reclaimed again
	}
	if n := countLogLines(s.driver.LogPath, `method="/csi.v1.Controller/DeleteVolume"`, `"gRPC call`); n != 1 {
		t.Errorf("%d DeleteVolume calls, want 1", n)
	}
}
