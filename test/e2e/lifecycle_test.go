package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-storage/csi-provisioner/internal/controlplane"
	"github.com/kube-storage/csi-provisioner/internal/e2e"
	"github.com/kube-storage/csi-provisioner/internal/testutil"
)

// stopBound bounds how long the sidecar may take from SIGTERM to its exit
// with nothing to wait for but the calls it cuts short and the events it
// still writes (up to 2 s): far below a pod's default grace period (30 s).
const stopBound = 10 * time.Second

// sigterm stops the sidecar as a rolling update does and checks that it
// exits with status 0 within stopBound.
func (s *stack) sigterm() {
	s.t.Helper()
	start := time.Now()
	if err := s.sidecar.Signal(syscall.SIGTERM); err != nil {
		s.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(s.t.Context(), time.Minute)
	defer cancel()
	if err := s.sidecar.WaitExit(ctx); err != nil {
		s.t.Fatalf("the sidecar did not exit with status 0 after SIGTERM: %v", err)
	}
	if took := time.Since(start); took > stopBound {
		s.t.Errorf("the sidecar took %s to stop after SIGTERM, want at most %s", took, stopBound)
	}
}

// TestStopDuringCreateAndDeleteVolume: the sidecar is stopped (SIGTERM, a
// rolling update) while CreateVolume is in flight, and again while
// DeleteVolume is. Each time it exits at once with status 0 and posts no
// Warning: the call cut short by the stop is no failure of the claim or
// the volume (upstream, which dies of the signal, posts none either). The
// restarted sidecar finishes the work: the claim is Bound, then its volume
// is deleted, and nothing leaks.
func TestStopDuringCreateAndDeleteVolume(t *testing.T) {
	s := newStack(t, stackConfig{driverArgs: []string{"--create-latency=4s", "--delete-latency=4s"}, sidecarArgs: []string{"--timeout=30s"}})
	sc := s.class("stop", nil)
	claim := s.claim(testutil.NewPVC(s.ns, "stop").Class(sc.Name))
	s.waitCreateVolumeStarted(claim)
	s.sigterm()
	if err := s.sidecar.Restart(); err != nil {
		t.Fatal(err)
	}
	_, pv := s.waitBound(claim.Name)

	if err := s.c.CoreV1().PersistentVolumeClaims(s.ns).Delete(t.Context(), claim.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// The driver removes the volume, then answers 4 s later.
	testutil.Eventually(t, 0, "DeleteVolume not started", func(ctx context.Context) (bool, error) {
		vols, err := s.driver.ListVolumes(ctx)
		return len(vols) == 0, err
	})
	s.sigterm()
	if err := s.sidecar.Restart(); err != nil {
		t.Fatal(err)
	}
	s.waitGone(claim.Name, pv.Name)

	// Every event was written before its process exited: the restarted
	// sidecar's ProvisioningSucceeded is there (so the check below looks
	// at written events), and no Warning.
	s.waitEvent(s.ns, string(claim.UID), "Normal", "ProvisioningSucceeded", "")
	for _, e := range append(s.events(s.ns, string(claim.UID)), s.events(metav1.NamespaceDefault, string(pv.UID))...) {
		if strings.HasPrefix(e, "Warning ") {
			t.Errorf("a stop posted %q", e)
		}
	}
}

// TestDriverRestart: the driver container restarts (a crash, or an upgrade
// that may change its name or capabilities). As upstream, the sidecar
// exits with status 1 at its next call, saying "Lost connection to CSI
// driver, exiting", instead of serving the new driver with the
// capabilities it read from the old one; restarted (as the kubelet
// restarts the container), it reads them again and provisions.
func TestDriverRestart(t *testing.T) {
	s := newStack(t, stackConfig{})
	sc := s.class("restart", nil)
	if err := s.driver.Stop(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := s.driver.Restart(t.Context()); err != nil {
		t.Fatal(err)
	}
	claim := s.claim(testutil.NewPVC(s.ns, "after").Class(sc.Name))
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	var exit *exec.ExitError
	if err := s.sidecar.WaitExit(ctx); !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("the sidecar did not exit with status 1 after the driver restarted: %v", err)
	}
	if err := s.sidecar.WaitLog(ctx, "Lost connection to CSI driver, exiting"); err != nil {
		t.Fatal(err)
	}
	if err := s.sidecar.Restart(); err != nil {
		t.Fatal(err)
	}
	_, pv := s.waitBound(claim.Name)
	s.deleteAndWaitGone(claim.Name, pv.Name)
}

// TestStopReleasesLease: with the ReleaseLeaderElectionOnExit gate (the
// chart sets it), a leader stopped by SIGTERM releases its Lease on the
// way out, so the standby replica leads within its retry period instead
// of waiting for the Lease (30 s here) to run out, and provisions. The
// leader exits with status 1, as csi-lib-utils makes upstream's do.
func TestStopReleasesLease(t *testing.T) {
	const leaseDuration = 30 * time.Second
	s := newStack(t, stackConfig{sidecarArgs: []string{
		"--leader-election", "--leader-election-namespace=kube-system", "--feature-gates=ReleaseLeaderElectionOnExit=true",
		"--leader-election-lease-duration=" + leaseDuration.String(), "--leader-election-renew-deadline=20s", "--leader-election-retry-period=1s",
	}})
	b := s.startReplica("b")
	if err := b.WaitLog(t.Context(), "Attempting to acquire leader lease"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := s.sidecar.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	var exit *exec.ExitError
	if err := s.sidecar.WaitExit(ctx); !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Errorf("the leader did not exit with status 1 after SIGTERM: %v", err)
	}
	if err := b.WaitLog(ctx, "Started provisioner controller"); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > leaseDuration/2 {
		t.Errorf("the standby led %s after the leader's SIGTERM: the Lease was not released", took)
	}
	sc := s.class("released", nil)
	claim := s.claim(testutil.NewPVC(s.ns, "released").Class(sc.Name))
	_, pv := s.waitBound(claim.Name)
	s.deleteAndWaitGone(claim.Name, pv.Name)
}

// TestStopWhileWaitingForDriver: a sidecar stopped (SIGTERM: the pod is
// deleted or rolled) while it still waits for the driver's socket stops
// cleanly, with status 0, as after any other stop; it is no failure to
// connect (which, after --csi-connect-timeout, exits with status 1).
func TestStopWhileWaitingForDriver(t *testing.T) {
	cp := controlplane.Need(t, shared)
	bins, err := e2e.Build(t.Context(), "")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	sidecar, err := e2e.StartSidecar(bins.Sidecar, e2e.SidecarConfig{
		Kubeconfig: cp.KubeconfigPath, Socket: filepath.Join(dir, "absent.sock"), LogPath: filepath.Join(dir, "sidecar.log"),
		Args: []string{"-v=5", "--csi-connect-timeout=5m"},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sidecar.Stop(10 * time.Second) })
	// csi-lib-utils logs this at level 5 as it starts to dial.
	if err := sidecar.WaitLog(t.Context(), `"Connecting" csiAddress=`); err != nil {
		t.Fatal(err)
	}
	if err := sidecar.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), stopBound)
	defer cancel()
	if err := sidecar.WaitExit(ctx); err != nil {
		t.Errorf("the sidecar did not exit with status 0 after SIGTERM while waiting for the driver: %v; log:\n%s", err, controlplane.TailFile(sidecar.LogPath, 10))
	}
}

// TestRestartWithBacklog: while the sidecar is down (a rolling update
// between SIGTERM and the new pod), claims are created and a bound claim
// is deleted. The restarted sidecar provisions and binds every new claim
// and releases and deletes the volume of the deleted one.
func TestRestartWithBacklog(t *testing.T) {
	s := newStack(t, stackConfig{})
	sc := s.class("backlog", nil)
	old := s.claim(testutil.NewPVC(s.ns, "old").Class(sc.Name))
	_, oldPV := s.waitBound(old.Name)
	s.sigterm()

	if err := s.c.CoreV1().PersistentVolumeClaims(s.ns).Delete(t.Context(), old.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	s.waitClaimGone(old.Name, "claim "+old.Name+" not deleted while the sidecar was down")
	const n = 5
	claims := make([]string, n)
	for i := range claims {
		claims[i] = s.claim(testutil.NewPVC(s.ns, fmt.Sprint("new-", i)).Class(sc.Name)).Name
	}
	if err := s.sidecar.Restart(); err != nil {
		t.Fatal(err)
	}
	for _, name := range claims {
		s.waitBound(name)
	}
	testutil.Eventually(t, 0, "PV "+oldPV.Name+" of the claim deleted while the sidecar was down not deleted", func(ctx context.Context) (bool, error) {
		_, err := s.c.CoreV1().PersistentVolumes().Get(ctx, oldPV.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), ignoreNotFound(err)
	})
	vols, err := s.driver.VolumeIDs(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(vols) != n {
		t.Errorf("the driver has %d volumes, want %d (one per new claim)", len(vols), n)
	}
}

// TestSecondSignalExitsAtOnce: a leader with ReleaseLeaderElectionOnExit
// stopped while kube-apiserver does not answer waits, after its
// controllers stopped, up to --leader-election-renew-deadline (30 s here)
// to release its Lease. A second SIGTERM (or an operator's second Ctrl-C)
// ends it at once, with status 1, as upstream's signal handler does.
func TestSecondSignalExitsAtOnce(t *testing.T) {
	cp := controlplane.StartForTest(t, controlplane.Config{})
	s := newStack(t, stackConfig{controlPlane: cp, memory: true, sidecarArgs: []string{
		"--leader-election", "--leader-election-namespace=kube-system", "--feature-gates=ReleaseLeaderElectionOnExit=true",
		"--leader-election-lease-duration=40s", "--leader-election-renew-deadline=30s", "--leader-election-retry-period=1s",
	}})
	if err := cp.PauseAPIServer(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cp.ResumeAPIServer() })
	if err := s.sidecar.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := s.sidecar.WaitLog(t.Context(), `"Stopped"`); err != nil {
		t.Fatal(err)
	}
	if err := s.sidecar.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), stopBound)
	defer cancel()
	var exit *exec.ExitError
	if err := s.sidecar.WaitExit(ctx); !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Errorf("after a second SIGTERM the sidecar did not exit with status 1 within %s: %v", stopBound, err)
	}
}

// TestStopWithQueuedClaims: claims still queued for the provisioning
// library when the sidecar stops are not started on the way out. Its
// workers go on taking what is left in the queue after the stop, and the
// library posts a Normal Provisioning event for each claim it starts
// (logged as "Started"), before the provisioning fails for the stop. With
// one worker busy in a slow CreateVolume, the other claims wait in the
// queue; after SIGTERM none of them may be started. The restarted sidecar
// provisions them all.
func TestStopWithQueuedClaims(t *testing.T) {
	s := newStack(t, stackConfig{driverArgs: []string{"--create-latency=4s"}, sidecarArgs: []string{"--timeout=30s", "--worker-threads=1"}})
	sc := s.class("queued", nil)
	first := s.claim(testutil.NewPVC(s.ns, "first").Class(sc.Name))
	s.waitCreateVolumeStarted(first)
	names := []string{first.Name}
	for i := range 5 {
		c := s.claim(testutil.NewPVC(s.ns, fmt.Sprint("queued-", i)).Class(sc.Name))
		names = append(names, c.Name)
		// The binder hands the claim to the provisioner; the library
		// queues it.
		if err := s.sidecar.WaitLog(t.Context(), `"Updated claim" logger="binder" pvc="`+s.ns+"/"+c.Name+`"`); err != nil {
			t.Fatal(err)
		}
	}
	s.sigterm()
	log, err := os.ReadFile(s.sidecar.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range names[1:] {
		if strings.Contains(string(log), `"Started" PVC="`+s.ns+"/"+name+`"`) {
			t.Errorf("claim %s, queued when the sidecar stopped, was started on the way out", name)
		}
	}
	if err := s.sidecar.Restart(); err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		s.waitBound(name)
	}
}
