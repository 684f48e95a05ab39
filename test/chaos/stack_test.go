package chaos

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-storage/csi-provisioner/internal/controlplane"
	"github.com/kube-storage/csi-provisioner/internal/e2e"
	"github.com/kube-storage/csi-provisioner/internal/testutil"
)

const (
	driverName = "chaos.csi.kube-storage.io"
	// leaseName is csi-lib-utils' name for the driver's Lease: every
	// character but [a-zA-Z0-9-] replaced by "-".
	leaseName = "chaos-csi-kube-storage-io"
	claimNS   = "chaos"
	leaseNS   = "chaos-leader"
)

// stack is the driver and the sidecar replicas of one chaos run.
type stack struct {
	t          *testing.T
	cp         *controlplane.ControlPlane
	c          kubernetes.Interface
	dir        string
	bins       e2e.Binaries
	driver     *e2e.Driver
	driverArgs []string
	replicas   []*replica
	// identities maps each leader identity seen to the log of the process
	// that acquired the lease with it.
	identities map[string]string
	log        func(format string, args ...any)
}

// replica is one sidecar replica, restarted as a new process (with a new
// log file) after each kill or exit.
type replica struct {
	name    string
	sc      *e2e.Sidecar
	starts  int
	restart time.Time // when to start it again; zero while it runs or after an unexpected exit not yet seen
	killed  bool      // its exit was caused by the test
	exits   []string  // unexpected exits: the reason (last log line)
}

var (
	reAcquired  = regexp.MustCompile(`Successfully acquired lease`)
	reNewLeader = regexp.MustCompile(`"New leader detected".*leader="([^"]+)"`)
	reKlogTime  = regexp.MustCompile(`^[IWEF]\d{4} (\d{2}:\d{2}:\d{2}\.\d{6})`)
)

func (r *replica) running() bool {
	if r.sc == nil {
		return false
	}
	select {
	case <-r.sc.Exited():
		return false
	default:
		return true
	}
}

// leadership reads the current process's log: whether it acquired the
// lease, and the identity it reported right after.
func (r *replica) leadership() (acquired bool, identity string) {
	b, err := os.ReadFile(r.sc.LogPath)
	if err != nil {
		return false, ""
	}
	loc := reAcquired.FindIndex(b)
	if loc == nil {
		return false, ""
	}
	// client-go reports the new leader from a goroutine, so the process's
	// own "New leader detected" line comes right before or right after
	// "Successfully acquired lease": the first one after it, or else the
	// last one before it (a leader never sees another leader: it exits).
	if m := reNewLeader.FindSubmatch(b[loc[1]:]); m != nil {
		return true, string(m[1])
	}
	// Only a line written just before the acquisition is the process's
	// own: an older one names the previous leader, and the process may
	// have been killed before it logged its own.
	if all := reNewLeader.FindAllSubmatchIndex(b[:loc[0]], -1); len(all) > 0 {
		last := all[len(all)-1]
		if near(lineTime(b, last[0]), lineTime(b, loc[0]), 100*time.Millisecond) {
			return true, string(b[last[2]:last[3]])
		}
	}
	return true, ""
}

// lineTime returns the klog time of the line that holds offset i, zero if
// it has none.
func lineTime(b []byte, i int) time.Time {
	start := bytes.LastIndexByte(b[:i], '\n') + 1
	m := reKlogTime.FindSubmatch(b[start:])
	if m == nil {
		return time.Time{}
	}
	t, err := time.Parse("15:04:05.000000", string(m[1]))
	if err != nil {
		return time.Time{}
	}
	return t
}

func near(a, b time.Time, d time.Duration) bool {
	if a.IsZero() || b.IsZero() {
		return false
	}
	diff := b.Sub(a)
	return diff >= -d && diff <= d
}

func (s *stack) sidecarArgs() []string {
	return []string{
		"-v=4",
		"--leader-election", "--leader-election-namespace=" + leaseNS,
		"--leader-election-lease-duration=4s", "--leader-election-renew-deadline=3s", "--leader-election-retry-period=1s",
		"--timeout=2s", "--retry-interval-start=500ms", "--retry-interval-max=3s",
		"--binder-resync-period=2s",
	}
}

// start starts a new process of the replica.
func (s *stack) start(r *replica) {
	s.t.Helper()
	r.starts++
	sc, err := e2e.StartSidecar(s.bins.Sidecar, e2e.SidecarConfig{
		Kubeconfig: s.cp.KubeconfigPath, Socket: s.driver.Socket,
		LogPath: filepath.Join(s.dir, fmt.Sprintf("sidecar-%s-%02d.log", r.name, r.starts)),
		Args:    s.sidecarArgs(),
	})
	if err != nil {
		s.t.Fatal(err)
	}
	r.sc, r.restart, r.killed = sc, time.Time{}, false
}

// kill SIGKILLs the replica and schedules its restart after delay.
func (s *stack) kill(r *replica, delay time.Duration) {
	s.t.Helper()
	r.killed = true
	if err := r.sc.Signal(syscall.SIGKILL); err != nil {
		s.t.Fatal(err)
	}
	_ = r.sc.WaitExit(s.t.Context())
	s.noteIdentity(r)
	r.restart = time.Now().Add(delay)
}

// supervise restarts replicas whose restart is due, and schedules the
// restart of replicas that exited on their own (recording why).
func (s *stack) supervise() {
	s.t.Helper()
	for _, r := range s.replicas {
		if r.running() {
			continue
		}
		if !r.killed && r.restart.IsZero() {
			s.noteIdentity(r)
			reason := lastLine(r.sc.LogPath)
			r.exits = append(r.exits, reason)
			s.log("replica %s exited on its own (%v); last lines of %s:\n%s", r.name, r.sc.ExitErr(), r.sc.LogPath, controlplane.TailFile(r.sc.LogPath, 4))
			r.restart = time.Now().Add(500 * time.Millisecond)
		}
		if !time.Now().Before(r.restart) {
			s.start(r)
		}
	}
}

// noteIdentity records the identity with which the replica's process led,
// and fails when another process already led with the same one: each
// process must have its own identity, or two replicas on one host both
// believe they hold the lease.
func (s *stack) noteIdentity(r *replica) {
	acquired, id := r.leadership()
	if !acquired || id == "" {
		return
	}
	if other, ok := s.identities[id]; ok && other != r.sc.LogPath {
		s.t.Errorf("product bug: two sidecar processes led with the same identity %q (%s and %s)", id, other, r.sc.LogPath)
	}
	s.identities[id] = r.sc.LogPath
}

// leader returns the running replica that holds the Lease, or nil. It
// fails the test when two running replicas hold it under one identity.
func (s *stack) leader(ctx context.Context) *replica {
	lease, err := s.c.CoordinationV1().Leases(leaseNS).Get(ctx, leaseName, metav1.GetOptions{})
	if err != nil || lease.Spec.HolderIdentity == nil {
		return nil
	}
	holder := *lease.Spec.HolderIdentity
	var found []*replica
	for _, r := range s.replicas {
		if !r.running() {
			continue
		}
		s.noteIdentity(r)
		if acquired, id := r.leadership(); acquired && id == holder {
			found = append(found, r)
		}
	}
	switch len(found) {
	case 0:
		return nil
	case 1:
		return found[0]
	default:
		s.t.Errorf("product bug: replicas %s and %s both hold the lease as %q", found[0].name, found[1].name, holder)
		return found[0]
	}
}

// waitLeader waits until a running replica holds the lease with another
// process than exclude (nil: any) and returns it.
func (s *stack) waitLeader(msg string, exclude *e2e.Sidecar) *replica {
	s.t.Helper()
	var l *replica
	testutil.Eventually(s.t, 2*time.Minute, msg, func(ctx context.Context) (bool, error) {
		s.supervise()
		l = s.leader(ctx)
		return l != nil && l.sc != exclude, nil
	})
	return l
}

// process names the replica's current process, as in its log file name.
func (r *replica) process() string { return fmt.Sprintf("%s-%02d", r.name, r.starts) }

// startDriver starts (or, with the same directory, restarts) the driver
// with the fault flags and the given failure code and seed.
func (s *stack) startDriver(failCode string, seed uint64) {
	s.t.Helper()
	s.driverArgs = []string{
		"--create-latency=1s", "--delete-latency=300ms",
		"--fail-create-rate=0.3", "--fail-delete-rate=0.3", "--fail-code=" + failCode,
		"--hang-create-rate=0.05", "--hang-delete-rate=0.05",
		fmt.Sprintf("--fault-seed=%d", seed),
	}
	d, err := e2e.StartDriver(s.t.Context(), s.bins.Driver, e2e.DriverConfig{Dir: s.dir, Name: driverName, Args: s.driverArgs})
	if err != nil {
		s.t.Fatal(err)
	}
	s.driver = d
}

// createStaticVolume creates a volume in the driver directly, as an
// administrator would before writing a static PV; injected faults are
// retried (CreateVolume is idempotent by name).
func (s *stack) createStaticVolume(name string) string {
	s.t.Helper()
	var id string
	testutil.Eventually(s.t, time.Minute, "create static volume "+name, func(ctx context.Context) (bool, error) {
		ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		var err error
		if id, err = s.driver.CreateVolume(ctx, name); err != nil {
			return false, nil // an injected fault or a hang: try again
		}
		return true, nil
	})
	return id
}

// createStaticPV writes a Retain PV of class "chaos-static" for a volume.
func (s *stack) createStaticPV(name, handle string) {
	s.t.Helper()
	pv := testutil.NewPV(name, driverName).Class("chaos-static").ReclaimPolicy(corev1.PersistentVolumeReclaimRetain).RV("").Obj()
	pv.Status = corev1.PersistentVolumeStatus{}
	pv.Spec.CSI.VolumeHandle = handle
	if _, err := s.c.CoreV1().PersistentVolumes().Create(s.t.Context(), pv, metav1.CreateOptions{}); err != nil {
		s.t.Fatal(err)
	}
}

// driverVolumeIDs lists the driver's volume IDs.
func (s *stack) driverVolumeIDs(ctx context.Context) ([]string, error) {
	return s.driver.VolumeIDs(ctx)
}

func lastLine(path string) string {
	return strings.TrimSpace(controlplane.TailFile(path, 1))
}

// countLines counts the lines of the file that contain every one of subs.
func countLines(path string, subs ...string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	n := 0
	for _, line := range strings.Split(string(b), "\n") {
		all := true
		for _, s := range subs {
			if !strings.Contains(line, s) {
				all = false
				break
			}
		}
		if all {
			n++
		}
	}
	return n
}
