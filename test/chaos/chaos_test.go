package chaos

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/kube-storage/csi-provisioner/internal/controlplane"
	"github.com/kube-storage/csi-provisioner/internal/e2e"
	"github.com/kube-storage/csi-provisioner/internal/testutil"
)

var (
	flagClaims = flag.Int("chaos.claims", 0, "claims to create (default 100, or 1000 with CHAOS_LONG=1)")
	flagKills  = flag.Int("chaos.kills", 0, "sidecar kills (default 5, or 50 with CHAOS_LONG=1)")
)

// config sizes one run.
type config struct {
	claims, static          int
	kills, leaderKills      int
	apiRestarts, drvRestart int
	maxLive                 int
	createEvery             time.Duration
	lifetime                [2]time.Duration // of a claim that is neither a survivor nor deleted in flight
	converge                time.Duration
}

func newConfig() config {
	c := config{
		claims: 100, static: 6, kills: 5, leaderKills: 2, apiRestarts: 1, drvRestart: 1,
		maxLive: 40, createEvery: 100 * time.Millisecond,
		lifetime: [2]time.Duration{time.Second, 8 * time.Second}, converge: 5 * time.Minute,
	}
	if os.Getenv("CHAOS_LONG") != "" {
		c.claims, c.static, c.kills, c.leaderKills, c.drvRestart = 1000, 30, 50, 10, 3
		c.maxLive, c.lifetime, c.converge = 60, [2]time.Duration{time.Second, 20 * time.Second}, 20*time.Minute
	}
	if *flagClaims > 0 {
		c.claims = *flagClaims
	}
	if *flagKills > 0 {
		c.kills = *flagKills
	}
	return c
}

// plan is the fate of one claim.
type plan struct {
	name     string
	deleteAt time.Time // zero: it survives the run
	inFlight bool      // deleted right after creation, while CreateVolume runs
	deleted  bool
}

// chaosEvent is a fault injected once a number of claims was created.
type chaosEvent struct {
	at   int // claims created
	kind string
}

// stats is the run's summary.
type stats struct {
	created, static, deleted, inFlightDeletes, retainClaims int
	sidecarKills, leaderKillsOfSidecarKills                 int
	leaderKills, apiRestarts, driverRestarts                int
	failovers                                               []time.Duration
	historyChecks                                           int
}

func TestChaos(t *testing.T) {
	cfg := newConfig()
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("CHAOS_SEED"); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("CHAOS_SEED=%q: %v", s, err)
		}
	}
	t.Logf("chaos seed %d (replay the random choices with CHAOS_SEED=%d); %d claims, %d sidecar kills", seed, seed, cfg.claims, cfg.kills)
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	quietKlog()

	dir, err := os.MkdirTemp("", "csi-provisioner-chaos-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() || os.Getenv("CHAOS_KEEP_LOGS") != "" {
			t.Logf("logs kept in %s", dir)
			return
		}
		_ = os.RemoveAll(dir)
	})
	if err := os.Mkdir(filepath.Join(dir, "controlplane"), 0o700); err != nil {
		t.Fatal(err)
	}
	cp := controlplane.StartForTest(t, controlplane.Config{Dir: filepath.Join(dir, "controlplane")})
	bins, err := e2e.Build(t.Context(), "")
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	s := &stack{t: t, cp: cp, c: cp.Client(), dir: dir, bins: bins, identities: map[string]string{}, log: t.Logf}
	for _, ns := range []string{claimNS, leaseNS} {
		if _, err := s.c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	rec := NewRecorder(s.c)
	recCtx, stopRec := context.WithCancel(ctx)
	defer stopRec()
	if err := rec.Start(recCtx); err != nil {
		t.Fatal(err)
	}

	s.startDriver("Unavailable", seed%1_000_000_007+1)
	t.Cleanup(func() { _ = s.driver.Stop(5 * time.Second) })
	for _, class := range []struct {
		name   string
		policy corev1.PersistentVolumeReclaimPolicy
	}{{"chaos-delete", corev1.PersistentVolumeReclaimDelete}, {"chaos-retain", corev1.PersistentVolumeReclaimRetain}} {
		sc := testutil.NewSC(class.name, driverName).ReclaimPolicy(class.policy).Obj()
		sc.ResourceVersion, sc.UID = "", ""
		if _, err := s.c.StorageV1().StorageClasses().Create(ctx, sc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	order := s.createStatic(cfg, rng)

	s.replicas = []*replica{{name: "a"}, {name: "b"}}
	for _, r := range s.replicas {
		s.start(r)
	}
	t.Cleanup(func() {
		for _, r := range s.replicas {
			if r.sc != nil {
				_ = r.sc.Stop(5 * time.Second)
			}
		}
		// Every process of every replica ran with client-go's cache
		// mutation detector when `make test` turned it on.
		logs, _ := filepath.Glob(filepath.Join(s.dir, "sidecar-*.log"))
		for _, l := range logs {
			e2e.CheckLog(t, l)
		}
	})
	s.waitLeader("no sidecar replica became leader", nil)

	st := stats{created: cfg.static, static: cfg.static}
	s.workload(cfg, rng, seed, rec, order, &st)
	t.Logf("workload done: %d claims created, %d deleted; waiting for convergence", st.created, st.deleted)

	// Let every replica run, then wait until the claims, PVs and driver
	// volumes settle, and check the final state.
	testutil.Eventually(t, time.Minute, "replicas not running", func(context.Context) (bool, error) {
		s.supervise()
		return s.replicas[0].running() && s.replicas[1].running(), nil
	})
	final := s.waitConverged(cfg.converge)

	// Catch the recorder up with a marker write, then check the history.
	marker := testutil.NewPVC(leaseNS, "history-marker").Class("").RV("").Obj()
	marker, err = s.c.CoreV1().PersistentVolumeClaims(leaseNS).Create(ctx, marker, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	markerRev, err := ParseRevision(marker.ResourceVersion)
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, time.Minute, "the watch history did not catch up", func(context.Context) (bool, error) {
		return rec.LastRevision() >= markerRev, nil
	})
	stopRec()
	records := rec.Records()
	history := CheckHistory(records)
	st.historyChecks++
	if len(history) > 0 {
		t.Errorf("history invariants broken:\n%s", formatViolations(history))
	}
	for _, r := range s.replicas {
		s.noteIdentity(r)
	}
	s.scanLogs()
	s.summary(st, seed, final, records, rec, history)
}

// createStatic creates cfg.static volumes in the driver, a Retain PV for
// each, and a claim of class "chaos-static" (no StorageClass object) for
// each, which the binder binds; every second claim is deleted during the
// run.
func (s *stack) createStatic(cfg config, rng *rand.Rand) []*plan {
	t, ctx := s.t, s.t.Context()
	var order []*plan
	for i := range cfg.static {
		name := fmt.Sprintf("static-%03d", i)
		s.createStaticPV("chaos-"+name, s.createStaticVolume(name))
		p := &plan{name: name}
		if i%2 == 1 {
			p.deleteAt = time.Now().Add(time.Duration(5+rng.IntN(30)) * time.Second)
		}
		claim := testutil.NewPVC(claimNS, name).Class("chaos-static").RV("").Obj()
		if _, err := s.c.CoreV1().PersistentVolumeClaims(claimNS).Create(ctx, claim, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		order = append(order, p)
	}

	return order
}

// workload creates and deletes claims and injects the faults of the
// schedule as claims get created, until every claim was created and every
// planned deletion done. It checks the history every 10 seconds and
// returns early when an invariant is broken.
func (s *stack) workload(cfg config, rng *rand.Rand, seed uint64, rec *Recorder, order []*plan, st *stats) {
	t, ctx := s.t, s.t.Context()
	events := schedule(cfg, rng)
	t.Logf("chaos schedule (at claims created): %v", events)
	nextCreate, lastCheck := time.Now(), time.Now()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	dynamic := 0
	for {
		s.supervise()
		for len(events) > 0 && events[0].at <= dynamic {
			s.inject(events[0].kind, rng, st, seed)
			events = events[1:]
		}
		now := time.Now()
		live := 0 // claims still to be deleted; survivors do not count
		for _, p := range order {
			if !p.deleted && !p.deleteAt.IsZero() {
				live++
			}
		}
		if dynamic < cfg.claims && live < cfg.maxLive && !now.Before(nextCreate) {
			p := &plan{name: fmt.Sprintf("c-%04d", dynamic)}
			class := "chaos-delete"
			if rng.IntN(100) < 15 {
				class = "chaos-retain"
			}
			switch x := rng.IntN(100); {
			case x < 10: // survives
			case x < 30:
				p.inFlight = true
				p.deleteAt = now.Add(time.Duration(100+rng.IntN(1100)) * time.Millisecond)
			default:
				p.deleteAt = now.Add(cfg.lifetime[0] + time.Duration(rng.Int64N(int64(cfg.lifetime[1]-cfg.lifetime[0]))))
			}
			claim := testutil.NewPVC(claimNS, p.name).Class(class).RV("").Obj()
			if _, err := s.c.CoreV1().PersistentVolumeClaims(claimNS).Create(ctx, claim, metav1.CreateOptions{}); err == nil {
				order = append(order, p)
				dynamic++
				st.created++
				if class == "chaos-retain" {
					st.retainClaims++
				}
			}
			nextCreate = now.Add(cfg.createEvery)
		}
		pending := false
		for _, p := range order {
			if p.deleted || p.deleteAt.IsZero() {
				continue
			}
			if now.Before(p.deleteAt) {
				pending = true
				continue
			}
			err := s.c.CoreV1().PersistentVolumeClaims(claimNS).Delete(ctx, p.name, metav1.DeleteOptions{})
			if err == nil || apierrors.IsNotFound(err) {
				p.deleted = true
				st.deleted++
				if p.inFlight {
					st.inFlightDeletes++
				}
			} else {
				pending = true // kube-apiserver restarting: try again
			}
		}
		if time.Since(lastCheck) > 10*time.Second {
			lastCheck = time.Now()
			st.historyChecks++
			if vs := CheckHistory(rec.Records()); len(vs) > 0 {
				t.Errorf("invariants broken during the run:\n%s", formatViolations(vs))
				return
			}
		}
		if dynamic >= cfg.claims && !pending && len(events) == 0 {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("test context ended: %v", ctx.Err())
		case <-tick.C:
		}
	}
}

// schedule spreads the faults over the run, by claims created.
func schedule(cfg config, rng *rand.Rand) []chaosEvent {
	var evs []chaosEvent
	at := func(lo, hi float64) int { return int(float64(cfg.claims) * (lo + rng.Float64()*(hi-lo))) }
	for range cfg.kills {
		evs = append(evs, chaosEvent{at(0.05, 0.9), "sidecar-kill"})
	}
	for range cfg.leaderKills {
		evs = append(evs, chaosEvent{at(0.1, 0.9), "leader-kill"})
	}
	for range cfg.apiRestarts {
		evs = append(evs, chaosEvent{at(0.4, 0.6), "apiserver-restart"})
	}
	for range cfg.drvRestart {
		evs = append(evs, chaosEvent{at(0.3, 0.8), "driver-restart"})
	}
	sort.SliceStable(evs, func(i, j int) bool { return evs[i].at < evs[j].at })
	return evs
}

// inject runs one fault.
func (s *stack) inject(kind string, rng *rand.Rand, st *stats, seed uint64) {
	t := s.t
	ctx := t.Context()
	restartDelay := time.Duration(rng.IntN(2000)) * time.Millisecond
	switch kind {
	case "sidecar-kill":
		var r *replica
		testutil.Eventually(t, time.Minute, "no running replica to kill", func(context.Context) (bool, error) {
			s.supervise()
			var running []*replica
			for _, r := range s.replicas {
				if r.running() {
					running = append(running, r)
				}
			}
			if len(running) > 0 {
				r = running[rng.IntN(len(running))]
			}
			return r != nil, nil
		})
		if s.leader(ctx) == r {
			st.leaderKillsOfSidecarKills++
		}
		s.kill(r, restartDelay)
		st.sidecarKills++
	case "leader-kill":
		l := s.waitLeader("no leader to kill", nil)
		killed, process := l.sc, l.process()
		start := time.Now()
		s.kill(l, restartDelay)
		st.leaderKills++
		next := s.waitLeader("no new leader after the leader was killed", killed)
		st.failovers = append(st.failovers, time.Since(start).Round(100*time.Millisecond))
		t.Logf("leader %s killed; %s took over after %s", process, next.process(), st.failovers[len(st.failovers)-1])
	case "apiserver-restart":
		start := time.Now()
		if err := s.cp.RestartAPIServer(ctx); err != nil {
			t.Fatalf("restart kube-apiserver: %v", err)
		}
		st.apiRestarts++
		t.Logf("kube-apiserver restarted in %s", time.Since(start).Round(100*time.Millisecond))
	case "driver-restart":
		// SIGKILL the driver and start it on the same state with the other
		// transient failure code; the sidecars lose their connection.
		if err := s.driver.Kill(); err != nil {
			t.Fatal(err)
		}
		code := "Aborted"
		if strings.Contains(strings.Join(s.driverArgs, " "), "--fail-code=Aborted") {
			code = "Unavailable"
		}
		s.startDriver(code, seed%1_000_000_007+uint64(st.driverRestarts)+2)
		st.driverRestarts++
		t.Logf("driver killed and restarted with --fail-code=%s", code)
	}
}

// waitConverged waits until no claim of the run is being deleted, every
// claim is Bound, every Delete PV belongs to an existing claim, and the
// driver's volumes are the PVs' handles; it returns the final violations
// (none) and what it listed.
func (s *stack) waitConverged(timeout time.Duration) finalState {
	t := s.t
	var fs finalState
	lastLog := time.Now()
	testutil.Eventually(t, timeout, "no convergence", func(ctx context.Context) (bool, error) {
		s.supervise()
		var err error
		fs, err = s.observe(ctx)
		if err != nil {
			return false, nil // kube-apiserver or the driver restarting
		}
		done := len(fs.violations) == 0 && len(fs.unreclaimed) == 0 && len(fs.deleting) == 0
		if !done && time.Since(lastLog) > 30*time.Second {
			lastLog = time.Now()
			t.Logf("not converged yet: %d violations, unreclaimed PVs %v, claims being deleted %v:\n%s", len(fs.violations), fs.unreclaimed, fs.deleting, formatViolations(fs.violations))
		}
		return done, nil
	})
	return fs
}

// finalState is one observation of claims, PVs and driver volumes.
type finalState struct {
	claims      []corev1.PersistentVolumeClaim
	pvs         []corev1.PersistentVolume
	driverIDs   []string
	violations  []Violation
	unreclaimed []string // Delete PVs whose claim is gone
	deleting    []string // claims with a deletionTimestamp, still there
}

func (s *stack) observe(ctx context.Context) (finalState, error) {
	var fs finalState
	claims, err := s.c.CoreV1().PersistentVolumeClaims(claimNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fs, err
	}
	pvs, err := s.c.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fs, err
	}
	if fs.driverIDs, err = s.driverVolumeIDs(ctx); err != nil {
		return fs, err
	}
	fs.claims, fs.pvs = claims.Items, pvs.Items
	fs.violations = CheckFinal(fs.claims, fs.pvs, driverName, fs.driverIDs)
	fs.unreclaimed, fs.deleting = unsettled(fs.claims, fs.pvs)
	return fs, nil
}

// unsettled lists what the invariants of CheckFinal allow but a converged
// run must not have: Delete PVs whose claim is gone (not reclaimed yet), and
// claims being deleted that are still there. A deleted claim that stays
// Bound passes CheckFinal; nothing here (no pod uses a claim, and
// kube-controller-manager's protection controller runs) keeps it for long
// but a finalizer the sidecar failed to remove, and its volume is then
// never reclaimed.
func unsettled(claims []corev1.PersistentVolumeClaim, pvs []corev1.PersistentVolume) (unreclaimed, deleting []string) {
	uids := map[string]bool{}
	for _, c := range claims {
		uids[string(c.UID)] = true
		if c.DeletionTimestamp != nil {
			deleting = append(deleting, fmt.Sprintf("%s/%s (%s, finalizers %v)", c.Namespace, c.Name, c.Status.Phase, c.Finalizers))
		}
	}
	for _, pv := range pvs {
		ref := pv.Spec.ClaimRef
		if pv.Spec.PersistentVolumeReclaimPolicy == corev1.PersistentVolumeReclaimDelete && (ref == nil || !uids[string(ref.UID)]) {
			unreclaimed = append(unreclaimed, fmt.Sprintf("%s (%s)", pv.Name, pv.Status.Phase))
		}
	}
	return unreclaimed, deleting
}

// scanLogs fails on a panic or a data race in any sidecar or driver log.
func (s *stack) scanLogs() {
	logs, _ := filepath.Glob(filepath.Join(s.dir, "sidecar-*.log"))
	logs = append(logs, filepath.Join(s.dir, "driver.log"))
	for _, l := range logs {
		for _, bad := range []string{"panic:", "fatal error:", "DATA RACE"} {
			if n := countLines(l, bad); n > 0 {
				s.t.Errorf("%s: %d lines with %q:\n%s", l, n, bad, controlplane.TailFile(l, 40))
			}
		}
	}
}

func (s *stack) summary(st stats, seed uint64, fs finalState, records []Record, rec *Recorder, history []Violation) {
	drvLog := filepath.Join(s.dir, "driver.log")
	created := countLines(drvLog, `"Created volume"`)
	deleted := countLines(drvLog, `"Deleted volume"`)
	failCreate := countLines(drvLog, "injected failure", "CreateVolume failed on purpose")
	failDelete := countLines(drvLog, "injected failure", "DeleteVolume failed on purpose")
	timeouts, cut := abandonedCalls(drvLog, 2*time.Second)
	// Claims deleted before they were bound, with the in-flight finalizer on.
	deletedUnbound, deletedInFlight := map[string]bool{}, map[string]bool{}
	for _, r := range records {
		if c := r.Claim; c != nil && c.Namespace == claimNS && c.Deleting && !r.Deleted && c.VolumeName == "" {
			deletedUnbound[string(c.UID)] = true
			if c.InFlight {
				deletedInFlight[string(c.UID)] = true
			}
		}
	}
	var exits []string
	for _, r := range s.replicas {
		for _, e := range r.exits {
			exits = append(exits, r.name+": "+e)
		}
	}
	gaps, watchErrs := rec.Gaps()
	retained := 0
	for _, pv := range fs.pvs {
		if pv.Spec.PersistentVolumeReclaimPolicy == corev1.PersistentVolumeReclaimRetain {
			retained++
		}
	}
	boundClaims := slices.DeleteFunc(slices.Clone(fs.claims), func(c corev1.PersistentVolumeClaim) bool { return c.Status.Phase != corev1.ClaimBound })
	var b strings.Builder
	fmt.Fprintf(&b, "chaos summary (seed %d, replay with CHAOS_SEED=%d)\n", seed, seed)
	fmt.Fprintf(&b, "  claims created:            %d (%d static, %d with the Retain class)\n", st.created, st.static, st.retainClaims)
	fmt.Fprintf(&b, "  claims deleted:            %d (%d planned right after creation; %d deleted before bound, %d of them with CreateVolume in flight)\n",
		st.deleted, st.inFlightDeletes, len(deletedUnbound), len(deletedInFlight))
	fmt.Fprintf(&b, "  claims left, all Bound:    %d of %d\n", len(boundClaims), len(fs.claims))
	fmt.Fprintf(&b, "  volumes created/deleted:   %d / %d (driver log); %d left = %d PVs (%d Retain)\n", created, deleted, len(fs.driverIDs), len(fs.pvs), retained)
	fmt.Fprintf(&b, "  sidecar kills (SIGKILL):   %d at random (%d of them hit the leader) + %d leader kills\n", st.sidecarKills, st.leaderKillsOfSidecarKills, st.leaderKills)
	fmt.Fprintf(&b, "  leader kills:              %d, time to a new leader %v\n", st.leaderKills, st.failovers)
	fmt.Fprintf(&b, "  kube-apiserver restarts:   %d\n", st.apiRestarts)
	fmt.Fprintf(&b, "  driver kills+restarts:     %d\n", st.driverRestarts)
	fmt.Fprintf(&b, "  sidecar exits on their own: %d %v\n", len(exits), exits)
	fmt.Fprintf(&b, "  faults injected:           %d CreateVolume + %d DeleteVolume failures (driver log); %d calls timed out after --timeout=2s (injected hangs); %d calls cut short (kills, restarts)\n",
		failCreate, failDelete, timeouts, cut)
	fmt.Fprintf(&b, "  leader identities seen:    %d, each used by one process\n", len(s.identities))
	fmt.Fprintf(&b, "  watch history:             %d records, %d gaps %v\n", len(records), gaps, watchErrs)
	fmt.Fprintf(&b, "  invariant checks:          final state (%s, %s, %s, %s): %d violations; history (%s, %s, %s, %s) checked %d times: %d violations",
		InvClaimBound, InvNoDoubleBind, InvNoLeak, InvNoMissing, len(fs.violations),
		InvNoEarlyRelease, InvNoEarlyDelete, InvRetainKept, InvNoDoubleBind, st.historyChecks, len(history))
	s.t.Log(b.String())
	// The invariants hold vacuously for a path the run never took.
	if len(deletedInFlight) == 0 {
		s.t.Errorf("no claim was seen deleted before it was bound while it carried the in-flight finalizer (%d deletions planned right after creation): the run did not exercise a deletion during CreateVolume", st.inFlightDeletes)
	}
}

func formatViolations(vs []Violation) string {
	var lines []string
	for _, v := range vs {
		lines = append(lines, "  "+v.String())
	}
	return strings.Join(lines, "\n")
}

// quietKlog silences klog in this test process: client-go's watches log
// every failed attempt while kube-apiserver restarts; the summary counts
// the gaps instead. (The sidecars and the driver keep their own logs.)
func quietKlog() {
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	_ = fs.Set("logtostderr", "false")
	_ = fs.Set("stderrthreshold", "FATAL")
	klog.SetOutput(io.Discard)
}

var reCallDuration = regexp.MustCompile(`duration="?([0-9.]+[a-zµ]+)"?`)

// abandonedCalls counts the driver's calls that ended because the caller
// gave up (Canceled or DeadlineExceeded): those that lasted the sidecar's
// timeout (an injected hang, or a latency longer than the timeout) and
// those cut short (the sidecar was killed or the driver stopped).
func abandonedCalls(driverLog string, timeout time.Duration) (timedOut, cut int) {
	b, err := os.ReadFile(driverLog)
	if err != nil {
		return 0, 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		abandoned := strings.Contains(line, "Canceled") || strings.Contains(line, "DeadlineExceeded")
		if !strings.Contains(line, "gRPC call failed") || !abandoned {
			continue
		}
		m := reCallDuration.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		if d, err := time.ParseDuration(m[1]); err == nil && d >= timeout-100*time.Millisecond {
			timedOut++
		} else {
			cut++
		}
	}
	return timedOut, cut
}
