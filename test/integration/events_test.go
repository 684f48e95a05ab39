package integration

import (
	"context"
	"testing"

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
	cp := controlplane.StartForTest(t, controlplane.Config{})
	e := newEnv(t, cp)
	s := e.startStackWith(stackConfig{
		driver:      e2e.DriverConfig{Args: []string{"--create-latency=8s"}},
		sidecarArgs: []string{"-v=4", "--timeout=30s"},
	})
	sc := e.createClass(testutil.NewSC(e.name("outage"), e.driver))
	claim := e.createClaim(testutil.NewPVC(e.ns, "rwx").Class(sc.Name).AccessModes(corev1.ReadWriteMany))
	ctx := t.Context()
	// The provisioning library logs "Started" as it takes the claim, just
	// before CreateVolume.
	if err := s.sidecar.WaitLog(ctx, `"Started" PVC="`+e.ns+`/rwx"`); err != nil {
		t.Fatal(err)
	}
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
