package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

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
	for _, reason := range []string{"Provisioning", "ProvisioningSucceeded"} {
		if count[reason] != 1 {
			t.Errorf("%d %s events about the claim, want 1 (the resumed leader wrote after it lost the Lease)", count[reason], reason)
		}
	}
	s.deleteAndWaitGone(claim.Name, pv.Name)
}
