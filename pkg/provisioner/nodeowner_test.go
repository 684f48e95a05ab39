package provisioner

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8stesting "k8s.io/client-go/testing"
	storagehelpers "k8s.io/component-helpers/storage/volume"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/sig-storage-lib-external-provisioner/v13/controller"

	"github.com/kube-storage/csi-provisioner/internal/testutil"
	"github.com/kube-storage/csi-provisioner/pkg/inflight"
)

// TestNodeDeploymentCheckProvision checks that the binder's check only
// passes for claims selected for this node, so that no other claim gets
// the in-flight finalizer before its node sends CreateVolume.
func TestNodeDeploymentCheckProvision(t *testing.T) {
	class := newClass().Obj()
	h := newHarness(t, topologyCaps(), objs(class), withNode())
	for selected, wantErr := range map[string]bool{thisNode: false, "n1": true, "": true} {
		err := h.p.CheckProvision(h.ctx, selectedFor("c", selected).Obj(), class)
		if (err != nil) != wantErr {
			t.Errorf("CheckProvision(selected %q) = %v, want error %v", selected, err, wantErr)
		}
	}
}

type provisionResult struct {
	pv    *corev1.PersistentVolume
	state controller.ProvisioningState
	err   error
}

// provisionAsync calls Provision as the library would, in a goroutine.
func (h *harness) provisionAsync(ctx context.Context, claim *corev1.PersistentVolumeClaim, class *storagev1.StorageClass) <-chan provisionResult {
	res := make(chan provisionResult, 1)
	opts := controller.ProvisionOptions{StorageClass: class, PVName: h.p.VolumeName(claim), PVC: claim, SelectedNodeName: selectedNodeName(claim)}
	go func() {
		pv, state, err := h.p.Provision(ctx, opts)
		res <- provisionResult{pv: pv, state: state, err: err}
	}()
	return res
}

// selectNode sets claim name's selected-node to node in the fake API
// server, as another node taking it would, and waits until the informer
// has the change.
func (h *harness) selectNode(t *testing.T, name, node string) {
	t.Helper()
	c := h.liveClaim(newClaim(name).Obj())
	metav1.SetMetaDataAnnotation(&c.ObjectMeta, storagehelpers.AnnSelectedNode, node)
	if _, err := h.client.CoreV1().PersistentVolumeClaims(testNS).Update(t.Context(), c, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 0, "the informer sees "+node, func(context.Context) (bool, error) {
		c, err := h.p.claims.PersistentVolumeClaims(testNS).Get(name)
		return err == nil && selectedNodeName(c) == node, nil
	})
}

// fakeCapacity is a scripted GetCapacity that records its requests.
type fakeCapacity struct {
	resp *csi.GetCapacityResponse
	err  error
	reqs []*csi.GetCapacityRequest // read after Provision returned
}

func (f *fakeCapacity) get(_ context.Context, req *csi.GetCapacityRequest) (*csi.GetCapacityResponse, error) {
	f.reqs = append(f.reqs, proto.Clone(req).(*csi.GetCapacityRequest))
	return f.resp, f.err
}

// TestNodeDeploymentBecomeOwner covers how a node takes an immediate-binding
// claim: wait (on a fake clock), capacity check, selected-node update, and
// the cases in which it gives the claim up.
func TestNodeDeploymentBecomeOwner(t *testing.T) {
	const (
		baseDelay = 10 * time.Second
		maxDelay  = 20 * time.Second
		poll      = baseDelay / 100
	)
	plenty := &csi.GetCapacityResponse{AvailableCapacity: 10 * gi}
	tests := []struct {
		name string
		// apiClaim is the claim in the API; Provision gets it without
		// selected-node, as the library's older copy.
		apiClaim *corev1.PersistentVolumeClaim
		capacity *fakeCapacity // nil: the driver lacks GET_CAPACITY
		setup    func(h *harness)
		// during runs once Provision waits on the clock; then the clock
		// moves by step, at most maxSteps times (0: until it returns).
		during    func(t *testing.T, h *harness, cancel context.CancelFunc)
		step      time.Duration
		maxSteps  int
		wantState controller.ProvisioningState
		wantErr   string // substring; "" for success
		wantIgn   bool
		// wantWrites are this node's claim updates.
		wantWrites   int
		wantSelected string // on the live claim afterwards
		wantCreate   bool
		wantCapCalls int
		wantDelay    bool // the claim's delay is still counted
	}{
		{
			name: "wins: claim updated and provisioned with this node's topology", apiClaim: newClaim("c").Obj(),
			capacity: &fakeCapacity{resp: plenty}, wantState: controller.ProvisioningFinished,
			wantWrites: 2, wantSelected: thisNode, wantCreate: true, wantCapCalls: 1,
		},
		{
			name: "wins without GET_CAPACITY", apiClaim: newClaim("c").Obj(), wantState: controller.ProvisioningFinished,
			wantWrites: 2, wantSelected: thisNode, wantCreate: true,
		},
		{
			name: "another node takes it during the delay", apiClaim: newClaim("c").Obj(), capacity: &fakeCapacity{resp: plenty},
			during: func(t *testing.T, h *harness, _ context.CancelFunc) {
				h.selectNode(t, "c", "n1")
				h.client.ClearActions()
			},
			step: poll, maxSteps: 1, // one poll interval, far less than the delay
			wantState: controller.ProvisioningFinished, wantErr: "node n1 took the claim", wantIgn: true, wantSelected: "n1",
		},
		{
			name: "selected for another node before the first wait", apiClaim: selectedFor("c", "n1").Obj(), capacity: &fakeCapacity{resp: plenty},
			wantState: controller.ProvisioningFinished, wantErr: "node n1 took the claim", wantIgn: true, wantSelected: "n1",
		},
		{
			name: "not enough capacity: no update", apiClaim: newClaim("c").Obj(),
			capacity:  &fakeCapacity{resp: &csi.GetCapacityResponse{AvailableCapacity: gi - 1}},
			wantState: controller.ProvisioningNoChange, wantErr: "node n9 has not enough capacity: 1073741823 bytes available, 1073741824 requested",
			wantIgn: true, wantCapCalls: 1, wantDelay: true,
		},
		{
			name: "maximum volume size too small: no update", apiClaim: newClaim("c").Obj(),
			capacity:  &fakeCapacity{resp: &csi.GetCapacityResponse{AvailableCapacity: 10 * gi, MaximumVolumeSize: wrapperspb.Int64(gi / 2)}},
			wantState: controller.ProvisioningNoChange, wantErr: "maximum volume size 536870912 bytes", wantIgn: true, wantCapCalls: 1, wantDelay: true,
		},
		{
			// As upstream: a capacity check that fails does not keep the
			// claim from being taken (every node would decline it until
			// the claim changed); CreateVolume then answers.
			name: "GetCapacity fails: taken anyway", apiClaim: newClaim("c").Obj(), capacity: &fakeCapacity{err: errors.New("driver busy")},
			wantState: controller.ProvisioningFinished, wantWrites: 2, wantSelected: thisNode, wantCreate: true, wantCapCalls: 1,
		},
		{
			name: "update conflict: another writer won", apiClaim: newClaim("c").Obj(), capacity: &fakeCapacity{resp: plenty},
			setup: func(h *harness) {
				h.client.PrependReactor("update", "persistentvolumeclaims", func(k8stesting.Action) (bool, runtime.Object, error) {
					return true, nil, apierrors.NewConflict(schema.GroupResource{Resource: "persistentvolumeclaims"}, "c", errors.New("stale"))
				})
			},
			wantState: controller.ProvisioningNoChange, wantErr: "the claim changed before node n9 could take it", wantIgn: true,
			wantWrites: 1, wantCapCalls: 1, wantDelay: true,
		},
		{
			// The claim now has a selected node: no space there means
			// rescheduling (the library removes selected-node).
			name: "taken, then the driver has no space: rescheduled", apiClaim: newClaim("c").Obj(),
			setup:     func(h *harness) { h.driver.createAnswers = []createAnswer{{err: csiErr(codes.ResourceExhausted)}} },
			wantState: controller.ProvisioningReschedule, wantErr: "mock ResourceExhausted",
			wantWrites: 2, wantSelected: thisNode, wantCreate: true, wantDelay: true,
		},
		{
			name: "update fails otherwise: an error, retried", apiClaim: newClaim("c").Obj(),
			setup: func(h *harness) {
				h.failOn("update", "persistentvolumeclaims", apierrors.NewInternalError(errors.New("etcd down")))
			},
			wantState: controller.ProvisioningNoChange, wantErr: "set volume.kubernetes.io/selected-node on claim ns/c", wantWrites: 1, wantDelay: true,
		},
		{
			name: "an earlier call won: no wait, no second write", apiClaim: selectedFor("c", thisNode).Obj(), capacity: &fakeCapacity{resp: plenty},
			maxSteps: -1, wantState: controller.ProvisioningFinished, wantWrites: 1, wantSelected: thisNode, wantCreate: true,
		},
		{
			// The sidecar stops: no failure for the library to post.
			name: "context done during the wait", apiClaim: newClaim("c").Obj(), capacity: &fakeCapacity{resp: plenty},
			during:    func(_ *testing.T, _ *harness, cancel context.CancelFunc) { cancel() },
			maxSteps:  -1,
			wantState: controller.ProvisioningNoChange, wantErr: "stopped while provisioning: wait before taking claim ns/c: context canceled", wantIgn: true, wantDelay: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := clocktesting.NewFakeClock(time.Now())
			nd := testNodeDeployment(func(nd *NodeDeployment) { nd.BaseDelay, nd.MaxDelay = baseDelay, maxDelay })
			if tt.capacity != nil {
				nd.GetCapacity = tt.capacity.get
			}
			// GetCapacity gets the parameters without the sidecar's keys.
			class := newClass().Param("p", "v").Param("csi.storage.k8s.io/fstype", "xfs").Obj()
			h := newHarness(t, topologyCaps(), append(cluster(), tt.apiClaim, class), WithNodeDeployment(nd), WithClock(clk))
			if tt.setup != nil {
				tt.setup(h)
			}
			libCopy := tt.apiClaim.DeepCopy()
			delete(libCopy.Annotations, storagehelpers.AnnSelectedNode)
			ctx, cancel := context.WithCancel(h.ctx)
			defer cancel()

			res := h.provisionAsync(ctx, libCopy, class)
			got := drive(t, clk, res, func() {
				if tt.during != nil {
					tt.during(t, h, cancel)
				}
			}, cmpOr(tt.step, 2*maxDelay), tt.maxSteps)

			if got.state != tt.wantState || isIgnored(got.err) != tt.wantIgn ||
				(tt.wantErr == "") != (got.err == nil) || !strings.Contains(errString(got.err), tt.wantErr) {
				t.Fatalf("Provision = %v, %v (ignored %v); want %v, %q (ignored %v)", got.state, got.err, isIgnored(got.err), tt.wantState, tt.wantErr, tt.wantIgn)
			}
			if writes := countOf(h.writes(), "update persistentvolumeclaims"); writes != tt.wantWrites {
				t.Errorf("claim updates = %d (%q), want %d", writes, h.writes(), tt.wantWrites)
			}
			live := h.liveClaim(tt.apiClaim)
			if got := selectedNodeName(live); got != tt.wantSelected {
				t.Errorf("live selected-node = %q, want %q", got, tt.wantSelected)
			}
			creates := h.driver.createCalls()
			if (len(creates) == 1) != tt.wantCreate || len(creates) > 1 {
				t.Fatalf("CreateVolume calls = %d, want call %v", len(creates), tt.wantCreate)
			}
			if tt.wantCreate {
				want := &csi.TopologyRequirement{Requisite: topos(thisTopology), Preferred: topos(thisTopology)}
				if req := creates[0].GetAccessibilityRequirements(); !proto.Equal(req, want) {
					t.Errorf("accessibility requirements = %v, want %v (this node's only)", req, want)
				}
				if !inflight.Has(live) {
					t.Error("no in-flight finalizer on the provisioned claim")
				}
				if (got.pv == nil) != (got.err != nil) {
					t.Errorf("PV = %v with error %v", got.pv, got.err)
				}
			}
			if tt.capacity != nil {
				if len(tt.capacity.reqs) != tt.wantCapCalls {
					t.Fatalf("GetCapacity calls = %d, want %d", len(tt.capacity.reqs), tt.wantCapCalls)
				}
				for _, req := range tt.capacity.reqs {
					want := &csi.GetCapacityRequest{
						Parameters:         map[string]string{"p": "v"},
						AccessibleTopology: thisTopology,
						// The claim's: ReadWriteOnce, a filesystem of the class's type.
						VolumeCapabilities: []*csi.VolumeCapability{{
							AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "xfs"}},
							AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
						}},
					}
					if !proto.Equal(req, want) {
						t.Errorf("GetCapacity request = %v, want %v", req, want)
					}
				}
			}
			counted := h.p.node.delays.counted(tt.apiClaim.UID)
			if counted != tt.wantDelay {
				t.Errorf("delay of the claim still counted = %v, want %v", counted, tt.wantDelay)
			}
			if events := h.events(); len(events) > 0 {
				t.Errorf("events = %q, want none", events)
			}
		})
	}
}

// drive waits until res delivers Provision's result. Whenever Provision
// waits on clk, it runs during (the first time) and then moves clk by
// step, at most maxSteps times (0: no limit; -1: never).
func drive(t *testing.T, clk *clocktesting.FakeClock, res <-chan provisionResult, during func(), step time.Duration, maxSteps int) provisionResult {
	t.Helper()
	var got provisionResult
	steps, ranDuring := 0, false
	testutil.Eventually(t, 30*time.Second, "Provision returns", func(context.Context) (bool, error) {
		select {
		case got = <-res:
			return true, nil
		default:
		}
		if !clk.HasWaiters() {
			return false, nil
		}
		if !ranDuring {
			ranDuring = true
			during()
		}
		if maxSteps == 0 || steps < maxSteps {
			steps++
			clk.Step(step)
		}
		return false, nil
	})
	return got
}

func cmpOr(d, fallback time.Duration) time.Duration {
	if d != 0 {
		return d
	}
	return fallback
}

func countOf(list []string, s string) int {
	n := 0
	for _, e := range list {
		if e == s {
			n++
		}
	}
	return n
}

// TestNodeDeploymentDelays covers the per-claim delay, upstream's: doubling
// from the base, capped at the maximum, less a jitter of up to one base
// delay (so the first attempt waits 0 to base, none more than the
// maximum), forgotten on request.
func TestNodeDeploymentDelays(t *testing.T) {
	const base, maxDelay = time.Second, 5 * time.Second
	for _, tt := range []struct {
		jitter float64
		want   []time.Duration
	}{
		{jitter: 0, want: []time.Duration{base, 2 * base, 4 * base, maxDelay, maxDelay}},
		{jitter: 0.5, want: []time.Duration{500 * time.Millisecond, 1500 * time.Millisecond, 3500 * time.Millisecond, 4500 * time.Millisecond, 4500 * time.Millisecond}},
		{jitter: 0.999, want: []time.Duration{time.Millisecond, 1001 * time.Millisecond, 3001 * time.Millisecond, 4001 * time.Millisecond, 4001 * time.Millisecond}},
	} {
		d := newOwnerDelays(base, maxDelay, func() float64 { return tt.jitter })
		var got []time.Duration
		for range tt.want {
			got = append(got, d.next("a"))
		}
		if !slices.Equal(got, tt.want) {
			t.Errorf("jitter %v: delays = %v, want %v", tt.jitter, got, tt.want)
		}
		if first := d.next("b"); first != tt.want[0] {
			t.Errorf("jitter %v: another claim's first delay = %v, want %v", tt.jitter, first, tt.want[0])
		}
		d.forget("a")
		if again := d.next("a"); again != tt.want[0] {
			t.Errorf("jitter %v: delay after forget = %v, want %v", tt.jitter, again, tt.want[0])
		}
	}
	huge := newOwnerDelays(time.Second, time.Duration(1<<62), func() float64 { return 0 })
	for range 100 {
		if d := huge.next("a"); d <= 0 || d > time.Duration(1<<62) {
			t.Fatalf("delay overflowed: %v", d)
		}
	}
}
