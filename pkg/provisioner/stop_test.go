package provisioner

import (
	"context"
	"strconv"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	corev1 "k8s.io/api/core/v1"

	"github.com/kube-storage/csi-provisioner/pkg/inflight"
)

// TestStoppedDuringCall: when the sidecar stops (SIGTERM, a rolling
// update) the library's context ends and cuts the CreateVolume or
// DeleteVolume in flight short with Canceled. That is no failure of the
// claim or the volume: Provision and Delete return an IgnoredError, on
// which the library posts no ProvisioningFailed or VolumeFailedDelete
// event. The claim keeps its in-flight finalizer, so the next process
// repeats the create. A failure that is not the stop's keeps its error.
func TestStoppedDuringCall(t *testing.T) {
	for _, stop := range []bool{false, true} {
		t.Run("CreateVolume/stopped="+strconv.FormatBool(stop), func(t *testing.T) {
			claim, class := newClaim("c").Finalizers(inflight.Finalizer).Obj(), newClass().Obj()
			h := newHarness(t, baseCaps(), objs(claim, class))
			ctx, cancel := context.WithCancel(h.ctx)
			defer cancel()
			h.ctx = ctx
			h.driver.onCreate = func(*csi.CreateVolumeRequest) {
				if stop {
					cancel()
				}
			}
			h.driver.createAnswers = []createAnswer{{err: csiErr(codes.Canceled)}}
			pv, _, err := h.provision(claim, class)
			if pv != nil || err == nil {
				t.Fatalf("Provision = %v, %v; want an error", pv, err)
			}
			if isIgnored(err) != stop {
				t.Errorf("Provision error %v: ignored %v, want %v", err, isIgnored(err), stop)
			}
			if !inflight.Has(h.liveClaim(claim)) {
				t.Error("the claim lost its in-flight finalizer")
			}
		})
		t.Run("DeleteVolume/stopped="+strconv.FormatBool(stop), func(t *testing.T) {
			pv := provisionedPV("", "").Obj()
			h := newHarness(t, baseCaps(), objs(pv))
			ctx, cancel := context.WithCancel(h.ctx)
			defer cancel()
			if stop {
				cancel()
			}
			h.driver.deleteErrs = []error{csiErr(codes.Canceled)}
			err := h.p.Delete(ctx, pv)
			if err == nil || isIgnored(err) != stop {
				t.Errorf("Delete = %v, want an error, ignored %v", err, stop)
			}
			if len(h.driver.deleteCalls()) != 1 {
				t.Errorf("DeleteVolume calls = %d, want 1", len(h.driver.deleteCalls()))
			}
		})
	}
}

// TestNothingStartsAfterStop: after the stop the library's workers go on
// taking what is left in their queues (client-go's queues hand out their
// items after ShutDown). The library posts a Normal Provisioning event for
// each claim it starts, before Provision fails: with a backlog a stop
// posted one for every queued claim. ShouldProvision and ShouldDelete turn
// everything down once ctx has ended.
func TestNothingStartsAfterStop(t *testing.T) {
	for _, stop := range []bool{false, true} {
		t.Run("stopped="+strconv.FormatBool(stop), func(t *testing.T) {
			claim, class := newClaim("c").Obj(), newClass().Obj()
			pv := provisionedPV("", "").Phase(corev1.VolumeReleased).Obj()
			h := newHarness(t, baseCaps(), objs(claim, class, pv))
			ctx, cancel := context.WithCancel(h.ctx)
			defer cancel()
			if stop {
				cancel()
			}
			if got := h.p.ShouldProvision(ctx, claim); got == stop {
				t.Errorf("ShouldProvision = %v, want %v", got, !stop)
			}
			if got := h.p.ShouldDelete(ctx, pv); got == stop {
				t.Errorf("ShouldDelete = %v, want %v", got, !stop)
			}
		})
	}
}
