package provisioner

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kube-storage/csi-provisioner/internal/events"
	"github.com/kube-storage/csi-provisioner/internal/testutil"
)

// TestNodeDeploymentWaitsEndWithSidecar checks that the node deployment's
// background waits (the grace period before a declined claim is explained,
// the retries of a failed explanation) end when the sidecar stops: RunGuard
// returns only after they have, none is left waiting on the clock, no event
// is posted afterwards, and a claim declined after the stop starts none.
func TestNodeDeploymentWaitsEndWithSidecar(t *testing.T) {
	const (
		maxDelay = 20 * time.Second
		grace    = 30 * time.Second
	)
	tests := []struct {
		name string
		// failedPost: the grace period passes and the first post fails, so
		// the sidecar stops while a retry waits.
		failedPost bool
	}{
		{name: "stopped during the grace period"},
		{name: "stopped while a failed post waits for its retry", failedPost: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := clocktesting.NewFakeClock(time.Now())
			nd := testNodeDeployment(func(nd *NodeDeployment) { nd.BaseDelay, nd.MaxDelay = 10*time.Second, maxDelay })
			nd.GetCapacity = (&fakeCapacity{resp: &csi.GetCapacityResponse{AvailableCapacity: gi - 1}}).get
			claim, later := newClaim("c").Obj(), newClaim("d").Obj()
			h := newHarness(t, topologyCaps(), append(cluster(), claim, later, newClass().Obj()), WithNodeDeployment(nd), WithClock(clk))
			var mu sync.Mutex
			creates := 0
			h.client.PrependReactor("create", "events", func(k8stesting.Action) (bool, runtime.Object, error) {
				mu.Lock()
				defer mu.Unlock()
				creates++
				if tt.failedPost {
					return true, nil, apierrors.NewInternalError(errors.New("etcd unavailable"))
				}
				return false, nil, nil
			})
			createsSoFar := func() int {
				mu.Lock()
				defer mu.Unlock()
				return creates
			}
			decline := func(c *corev1.PersistentVolumeClaim) {
				t.Helper()
				res := make(chan provisionResult, 1)
				go func() {
					if h.p.ShouldProvision(h.ctx, c) {
						res <- provisionResult{err: errors.New("ShouldProvision = true")}
					}
					res <- provisionResult{}
				}()
				if got := drive(t, clk, res, func() {}, 2*maxDelay, 1); got.err != nil {
					t.Fatal(got.err)
				}
			}

			ctx, stop := context.WithCancel(h.ctx)
			done := make(chan struct{})
			go func() {
				defer close(done)
				h.p.RunGuard(ctx, 1)
			}()
			t.Cleanup(func() { stop(); <-done })
			testutil.Eventually(t, 0, "RunGuard started", func(context.Context) (bool, error) {
				h.p.bg.mu.Lock()
				defer h.p.bg.mu.Unlock()
				return h.p.bg.life != nil, nil
			})

			decline(claim)
			testutil.Eventually(t, 0, "the grace period's wait", func(context.Context) (bool, error) { return clk.HasWaiters(), nil })
			if tt.failedPost {
				clk.Step(grace)
				testutil.Eventually(t, 0, "the failed post and its retry's wait", func(context.Context) (bool, error) {
					return createsSoFar() == 1 && clk.HasWaiters(), nil
				})
			}
			before := createsSoFar()

			stop()
			select {
			case <-done:
			case <-time.After(wait.ForeverTestTimeout):
				t.Fatal("RunGuard did not return after the sidecar stopped")
			}
			if clk.HasWaiters() {
				t.Error("a background wait is still waiting after RunGuard returned")
			}
			decline(later)
			if clk.HasWaiters() {
				t.Error("a claim declined after the stop started a wait")
			}
			clk.Step(events.RefreshInterval)
			if got := createsSoFar(); got != before {
				t.Errorf("event creates = %d after the stop, want %d", got, before)
			}
		})
	}
}
