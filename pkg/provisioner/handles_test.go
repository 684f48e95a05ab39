package provisioner

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/sig-storage-lib-external-provisioner/v13/controller"

	"github.com/kube-storage/csi-provisioner/internal/testutil"
	"github.com/kube-storage/csi-provisioner/pkg/inflight"
)

// pvWithHandle is a Bound PV of driver named name whose volume handle is
// handle.
func pvWithHandle(name, driver, handle string) *corev1.PersistentVolume {
	pv := testutil.NewPV(name, driver).Class(testClass).ClaimRef(testNS, "other", "uid-other").Phase(corev1.VolumeBound).Obj()
	pv.Spec.CSI.VolumeHandle = handle
	return pv
}

// TestDuplicateVolumeHandle covers a driver that answers CreateVolume with
// the ID of a volume another PV of the driver already records (it ignored
// the name, or derives IDs from something that is not unique): recording
// it would give two claims one volume, and deleting either claim would
// delete the other's data. The volume is neither recorded nor deleted
// (not even when it is also too small), and the claim keeps its in-flight
// finalizer.
func TestDuplicateVolumeHandle(t *testing.T) {
	tests := []struct {
		name     string
		existing []runtime.Object
		// before is a claim provisioned first by the same process, whose
		// PV the informer has not seen yet.
		before bool
		// deleteBefore deletes the first claim's volume before the claim
		// is provisioned (a driver may reuse IDs of deleted volumes).
		deleteBefore bool
		capacity     int64
		wantState    controller.ProvisioningState
		wantErr      string
	}{
		{
			name: "held by another PV of the driver", existing: objs(pvWithHandle("pv-other", testDriver, "vol-1")),
			wantState: controller.ProvisioningInBackground,
			wantErr:   `CSI driver ` + testDriver + ` returned volume ID "vol-1" for volume pvc-uid-c, but PersistentVolume pv-other already records that volume`,
		},
		{
			name: "held by another PV and smaller than requested: not deleted", existing: objs(pvWithHandle("pv-other", testDriver, "vol-1")),
			capacity: 1024, wantState: controller.ProvisioningInBackground, wantErr: "PersistentVolume pv-other already records that volume",
		},
		{
			name: "returned for a claim provisioned a moment before", before: true,
			wantState: controller.ProvisioningInBackground, wantErr: "PersistentVolume pvc-uid-first already records that volume",
		},
		{name: "reused after the first claim's volume was deleted", before: true, deleteBefore: true, wantState: controller.ProvisioningFinished},
		{name: "held by a PV of another driver", existing: objs(pvWithHandle("pv-other", "other.example.com", "vol-1")), wantState: controller.ProvisioningFinished},
		{name: "held by the claim's own PV (a retry)", existing: objs(pvWithHandle("pvc-uid-c", testDriver, "vol-1")), wantState: controller.ProvisioningFinished},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			claim, first, class := newClaim("c").Finalizers(inflight.Finalizer).Obj(), newClaim("first").Finalizers(inflight.Finalizer).Obj(), newClass().Obj()
			h := newHarness(t, baseCaps(), append(tt.existing, claim, first, class))
			answer := createAnswer{vol: &csi.Volume{VolumeId: "vol-1", CapacityBytes: gi}}
			if tt.capacity != 0 {
				answer.vol.CapacityBytes = tt.capacity
			}
			if tt.before {
				h.driver.createAnswers = []createAnswer{answer}
				pv, _, err := h.provision(first, class)
				if err != nil || pv == nil {
					t.Fatalf("Provision of the first claim = %v, %v", pv, err)
				}
				if tt.deleteBefore {
					if err := h.p.Delete(h.ctx, pv); err != nil {
						t.Fatalf("Delete of the first claim's volume: %v", err)
					}
					h.driver.deletes = nil
				}
			}
			h.driver.createAnswers = []createAnswer{answer}

			pv, state, err := h.provision(claim, class)
			if state != tt.wantState || !strings.Contains(errString(err), tt.wantErr) || (tt.wantErr == "") != (err == nil) {
				t.Fatalf("Provision = %v, %q; want %v, %q", state, errString(err), tt.wantState, tt.wantErr)
			}
			if (pv == nil) != (tt.wantErr != "") {
				t.Errorf("PV = %v, want one only without an error", pv)
			}
			if n := len(h.driver.deleteCalls()); n != 0 {
				t.Errorf("DeleteVolume calls = %d, want none: the volume is another PV's", n)
			}
			if !inflight.Has(h.liveClaim(claim)) {
				t.Error("the claim lost its in-flight finalizer")
			}
		})
	}
}

// TestHandleCountsFollowTheInformer: the counts behind handleHolder follow
// the PVs of the driver as the informer adds, updates and deletes them,
// so that a volume handle is held exactly while a PV of this driver
// records it, and a PV never holds its own handle against itself.
func TestHandleCountsFollowTheInformer(t *testing.T) {
	h := newHarness(t, baseCaps(), nil)
	pvs := h.client.CoreV1().PersistentVolumes()
	holder := func() string { return h.p.handleHolder("vol-1", "pv-new", nil) }
	waitHolder := func(want string) {
		t.Helper()
		err := wait.PollUntilContextTimeout(t.Context(), time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
			return holder() == want, nil
		})
		if err != nil {
			t.Fatalf("handleHolder = %q, want %q", holder(), want)
		}
	}

	if _, err := pvs.Create(t.Context(), pvWithHandle("pv-other-driver", "other.example.com", "vol-1"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	a, err := pvs.Create(t.Context(), pvWithHandle("pv-a", testDriver, "vol-1"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	waitHolder("pv-a")
	if got := h.p.handleHolder("vol-1", "pv-a", nil); got != "" {
		t.Errorf("handleHolder of pv-a's own handle = %q, want none", got)
	}
	// An update (here the claimRef) counts nothing twice.
	a.Spec.ClaimRef = nil
	if _, err := pvs.Update(t.Context(), a, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := pvs.Create(t.Context(), pvWithHandle("pv-b", testDriver, "vol-1"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitHolder("pv-a") // the first by name of two
	// Once the informer has pv-b, it holds pv-a's handle: a PV never
	// holds a handle against itself, even when it is first by name.
	err = wait.PollUntilContextTimeout(t.Context(), time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return h.p.handleHolder("vol-1", "pv-a", nil) == "pv-b", nil
	})
	if err != nil {
		t.Errorf("handleHolder of pv-a's handle = %q, want pv-b", h.p.handleHolder("vol-1", "pv-a", nil))
	}
	if err := pvs.Delete(t.Context(), "pv-a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitHolder("pv-b")
	if err := pvs.Delete(t.Context(), "pv-b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitHolder("")
	h.p.handles.mu.Lock()
	defer h.p.handles.mu.Unlock()
	if n := len(h.p.handles.counts); n != 0 {
		t.Errorf("%d handle counts left once every PV of the driver is gone, want none", n)
	}
}

// TestPendingHandle: a volume this process recorded holds its handle
// before the informer shows its PV, so that two claims answered with one
// ID at the same time cannot both record it; the record holds only for
// pendingHandleTTL when the informer never shows the PV.
func TestPendingHandle(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	h := newHarness(t, baseCaps(), nil, WithClock(clk))
	if other := h.p.claimHandle("vol-1", "pv-a"); other != "" {
		t.Fatalf("claimHandle for pv-a = %q, want none", other)
	}
	// The informer showing another PV with the handle does not settle
	// pv-a's record.
	h.p.handles.seen("vol-1", "pv-x")
	if other := h.p.claimHandle("vol-1", "pv-b"); other != "pv-a" {
		t.Errorf("claimHandle for pv-b = %q, want pv-a, which recorded the volume first", other)
	}
	if other := h.p.handleHolder("vol-1", "pv-a", nil); other != "" {
		t.Errorf("handleHolder of pv-a's own handle = %q, want none", other)
	}
	clk.Step(pendingHandleTTL)
	if other := h.p.handleHolder("vol-1", "pv-b", nil); other != "" {
		t.Errorf("handleHolder after pendingHandleTTL = %q, want none: the informer never showed pv-a", other)
	}
}

// TestDiscardHoldsTheHandle: a created volume that is deleted again (here
// smaller than requested) is recorded for its PV while DeleteVolume runs,
// so that another claim the driver answers with the same ID at that moment
// takes it for another PV's volume instead of deleting it too, or
// recording it; the record goes once the volume is deleted.
func TestDiscardHoldsTheHandle(t *testing.T) {
	claim, class := newClaim("c").Finalizers(inflight.Finalizer).Obj(), newClass().Obj()
	h := newHarness(t, baseCaps(), objs(claim, class))
	h.driver.createAnswers = []createAnswer{{vol: &csi.Volume{VolumeId: "vol-1", CapacityBytes: 1024}}}
	during := "not called"
	h.driver.onDelete = func(*csi.DeleteVolumeRequest) { during = h.p.handleHolder("vol-1", "pvc-other", nil) }
	if _, state, err := h.provision(claim, class); err == nil || state != controller.ProvisioningInBackground {
		t.Fatalf("Provision = %v, %v; want the volume discarded, in background", state, err)
	}
	if want := h.p.VolumeName(claim); during != want {
		t.Errorf("while DeleteVolume ran, the handle was held by %q, want %q", during, want)
	}
	if after := h.p.handleHolder("vol-1", "pvc-other", nil); after != "" {
		t.Errorf("after the volume was deleted, the handle is held by %q, want none", after)
	}
}
