package integration

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/kube-storage/csi-provisioner/internal/controlplane"
	"github.com/kube-storage/csi-provisioner/internal/e2e"
	"github.com/kube-storage/csi-provisioner/internal/testutil"
)

// TestEventsSurviveAPIServerOutage: an event the sidecar posts while
// kube-apiserver is down is written once it is back (client-go's event
// writer gives up on connection errors; ours retries, see internal/events).
// The driver answers a claim's CreateVolume with INVALID_ARGUMENT (an access
// mode it does not support) 8 s after the call; the API server is stopped
// while the call runs, so the ProvisioningFailed event that explains the
// Pending claim is posted with no API server to take it. The provisioning
// library does not try an infeasible request again for
// --retry-interval-max (5 minutes), so no later attempt posts the event
// again: the one on the claim is the one posted during the outage.
func TestEventsSurviveAPIServerOutage(t *testing.T) {
	s, claim := startRefusedCreate(t, "outage", 8*time.Second, false)
	e, cp, ctx := s.e, s.e.cp, t.Context()
	if err := cp.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	if err := s.sidecar.WaitLog(ctx, `"Cannot write event, will retry"`); err != nil {
		t.Fatal(err)
	}
	if err := cp.StartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	e.waitEvent(claim.UID, "Warning", "ProvisioningFailed", "infeasible error. Retries will be delayed")
	if c := e.getClaim(claim.Name); c.Spec.VolumeName != "" {
		t.Errorf("claim bound to %s, want Pending", c.Spec.VolumeName)
	}
	testutil.Eventually(t, 0, "the driver has volumes", func(ctx context.Context) (bool, error) {
		ids, err := s.driver.VolumeIDs(ctx)
		return len(ids) == 0, err
	})
}

// TestEventsWrittenAtStop: an event queued when the sidecar is stopped
// (SIGTERM, as in a rolling update) is still written: the sidecar stops its
// controllers, then goes on writing its queued events for up to 2 s before
// it exits. The driver answers CreateVolume with INVALID_ARGUMENT after
// 3 s; kube-apiserver is paused (SIGSTOP: requests hang, unanswered) while
// the call runs, so the ProvisioningFailed event is posted with no answer
// coming. The sidecar is stopped and has logged "Stopped" before the API
// server goes on; the event must then be on the claim, and the sidecar
// must have exited. With --leader-election (the chart's default) the
// leader does the same before it ends the election, after which
// csi-lib-utils exits with status 1, as upstream.
func TestEventsWrittenAtStop(t *testing.T) {
	for _, leaderElection := range []bool{false, true} {
		t.Run(fmt.Sprintf("leader election %v", leaderElection), func(t *testing.T) {
			s, claim := startRefusedCreate(t, "stop", 3*time.Second, leaderElection)
			e, cp, ctx := s.e, s.e.cp, t.Context()
			if err := cp.PauseAPIServer(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cp.ResumeAPIServer() })
			// The library logs each event as it records it, before the
			// sidecar's event writer gets it.
			if err := s.sidecar.WaitLog(ctx, `reason="ProvisioningFailed"`); err != nil {
				t.Fatal(err)
			}
			if err := s.sidecar.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			if err := s.sidecar.WaitLog(ctx, `"Stopped"`); err != nil {
				t.Fatal(err)
			}
			if err := cp.ResumeAPIServer(); err != nil {
				t.Fatal(err)
			}
			e.waitEvent(claim.UID, "Warning", "ProvisioningFailed", "infeasible error. Retries will be delayed")
			waitCtx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			err := s.sidecar.WaitExit(waitCtx)
			if !leaderElection && err != nil {
				t.Errorf("the sidecar did not exit cleanly after SIGTERM: %v", err)
			}
			var exit *exec.ExitError
			if leaderElection && (!errors.As(err, &exit) || exit.ExitCode() != 1) {
				t.Errorf("the leader did not exit with status 1 (csi-lib-utils) after SIGTERM: %v", err)
			}
		})
	}
}

// startRefusedCreate starts a control plane of its own and a stack whose
// driver answers CreateVolume for a ReadWriteMany claim with
// INVALID_ARGUMENT (it does not support that access mode) after latency,
// creates such a claim of a new class named after class, and returns once
// the provisioning library has taken the claim: it logs "Started" just
// before CreateVolume.
func startRefusedCreate(t *testing.T, class string, latency time.Duration, leaderElection bool) (*stack, *corev1.PersistentVolumeClaim) {
	t.Helper()
	e := newEnv(t, controlplane.StartForTest(t, controlplane.Config{}))
	args := []string{"-v=4", "--timeout=30s"}
	if leaderElection {
		args = append(args, "--leader-election", "--leader-election-namespace="+e.ns)
	}
	s := e.startStackWith(stackConfig{
		driver:      e2e.DriverConfig{Args: []string{"--create-latency=" + latency.String()}},
		sidecarArgs: args,
	})
	sc := e.createClass(testutil.NewSC(e.name(class), e.driver))
	claim := e.createClaim(testutil.NewPVC(e.ns, "rwx").Class(sc.Name).AccessModes(corev1.ReadWriteMany))
	if err := s.sidecar.WaitLog(t.Context(), `"Started" PVC="`+e.ns+`/rwx"`); err != nil {
		t.Fatal(err)
	}
	return s, claim
}
