package e2e

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-storage/csi-provisioner/internal/e2e"
	"github.com/kube-storage/csi-provisioner/internal/testutil"
)

// leaderElectionArgs are the flags of a replica that elects its leader on
// a Lease in ns, with short periods: a new leader takes over about 4 s
// after the old one stops renewing.
func leaderElectionArgs(ns string) []string {
	return []string{
		"--leader-election", "--leader-election-namespace=" + ns,
		"--leader-election-lease-duration=4s", "--leader-election-renew-deadline=3s", "--leader-election-retry-period=1s",
	}
}

// startReplica starts another sidecar process with the stack sidecar's
// flags, logging to sidecar-<name>.log, stopped when the test ends.
func (s *stack) startReplica(name string) *e2e.Sidecar {
	s.t.Helper()
	cfg := s.sidecarCfg
	cfg.LogPath = filepath.Join(s.dir, "sidecar-"+name+".log")
	r, err := e2e.StartSidecar(s.sidecarBin, cfg)
	if err != nil {
		s.t.Fatal(err)
	}
	r.StopAtCleanup(s.t, s.driver)
	return r
}

// leaseName is the Lease of the stack's driver: its name with every
// character but letters, digits and '-' replaced by '-', as upstream.
func (s *stack) leaseName() string {
	return strings.NewReplacer(".", "-").Replace(s.driver.Name)
}

// TestPausedLeaderStopsWriting: the leader is paused (SIGSTOP) past its
// Lease, the other replica takes over and provisions a claim, and the old
// leader is resumed. client-go's elector would let it run on for the renew
// deadline, provisioning the claim again from its stale cache and posting
// its events a second time; it must write nothing and exit at once, with
// status 1 as upstream's csi-lib-utils does when the Lease is lost.
func TestPausedLeaderStopsWriting(t *testing.T) {
	s := newStack(t, stackConfig{sidecarArgs: leaderElectionArgs("kube-system")})
	b := s.startReplica("b")
	if err := b.WaitLog(t.Context(), "Attempting to acquire leader lease"); err != nil {
		t.Fatal(err)
	}
	sc := s.class("p", nil)
	if err := s.sidecar.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	if err := b.WaitLog(t.Context(), "Started provisioner controller"); err != nil {
		t.Fatal(err)
	}
	claim := s.claim(testutil.NewPVC(s.ns, "p").Class(sc.Name))
	_, pv := s.waitBound(claim.Name)
	s.waitEvent(s.ns, string(claim.UID), "Normal", "ProvisioningSucceeded", pv.Name)
	if err := s.sidecar.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := s.sidecar.WaitExit(ctx); err == nil {
		t.Fatal("the resumed leader exited with status 0, want 1")
	} else if ctx.Err() != nil {
		t.Fatal("the resumed leader did not exit")
	}
	log, err := os.ReadFile(s.sidecar.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(log), `"Stopped leading"`) {
		t.Errorf("the resumed leader's log does not say it stopped leading")
	}
	// The resumed leader's cache did not have the claim: had it written
	// anything, its events would be there twice.
	events, err := s.c.CoreV1().Events(s.ns).List(t.Context(), metav1.ListOptions{FieldSelector: "involvedObject.uid=" + string(claim.UID)})
	if err != nil {
		t.Fatal(err)
	}
	count := map[string]int32{}
	for _, e := range events.Items {
		count[e.Reason] += max(e.Count, 1)
	}
	// The event writer skips a Provisioning event still waiting when its
	// ProvisioningSucceeded is queued (README), so that one may be missing.
	if count["Provisioning"] > 1 {
		t.Errorf("%d Provisioning events about the claim, want at most 1 (the resumed leader wrote after it lost the Lease)", count["Provisioning"])
	}
	if count["ProvisioningSucceeded"] != 1 {
		t.Errorf("%d ProvisioningSucceeded events about the claim, want 1 (the resumed leader wrote after it lost the Lease)", count["ProvisioningSucceeded"])
	}
	s.deleteAndWaitGone(claim.Name, pv.Name)
}

// TestStandbyWritesNothing: while another process holds the Lease (here a
// stale holder that never renews within the test), a replica writes
// nothing at all (no finalizer, binding, event or CSIStorageCapacity;
// the claim and the Released volume keep their resource versions), answers
// /readyz and /healthz/leader-election with 200, and says at level 0 which
// process holds the Lease: otherwise nothing explains the Pending claim.
// The Lease is in POD_NAMESPACE, csi-lib-utils' default.
func TestStandbyWritesNothing(t *testing.T) {
	endpoint := "127.0.0.1:" + strconv.Itoa(freePort(t))
	var claim *corev1.PersistentVolumeClaim
	var released *corev1.PersistentVolume
	s := newStack(t, stackConfig{
		sidecarArgs: []string{
			"-v=0", "--leader-election", "--leader-election-lease-duration=4s", "--leader-election-renew-deadline=3s", "--leader-election-retry-period=1s",
			"--enable-capacity", "--capacity-ownerref-level=-1", "--http-endpoint=" + endpoint,
		},
		sidecarEnv: func(s *stack) []string { return []string{"POD_NAMESPACE=" + s.ns, "NAMESPACE=" + s.ns} },
		beforeSidecar: func(s *stack) {
			holder, duration, now := "stale-holder", int32(3600), metav1.NewMicroTime(time.Now())
			if _, err := s.c.CoordinationV1().Leases(s.ns).Create(t.Context(), &coordinationv1.Lease{
				ObjectMeta: metav1.ObjectMeta{Name: s.leaseName()},
				Spec:       coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &duration, AcquireTime: &now, RenewTime: &now},
			}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			sc := s.class("standby", nil)
			claim = s.claim(testutil.NewPVC(s.ns, "pending").Class(sc.Name))
			pv := testutil.NewPV("standby-released-"+s.ns, s.driver.Name).Class(sc.Name).ClaimRef(s.ns, "gone", "0000-gone").
				ReclaimPolicy(corev1.PersistentVolumeReclaimDelete).RV("").Obj()
			created, err := s.c.CoreV1().PersistentVolumes().Create(t.Context(), pv, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				_ = s.c.CoreV1().PersistentVolumes().Delete(context.WithoutCancel(t.Context()), created.Name, metav1.DeleteOptions{})
			})
			released = created
		},
		waitLog: `holder="stale-holder"`,
	})
	log, err := os.ReadFile(s.sidecar.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	if want := `"Not leading: another process holds the leader election Lease; this replica provisions nothing until it holds it" lease="` + s.ns + "/" + s.leaseName() + `"`; !strings.Contains(string(log), want) {
		t.Errorf("the log lacks %s", want)
	}
	for _, path := range []string{"/readyz", "/healthz/leader-election"} {
		testutil.Eventually(t, 0, path+" of the standby not 200", func(ctx context.Context) (bool, error) {
			code, _, err := httpGet(ctx, endpoint, path)
			return code == http.StatusOK, err
		})
	}
	ctx := t.Context()
	got, err := s.c.CoreV1().PersistentVolumeClaims(s.ns).Get(ctx, claim.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.ResourceVersion != claim.ResourceVersion {
		t.Errorf("the standby changed the claim: finalizers %v, annotations %v", got.Finalizers, got.Annotations)
	}
	pv, err := s.c.CoreV1().PersistentVolumes().Get(ctx, released.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pv.ResourceVersion != released.ResourceVersion {
		t.Errorf("the standby changed the PV: phase %s, finalizers %v", pv.Status.Phase, pv.Finalizers)
	}
	events, err := s.c.CoreV1().Events(s.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range events.Items {
		t.Errorf("the standby posted an event: %s %s %s: %s", e.InvolvedObject.Name, e.Type, e.Reason, e.Message)
	}
	caps, err := s.c.StorageV1().CSIStorageCapacities(s.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(caps.Items) != 0 {
		t.Errorf("the standby published %d CSIStorageCapacity objects", len(caps.Items))
	}
	if vols, err := s.driver.ListVolumes(ctx); err != nil || len(vols) != 0 {
		t.Errorf("driver volumes = %v, %v; want none", vols, err)
	}
}

// TestFailoverDuringCreateAndDeleteVolume: the leader is SIGKILLed while
// CreateVolume is in flight, and the new leader while DeleteVolume is; each
// time the other replica takes over and finishes the work, with one volume
// created for the claim and none left behind.
func TestFailoverDuringCreateAndDeleteVolume(t *testing.T) {
	s := newStack(t, stackConfig{
		driverArgs:  []string{"--create-latency=4s", "--delete-latency=4s"},
		sidecarArgs: append([]string{"--timeout=30s"}, leaderElectionArgs("kube-system")...),
	})
	b := s.startReplica("b")
	if err := b.WaitLog(t.Context(), "Attempting to acquire leader lease"); err != nil {
		t.Fatal(err)
	}
	sc := s.class("failover", nil)
	claim := s.claim(testutil.NewPVC(s.ns, "failover").Class(sc.Name))
	s.waitCreateVolumeStarted(claim)
	s.kill()
	if err := b.WaitLog(t.Context(), "Started provisioner controller"); err != nil {
		t.Fatal(err)
	}
	_, pv := s.waitBound(claim.Name)
	if vols, err := s.driver.VolumeIDs(t.Context()); err != nil || len(vols) != 1 || vols[0] != pv.Spec.CSI.VolumeHandle {
		t.Fatalf("driver volumes = %v, %v; want only %s", vols, err, pv.Spec.CSI.VolumeHandle)
	}
	// The first replica comes back as the standby; the new leader is
	// killed once the driver deleted the volume but before it answered.
	if err := s.sidecar.Restart(); err != nil {
		t.Fatal(err)
	}
	if err := s.sidecar.WaitLog(t.Context(), "Attempting to acquire leader lease"); err != nil {
		t.Fatal(err)
	}
	if err := s.c.CoreV1().PersistentVolumeClaims(s.ns).Delete(t.Context(), claim.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 0, "DeleteVolume not started", func(ctx context.Context) (bool, error) {
		vols, err := s.driver.ListVolumes(ctx)
		return len(vols) == 0, err
	})
	if err := b.Kill(); err != nil {
		t.Fatal(err)
	}
	s.waitGone(claim.Name, pv.Name)
}
