package provisioner

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8stesting "k8s.io/client-go/testing"
	storagehelpers "k8s.io/component-helpers/storage/volume"
	"sigs.k8s.io/sig-storage-lib-external-provisioner/v13/controller"

	"github.com/kube-storage/csi-provisioner/internal/testutil"
	"github.com/kube-storage/csi-provisioner/pkg/csiclient"
	"github.com/kube-storage/csi-provisioner/pkg/inflight"
)

// TestProvisionErrorHandling is upstream's table: every gRPC error code of
// CreateVolume, with topology on and off, with and without a selected node.
func TestProvisionErrorHandling(t *testing.T) {
	for code := codes.Canceled; code <= codes.Unauthenticated; code++ {
		for _, topology := range []bool{false, true} {
			for _, selected := range []bool{false, true} {
				name := fmt.Sprintf("%s/topology=%v/selected=%v", code, topology, selected)
				t.Run(name, func(t *testing.T) {
					want := controller.ProvisioningFinished
					switch code {
					case codes.Canceled, codes.DeadlineExceeded, codes.Unavailable, codes.Aborted:
						want = controller.ProvisioningInBackground
					case codes.ResourceExhausted:
						if topology && selected {
							want = controller.ProvisioningReschedule
						}
					}
					caps := baseCaps()
					if topology {
						caps = topologyCaps()
					}
					b := newClaim("c").Finalizers(inflight.Finalizer)
					class := newClass().Obj()
					if selected {
						b.Annotation(storagehelpers.AnnSelectedNode, "n1")
						class = newClass().WaitForFirstConsumer().Obj()
					}
					claim := b.Obj()
					h := newHarness(t, caps, append(cluster(), claim, class))
					h.driver.createAnswers = []createAnswer{{err: csiErr(code)}}

					pv, state, err := h.provision(claim, class)
					if pv != nil || state != want {
						t.Fatalf("Provision = %v, %v, %v; want state %v", pv != nil, state, err, want)
					}
					if st, ok := status.FromError(err); !ok || st.Code() != code {
						t.Errorf("error %v does not carry code %v for the library", err, code)
					}
					_, cached := h.p.topologies.get(claim.UID)
					if wantCached := topology && want == controller.ProvisioningInBackground; cached != wantCached {
						t.Errorf("topology cached = %v, want %v", cached, wantCached)
					}
				})
			}
		}
	}
	for _, err := range []error{errors.New("connection refused"), &csiclient.Error{Method: "CreateVolume", Err: context.DeadlineExceeded}} {
		t.Run("not a gRPC status: "+err.Error(), func(t *testing.T) {
			claim, class := newClaim("c").Finalizers(inflight.Finalizer).Obj(), newClass().Obj()
			h := newHarness(t, baseCaps(), objs(claim, class))
			h.driver.createAnswers = []createAnswer{{err: err}}
			if _, state, _ := h.provision(claim, class); state != controller.ProvisioningInBackground {
				t.Errorf("state = %v, want InBackground", state)
			}
		})
	}
}

// TestCapacity covers the response capacity: 0 means the requested size; a
// volume smaller than requested is deleted again and never gets a PV.
func TestCapacity(t *testing.T) {
	tests := []struct {
		name       string
		deleting   bool
		capacity   int64
		deleteErrs []error
		wantPV     string
		wantState  controller.ProvisioningState
		wantErr    string
		wantDelete int
		wantNoCode bool // the error carries no gRPC status
	}{
		{name: "zero is the requested size", capacity: 0, wantPV: "1Gi", wantState: controller.ProvisioningFinished},
		{name: "larger", capacity: 2 * gi, wantPV: "2Gi", wantState: controller.ProvisioningFinished},
		{name: "exactly the requested size", capacity: gi, wantPV: "1Gi", wantState: controller.ProvisioningFinished},
		{
			name: "one byte smaller: deleted, not final", capacity: gi - 1, wantState: controller.ProvisioningInBackground,
			wantErr: "created volume capacity 1073741823 less than requested capacity 1073741824", wantDelete: 1,
		},
		{
			name: "smaller: deleted, not final", capacity: 1024, wantState: controller.ProvisioningInBackground,
			wantErr: "created volume capacity 1024 less than requested capacity 1073741824", wantDelete: 1,
		},
		{
			name: "smaller and the cleanup fails", capacity: 1024, wantState: controller.ProvisioningInBackground,
			deleteErrs: []error{csiErr(codes.Internal), csiErr(codes.Internal), csiErr(codes.Internal), csiErr(codes.Internal), csiErr(codes.Internal)},
			wantErr:    "Cleanup of volume pvc-uid-c failed, volume is orphaned", wantDelete: 5,
		},
		{
			// The library would take the cleanup's INVALID_ARGUMENT for
			// an infeasible request (ProvisioningFinished, slow retry).
			name: "smaller and the cleanup fails with INVALID_ARGUMENT: no gRPC code", capacity: 1024, wantState: controller.ProvisioningInBackground,
			deleteErrs: []error{csiErr(codes.InvalidArgument), csiErr(codes.InvalidArgument), csiErr(codes.InvalidArgument), csiErr(codes.InvalidArgument), csiErr(codes.InvalidArgument)},
			wantErr:    "Cleanup of volume pvc-uid-c failed, volume is orphaned: CreateVolume \"v\": rpc error: code = InvalidArgument", wantDelete: 5, wantNoCode: true,
		},
		{
			name: "smaller for a claim being deleted: released", deleting: true, capacity: 1024,
			wantState: controller.ProvisioningFinished, wantErr: "less than requested capacity", wantDelete: 1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := newClaim("c").Finalizers(inflight.Finalizer)
			if tt.deleting {
				b.Deleted()
			}
			claim := b.Obj()
			class := newClass().Param(provisionerSecret.nameKey, "s").Param(provisionerSecret.namespaceKey, testNS).Obj()
			h := newHarness(t, baseCaps(), objs(claim, class, secret(testNS, "s", map[string]string{"k": "v"})))
			h.driver.createAnswers = []createAnswer{{vol: &csi.Volume{VolumeId: "vol-1", CapacityBytes: tt.capacity}}}
			h.driver.deleteErrs = tt.deleteErrs

			pv, state, err := h.provision(claim, class)
			if state != tt.wantState || !strings.Contains(errString(err), tt.wantErr) || (tt.wantErr == "") != (err == nil) {
				t.Fatalf("Provision = %v, %q; want %v, %q", state, errString(err), tt.wantState, tt.wantErr)
			}
			if _, ok := status.FromError(err); tt.wantNoCode && ok {
				t.Errorf("the error carries a gRPC status (%v): the library would judge the provisioning by the cleanup's code", status.Code(err))
			}
			if tt.wantPV != "" {
				if got := pv.Spec.Capacity[corev1.ResourceStorage]; got.Cmp(resource.MustParse(tt.wantPV)) != 0 {
					t.Errorf("PV capacity = %v, want %v", got.String(), tt.wantPV)
				}
			} else if pv != nil {
				t.Error("got a PV for a volume smaller than requested")
			}
			deletes := h.driver.deleteCalls()
			if len(deletes) != tt.wantDelete {
				t.Fatalf("DeleteVolume calls = %d, want %d", len(deletes), tt.wantDelete)
			}
			for _, d := range deletes {
				if d.GetVolumeId() != "vol-1" || d.GetSecrets()["k"] != "v" {
					t.Errorf("DeleteVolume request = %v", d)
				}
			}
			if got := inflight.Has(h.liveClaim(claim)); got == tt.deleting {
				t.Errorf("finalizer present = %v, want %v", got, !tt.deleting)
			}
		})
	}
}

// TestUnrecordableAnswer: a created volume whose PV the API server would
// refuse (topology that is not labels, a volume_context of megabytes) is
// deleted again and the claim told why, instead of the library retrying
// the PV's save for ever with nothing on the claim. The limits' edges get
// a PV.
func TestUnrecordableAnswer(t *testing.T) {
	tests := []struct {
		name    string
		topo    []*csi.Topology
		context map[string]string
		wantErr string // "": a PV
	}{
		{name: "labels", topo: []*csi.Topology{topo(keyZone, "a", keyRack, strings.Repeat("r", 63))}},
		{name: "key with a space", topo: []*csi.Topology{topo("zone a", "a")}, wantErr: `accessible_topology segment key "zone a" is not a label key`},
		{name: "key with an empty name", topo: []*csi.Topology{topo("example.com/", "a")}, wantErr: `segment key "example.com/" is not a label key`},
		{name: "second segment's value", topo: []*csi.Topology{topo(keyZone, "a"), topo(keyZone, "b/c")}, wantErr: `accessible_topology segment ` + keyZone + `="b/c" is not a label value`},
		{name: "value of 64 characters", topo: []*csi.Topology{topo(keyZone, strings.Repeat("z", 64))}, wantErr: "is not a label value: must be no more than 63 bytes"},
		{name: "volume_context of 1 MiB", context: map[string]string{"k": strings.Repeat("v", 1<<20)}},
		{name: "volume_context of 1.5 MiB", context: map[string]string{"k": strings.Repeat("v", 1536*1024)}, wantErr: "its PersistentVolume would take 1573"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			claim, class := newClaim("c").Finalizers(inflight.Finalizer).Obj(), newClass().Obj()
			h := newHarness(t, topologyCaps(), append(cluster(), claim, class))
			h.driver.createAnswers = []createAnswer{{vol: &csi.Volume{VolumeId: "vol-1", AccessibleTopology: tt.topo, VolumeContext: tt.context}}}

			pv, state, err := h.provision(claim, class)
			if tt.wantErr == "" {
				if err != nil || pv == nil || state != controller.ProvisioningFinished {
					t.Fatalf("Provision = %v, %v, %v; want a PV", pv != nil, state, err)
				}
				if got := len(h.driver.deleteCalls()); got != 0 {
					t.Errorf("DeleteVolume calls = %d for a recorded volume", got)
				}
				return
			}
			want := `CSI driver ` + testDriver + ` returned volume ID "vol-1" that no PersistentVolume can record: `
			if pv != nil || state != controller.ProvisioningInBackground || !strings.Contains(errString(err), want) || !strings.Contains(errString(err), tt.wantErr) {
				t.Fatalf("Provision = %v, %v, %q; want no PV, InBackground, %q and %q", pv != nil, state, errString(err), want, tt.wantErr)
			}
			if d := h.driver.deleteCalls(); len(d) != 1 || d[0].GetVolumeId() != "vol-1" {
				t.Errorf("DeleteVolume calls = %v, want one for vol-1", d)
			}
			if !inflight.Has(h.liveClaim(claim)) {
				t.Error("the claim lost its in-flight finalizer")
			}
		})
	}
}

// TestInflightFinalizer covers the crash-safety protocol in Provision: the
// finalizer is persisted before the first CreateVolume with a live update,
// never skipped, and removed after a final answer for a claim being
// deleted.
func TestInflightFinalizer(t *testing.T) {
	claimGVR := schema.GroupVersionResource{Version: "v1", Resource: "persistentvolumeclaims"}
	tests := []struct {
		name       string
		claim      func() *corev1.PersistentVolumeClaim
		libCopy    func(*corev1.PersistentVolumeClaim) *corev1.PersistentVolumeClaim // what the library passes
		notInCache bool
		answer     error
		caps       func(h *harness)
		setup      func(t *testing.T, h *harness, claim *corev1.PersistentVolumeClaim)
		wantState  controller.ProvisioningState
		wantErr    string
		wantIgnore bool
		wantCreate bool
		wantWrites []string
		wantFinal  bool // finalizer on the live claim afterwards
	}{
		{
			name: "added with a live update before CreateVolume", claim: func() *corev1.PersistentVolumeClaim { return newClaim("c").Obj() },
			wantState: controller.ProvisioningFinished, wantCreate: true, wantWrites: []string{"update persistentvolumeclaims"}, wantFinal: true,
		},
		{
			name: "already present: no write", claim: func() *corev1.PersistentVolumeClaim { return newClaim("c").Finalizers(inflight.Finalizer).Obj() },
			wantState: controller.ProvisioningFinished, wantCreate: true, wantFinal: true,
		},
		{
			name: "update fails: no CreateVolume", claim: func() *corev1.PersistentVolumeClaim { return newClaim("c").Obj() },
			setup: func(_ *testing.T, h *harness, _ *corev1.PersistentVolumeClaim) {
				h.failOn("update", "persistentvolumeclaims", apierrors.NewInternalError(errors.New("etcd down")))
			},
			wantState: controller.ProvisioningNoChange, wantErr: "add finalizer " + inflight.Finalizer + " before CreateVolume",
			wantWrites: []string{"update persistentvolumeclaims"},
		},
		{
			name: "conflict and the live claim has it: no second write", claim: func() *corev1.PersistentVolumeClaim { return newClaim("c").Obj() },
			setup: func(t *testing.T, h *harness, claim *corev1.PersistentVolumeClaim) {
				first := true
				h.client.PrependReactor("update", "persistentvolumeclaims", func(k8stesting.Action) (bool, runtime.Object, error) {
					if !first {
						t.Error("second update after the conflict")
						return false, nil, nil
					}
					first = false
					// Another writer (the binder) added it meanwhile.
					live := claim.DeepCopy()
					live.Finalizers = []string{inflight.Finalizer}
					if err := h.client.Tracker().Update(claimGVR, live, live.Namespace); err != nil {
						t.Error(err)
					}
					return true, nil, apierrors.NewConflict(claimGVR.GroupResource(), claim.Name, errors.New("stale"))
				})
			},
			wantState: controller.ProvisioningFinished, wantCreate: true, wantWrites: []string{"update persistentvolumeclaims"}, wantFinal: true,
		},
		{
			name: "refused because the claim started being deleted", claim: func() *corev1.PersistentVolumeClaim { return newClaim("c").Obj() },
			setup: func(t *testing.T, h *harness, claim *corev1.PersistentVolumeClaim) {
				h.client.PrependReactor("update", "persistentvolumeclaims", func(k8stesting.Action) (bool, runtime.Object, error) {
					live := claim.DeepCopy()
					now := metav1.Now()
					live.DeletionTimestamp = &now
					if err := h.client.Tracker().Update(claimGVR, live, live.Namespace); err != nil {
						t.Error(err)
					}
					return true, nil, apierrors.NewInvalid(schema.GroupKind{Kind: "PersistentVolumeClaim"}, claim.Name, nil)
				})
			},
			wantState: controller.ProvisioningFinished, wantIgnore: true, wantWrites: []string{"update persistentvolumeclaims"},
		},
		{
			name: "being deleted without it: never created", claim: func() *corev1.PersistentVolumeClaim { return newClaim("c").Deleted().Obj() },
			wantState: controller.ProvisioningFinished, wantIgnore: true,
		},
		{
			name:  "the library's copy has it but the current claim does not and is being deleted",
			claim: func() *corev1.PersistentVolumeClaim { return newClaim("c").Deleted().Obj() },
			libCopy: func(c *corev1.PersistentVolumeClaim) *corev1.PersistentVolumeClaim {
				c = c.DeepCopy()
				inflight.Add(c, "")
				return c
			},
			wantState: controller.ProvisioningFinished, wantIgnore: true,
		},
		{
			// The library's copy is from before the bind (its claims in
			// progress, or the cache before an update that came during
			// prepare): a bound claim gets no CreateVolume, and no
			// finalizer that the guard would take off while it runs.
			name:  "the library's copy is pending but the current claim is bound",
			claim: func() *corev1.PersistentVolumeClaim { return newClaim("c").VolumeName("pvc-uid-c").Obj() },
			libCopy: func(c *corev1.PersistentVolumeClaim) *corev1.PersistentVolumeClaim {
				c = c.DeepCopy()
				c.Spec.VolumeName = ""
				inflight.Add(c, "")
				return c
			},
			wantState: controller.ProvisioningFinished, wantIgnore: true,
		},
		{
			// The claim was deleted and created again under its name: the
			// library's copy is of the old one, whose volume nobody needs.
			name:  "the library's copy is of an earlier claim of the same name",
			claim: func() *corev1.PersistentVolumeClaim { return newClaim("c").Obj() },
			libCopy: func(c *corev1.PersistentVolumeClaim) *corev1.PersistentVolumeClaim {
				c = c.DeepCopy()
				c.UID = "uid-old"
				return c
			},
			wantState: controller.ProvisioningFinished, wantIgnore: true,
		},
		{
			name: "claim gone from the informer", claim: func() *corev1.PersistentVolumeClaim { return newClaim("c").Finalizers(inflight.Finalizer).Obj() },
			notInCache: true, wantState: controller.ProvisioningFinished, wantIgnore: true, wantFinal: true,
		},
		{
			name: "being deleted, final answer: removed", claim: func() *corev1.PersistentVolumeClaim {
				return newClaim("c").Finalizers(inflight.Finalizer).Deleted().Obj()
			},
			answer: csiErr(codes.Internal), wantState: controller.ProvisioningFinished, wantErr: "mock Internal", wantCreate: true,
			wantWrites: []string{"update persistentvolumeclaims"},
		},
		{
			name: "being deleted, infeasible answer: removed", claim: func() *corev1.PersistentVolumeClaim {
				return newClaim("c").Finalizers(inflight.Finalizer).Deleted().Obj()
			},
			answer: csiErr(codes.InvalidArgument), wantState: controller.ProvisioningFinished, wantErr: "mock InvalidArgument", wantCreate: true,
			wantWrites: []string{"update persistentvolumeclaims"},
		},
		{
			name: "being deleted since the library's copy, final answer: removed",
			claim: func() *corev1.PersistentVolumeClaim {
				return newClaim("c").Finalizers(inflight.Finalizer).Deleted().Obj()
			},
			libCopy: func(c *corev1.PersistentVolumeClaim) *corev1.PersistentVolumeClaim {
				c = c.DeepCopy()
				c.DeletionTimestamp = nil
				return c
			},
			answer: csiErr(codes.NotFound), wantState: controller.ProvisioningFinished, wantErr: "mock NotFound", wantCreate: true,
			wantWrites: []string{"update persistentvolumeclaims"},
		},
		{
			name: "being deleted, in progress: kept", claim: func() *corev1.PersistentVolumeClaim {
				return newClaim("c").Finalizers(inflight.Finalizer).Deleted().Obj()
			},
			answer: csiErr(codes.DeadlineExceeded), wantState: controller.ProvisioningInBackground, wantErr: "mock DeadlineExceeded", wantCreate: true, wantFinal: true,
		},
		{
			name: "being deleted, AlreadyExists: kept, with the reason", claim: func() *corev1.PersistentVolumeClaim {
				return newClaim("c").Finalizers(inflight.Finalizer).Deleted().Obj()
			},
			answer: csiErr(codes.AlreadyExists), wantState: controller.ProvisioningFinished, wantErr: "volume pvc-uid-c exists in the driver with other parameters",
			wantCreate: true, wantFinal: true,
		},
		{
			name: "not being deleted, final answer: kept", claim: func() *corev1.PersistentVolumeClaim { return newClaim("c").Finalizers(inflight.Finalizer).Obj() },
			answer: csiErr(codes.Internal), wantState: controller.ProvisioningFinished, wantErr: "mock Internal", wantCreate: true, wantFinal: true,
		},
		{
			name: "released by the guard: no CreateVolume", claim: func() *corev1.PersistentVolumeClaim {
				return newClaim("c").Finalizers(inflight.Finalizer).Deleted().Obj()
			},
			setup: func(_ *testing.T, h *harness, claim *corev1.PersistentVolumeClaim) {
				h.p.attempts.final(claim.UID)
				h.p.attempts.release(claim.UID)
			},
			wantState: controller.ProvisioningFinished, wantIgnore: true, wantFinal: true,
		},
		{
			name: "being deleted, request cannot be built, nothing sent since seen clean: released",
			claim: func() *corev1.PersistentVolumeClaim {
				return newClaim("c").Finalizers(inflight.Finalizer).Deleted().Selector(map[string]string{"a": "b"}).Obj()
			},
			setup: func(_ *testing.T, h *harness, claim *corev1.PersistentVolumeClaim) {
				h.p.attempts.observeClean(claim.UID)
			},
			wantState: controller.ProvisioningFinished, wantErr: "claim Selector is not supported",
			wantWrites: []string{"update persistentvolumeclaims"},
		},
		{
			name: "being deleted, request cannot be built: kept, with the reason",
			claim: func() *corev1.PersistentVolumeClaim {
				return newClaim("c").Finalizers(inflight.Finalizer).Deleted().Selector(map[string]string{"a": "b"}).Obj()
			},
			wantState: controller.ProvisioningFinished, wantErr: "claim is being deleted but keeps finalizer", wantFinal: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			claim := tt.claim()
			class := newClass().Obj()
			h := newHarness(t, baseCaps(), objs(class, claim))
			if tt.notInCache {
				// The API server still has it; the informer no longer does.
				// Removed from the indexer itself: adding the claim to the
				// fake API server after the informer started would race
				// with its watch delivering the claim.
				indexer := h.factory.Core().V1().PersistentVolumeClaims().Informer().GetIndexer()
				if err := indexer.Delete(claim); err != nil {
					t.Fatal(err)
				}
			}
			if tt.answer != nil {
				h.driver.createAnswers = []createAnswer{{err: tt.answer}}
			}
			if tt.setup != nil {
				tt.setup(t, h, claim)
			}
			h.driver.onCreate = func(*csi.CreateVolumeRequest) {
				if live := h.liveClaim(claim); !inflight.Has(live) {
					t.Error("CreateVolume sent while the claim lacks the in-flight finalizer")
				}
			}
			lib := claim
			if tt.libCopy != nil {
				lib = tt.libCopy(claim)
			}
			_, state, err := h.provision(lib, class)
			if state != tt.wantState || !strings.Contains(errString(err), tt.wantErr) || isIgnored(err) != tt.wantIgnore {
				t.Errorf("Provision = %v, %q (ignored %v); want %v, %q (ignored %v)", state, errString(err), isIgnored(err), tt.wantState, tt.wantErr, tt.wantIgnore)
			}
			if got := len(h.driver.createCalls()) > 0; got != tt.wantCreate {
				t.Errorf("CreateVolume sent = %v, want %v", got, tt.wantCreate)
			}
			if got := h.writes(); !slices.Equal(got, tt.wantWrites) {
				t.Errorf("writes = %v, want %v", got, tt.wantWrites)
			}
			for _, a := range h.client.Actions() {
				if u, ok := a.(k8stesting.UpdateActionImpl); ok && u.UpdateOptions.FieldManager != FieldManager {
					t.Errorf("update with field manager %q", u.UpdateOptions.FieldManager)
				}
			}
			if got := inflight.Has(h.liveClaim(claim)); got != tt.wantFinal {
				t.Errorf("finalizer on the live claim = %v, want %v", got, tt.wantFinal)
			}
		})
	}
}

// TestNewLeaderWithOtherVolumeNamePrefix: process A (the old leader, default
// --volume-name-prefix) sends CreateVolume for a claim; the driver creates
// "pvc-<uid>" but the answer is lost, and A stops (a rolling update). The
// new leader B runs with another --volume-name-prefix. The claim keeps the
// in-flight finalizer, whose promise is that the next process repeats the
// call until an answer says whether the volume exists: B must send the
// same name, recorded with the finalizer, not create a second volume under
// a new name and leave A's, which no PV records, in the driver.
func TestNewLeaderWithOtherVolumeNamePrefix(t *testing.T) {
	claim, class := newClaim("c").Obj(), newClass().Obj()
	a := newHarness(t, baseCaps(), objs(claim, class))
	a.driver.createAnswers = []createAnswer{{err: csiErr(codes.DeadlineExceeded)}}
	if _, state, err := a.provision(claim, class); err == nil {
		t.Fatalf("A: Provision = %v, nil; want DeadlineExceeded", state)
	}
	sentByA := a.driver.createCalls()[0].GetName()
	live := a.liveClaim(claim)
	if !inflight.Has(live) || live.Annotations[inflight.AnnVolumeName] != sentByA {
		t.Fatalf("after A's call the claim has finalizers %v and %s=%q, want the in-flight finalizer and %q",
			live.Finalizers, inflight.AnnVolumeName, live.Annotations[inflight.AnnVolumeName], sentByA)
	}

	b := newHarness(t, baseCaps(), objs(live, class), WithVolumeNamePrefix("vol"))
	pv, _, err := b.provision(live, class)
	if err != nil {
		t.Fatalf("B: Provision: %v", err)
	}
	for _, req := range b.driver.createCalls() {
		if req.GetName() != sentByA {
			t.Errorf("B sent CreateVolume %q for a claim whose CreateVolume %q (A's, answer lost) may have created a volume", req.GetName(), sentByA)
		}
	}
	if pv.Name != sentByA {
		t.Errorf("B's PV is %s, want %s (the volume's name)", pv.Name, sentByA)
	}
	// A claim B hands over itself is named by B's flags.
	other := newClaim("d").Obj()
	if got, want := b.p.VolumeName(other), "vol-"+string(other.UID); got != want {
		t.Errorf("VolumeName of a new claim = %q, want %q", got, want)
	}
}

// TestVolumeNameRecordedForAnotherClaim: anybody who may edit a claim may
// set the volume-name annotation, and a claim restored from a backup keeps
// it under a new UID. A recorded name is used only on a claim that carries
// the in-flight finalizer and only if it ends in the claim's own UID
// (whole, or at least 8 characters of it without dashes): otherwise
// CreateVolume of that name could hand the claim another claim's volume, or
// any volume of the backend with a name chosen for it.
func TestVolumeNameRecordedForAnotherClaim(t *testing.T) {
	const uid = "0d6e2f3a-1111-2222-3333-444455556666"
	configured := "pvc-" + uid
	for _, tt := range []struct {
		recorded string
		noFinal  bool // the claim lacks the in-flight finalizer
		want     string
	}{
		{recorded: "pvc-" + uid, want: configured},
		{recorded: "old-prefix-" + uid, want: "old-prefix-" + uid},
		{recorded: "pvc-0d6e2f3a111", want: "pvc-0d6e2f3a111"},
		{recorded: "pvc-0d6e2f3a", want: "pvc-0d6e2f3a"},
		{recorded: "old-prefix-" + uid, noFinal: true, want: configured},
		{recorded: "pvc-9f9f9f9f-1111-2222-3333-444455556666", want: configured},
		{recorded: "pvc-9f9f9f9f", want: configured},
		{recorded: "0d6e2f3a", want: configured},
		{recorded: "pvc-0d6e2f3", want: configured},
		{recorded: "pvc-", want: configured},
		{recorded: "restored-from-backup-", want: configured},
		{recorded: "other-teams-archive-0", want: configured},
		{recorded: "../../var/lib/x-" + uid, want: configured},
		{recorded: "Vol-" + uid, want: configured},
		{recorded: uid, want: configured},
		{recorded: "pvc" + uid, want: configured},
	} {
		h := newHarness(t, baseCaps(), objs(newClass().Obj()))
		claim := newClaim("c").UID(uid).Annotation(inflight.AnnVolumeName, tt.recorded).Obj()
		if !tt.noFinal {
			inflight.Add(claim, "")
		}
		if got := h.p.VolumeName(claim); got != tt.want {
			t.Errorf("recorded %q, finalizer %v: VolumeName = %q, want %q", tt.recorded, !tt.noFinal, got, tt.want)
		}
	}
}

// TestRecordedVolumeNameChangedBetweenRetries: a claim's CreateVolume
// times out (the driver goes on creating), and the claim's user then
// edits the recorded volume name to another valid one. The retry must
// repeat the call under the first name: under the new one the driver
// would create a second volume, and the first, which no PV records, would
// leak (counted in no quota).
func TestRecordedVolumeNameChangedBetweenRetries(t *testing.T) {
	const uid = "0d6e2f3a-1111-2222-3333-444455556666"
	claim := newClaim("c").UID(uid).Obj()
	class := newClass().Obj()
	h := newHarness(t, baseCaps(), objs(claim, class))
	h.driver.createAnswers = []createAnswer{{err: csiErr(codes.DeadlineExceeded)}}
	if _, state, _ := h.provision(claim, class); state != controller.ProvisioningInBackground {
		t.Fatalf("first Provision state %v, want in background", state)
	}
	h.driver.createAnswers = nil
	live := h.liveClaim(claim)
	first := live.Annotations[inflight.AnnVolumeName]
	edited := live.DeepCopy()
	edited.Annotations[inflight.AnnVolumeName] = "mine-0d6e2f3a" // the user's edit
	if _, err := h.client.CoreV1().PersistentVolumeClaims(testNS).Update(h.ctx, edited, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 0, "the informer never saw the edit", func(context.Context) (bool, error) {
		c, err := h.p.claims.PersistentVolumeClaims(testNS).Get("c")
		return err == nil && c.Annotations[inflight.AnnVolumeName] == "mine-0d6e2f3a", nil
	})
	if _, _, err := h.provision(edited, class); err != nil {
		t.Fatalf("second Provision: %v", err)
	}
	var names []string
	for _, req := range h.driver.createCalls() {
		names = append(names, req.GetName())
	}
	if len(names) != 2 || names[0] != first || names[1] != first {
		t.Errorf("CreateVolume names %q, want the timed-out call (%s) repeated", names, first)
	}
}

// TestUserChosenVolumeNameNotSent: a user who sets the volume-name
// annotation on a new claim does not choose the name CreateVolume gets.
func TestUserChosenVolumeNameNotSent(t *testing.T) {
	const uid = "0d6e2f3a-1111-2222-3333-444455556666"
	claim := newClaim("c").UID(uid).Annotation(inflight.AnnVolumeName, "other-teams-archive-0").Obj()
	class := newClass().Obj()
	h := newHarness(t, baseCaps(), objs(claim, class))
	if _, _, err := h.provision(claim, class); err != nil {
		t.Fatalf("Provision: %v", err)
	}
	for _, req := range h.driver.createCalls() {
		if got, want := req.GetName(), "pvc-"+uid; got != want {
			t.Errorf("CreateVolume name %q, chosen by the claim's user; want %q", got, want)
		}
	}
	if got := h.liveClaim(claim).Annotations[inflight.AnnVolumeName]; got != "pvc-"+uid {
		t.Errorf("recorded name %q, want the configured one", got)
	}
}

func TestProvisionOtherDriver(t *testing.T) {
	claim := newClaim("c").Annotation(storagehelpers.AnnStorageProvisioner, "other.example.com").Obj()
	class := newClass().Obj()
	h := newHarness(t, baseCaps(), objs(claim, class))
	if _, _, err := h.provision(claim, class); !isIgnored(err) {
		t.Errorf("error = %v, want IgnoredError", err)
	}
}

// TestShouldProvision covers the Qualifier, including claims being deleted,
// and the Warning events for what the library is silent about.
func TestShouldProvision(t *testing.T) {
	tests := []struct {
		name      string
		claim     *corev1.PersistentVolumeClaim
		want      bool
		wantEvent string
	}{
		{name: "annotated", claim: newClaim("c").Obj(), want: true},
		{
			name: "beta annotation only", want: true,
			claim: func() *corev1.PersistentVolumeClaim {
				c := newClaim("c").Annotation(storagehelpers.AnnBetaStorageProvisioner, testDriver).Obj()
				delete(c.Annotations, storagehelpers.AnnStorageProvisioner)
				return c
			}(),
		},
		{
			name:  "GA annotation names another driver",
			claim: newClaim("c").Annotation(storagehelpers.AnnStorageProvisioner, "other").Annotation(storagehelpers.AnnBetaStorageProvisioner, testDriver).Obj(),
		},
		{name: "not annotated", claim: unannotatedClaim("c")},
		{name: "bound", claim: newClaim("c").VolumeName("pv").Obj()},
		{name: "being deleted without the finalizer", claim: newClaim("c").Deleted().Obj()},
		{name: "being deleted with the finalizer", claim: newClaim("c").Deleted().Finalizers(inflight.Finalizer).Obj(), want: true},
		// The binder reports it, as kube-controller-manager's does: one
		// Warning, not two worded differently.
		{name: "class missing", claim: newClaim("c").Class("missing").Obj(), want: true},
		{
			name: "no class", want: true, wantEvent: "Warning ProvisioningFailed the claim names no storage class",
			claim: func() *corev1.PersistentVolumeClaim {
				c := newClaim("c").Obj()
				c.Spec.StorageClassName = nil
				return c
			}(),
		},
		{
			name: "class of another provisioner", claim: newClaim("c").Class("foreign").Obj(),
			wantEvent: `Warning ProvisioningFailed the claim is annotated for ` + testDriver + ` but its storageclass "foreign" names provisioner "other.example.com"`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, baseCaps(), objs(newClass().Obj(), newForeignClass()))
			for range 2 { // the second call's event is deduplicated
				if got := h.p.ShouldProvision(h.ctx, tt.claim); got != tt.want {
					t.Errorf("ShouldProvision = %v, want %v", got, tt.want)
				}
			}
			var want []string
			if tt.wantEvent != "" {
				want = []string{tt.wantEvent}
			}
			if got := h.events(); !slices.Equal(got, want) {
				t.Errorf("events = %q, want %q", got, want)
			}
		})
	}
}

// TestShouldProvisionVolumeNameTaken: with --volume-name-uuid-length two
// claims' UIDs can start alike, so the volume name of one is the name of
// the other's PV. The library would skip the claim without a word (a PV of
// its name exists); it is explained instead, and not provisioned.
func TestShouldProvisionVolumeNameTaken(t *testing.T) {
	claim := newClaim("c").Obj() // UID uid-c: volume pvc-uidc when cut to 4
	tests := []struct {
		name      string
		uuidLen   int
		claim     *corev1.PersistentVolumeClaim // claim unless set
		pv        *corev1.PersistentVolume
		want      bool
		wantEvent string
	}{
		{
			name: "truncated UID shared with a bound claim's volume", uuidLen: 4, pv: testutil.NewPV("pvc-uidc", testDriver).ClaimRef("other", "c2", "uid-c2").Obj(),
			wantEvent: "Warning ProvisioningFailed the volume name pvc-uidc of this claim is taken: PersistentVolume pvc-uidc records claim other/c2 (UID uid-c2); " +
				"--volume-name-uuid-length=4 keeps the first 4 characters of the claim's UID, which another claim shares. Delete this claim and create it again: it gets another UID",
		},
		{
			name: "truncated UID shared, the claim being deleted with the in-flight finalizer", uuidLen: 4, claim: newClaim("c").Deleted().Finalizers(inflight.Finalizer).Obj(),
			pv: testutil.NewPV("pvc-uidc", testDriver).ClaimRef("other", "c2", "uid-c2").Obj(),
			wantEvent: "Warning ProvisioningFailed the volume name pvc-uidc of this claim is taken: PersistentVolume pvc-uidc records claim other/c2 (UID uid-c2); " +
				"--volume-name-uuid-length=4 keeps the first 4 characters of the claim's UID, which another claim shares. The claim is being deleted and keeps finalizer " + inflight.Finalizer +
				" in case a CreateVolume for it ran",
		},
		{name: "the claim's own volume", uuidLen: 4, pv: testutil.NewPV("pvc-uidc", testDriver).BoundTo(claim).Obj(), want: true},
		{name: "a volume of that name pre-bound by name only", uuidLen: 4, pv: testutil.NewPV("pvc-uidc", testDriver).ClaimRef(testNS, "c", "").Obj(), want: true},
		{name: "a volume of that name without claimRef", uuidLen: 4, pv: testutil.NewPV("pvc-uidc", testDriver).Obj(), want: true},
		{
			name: "whole UID, a PV of that name made by hand for another claim", uuidLen: -1, pv: testutil.NewPV("pvc-uid-c", testDriver).ClaimRef("other", "c2", "uid-c2").Obj(),
			wantEvent: "Warning ProvisioningFailed the volume name pvc-uid-c of this claim is taken: PersistentVolume pvc-uid-c records claim other/c2 (UID uid-c2); a PersistentVolume of that name exists.",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, baseCaps(), objs(newClass().Obj(), tt.pv), WithVolumeNameUUIDLength(tt.uuidLen))
			c := claim
			if tt.claim != nil {
				c = tt.claim
			}
			if got := h.p.ShouldProvision(h.ctx, c); got != tt.want {
				t.Errorf("ShouldProvision = %v, want %v", got, tt.want)
			}
			events := h.events()
			if tt.wantEvent == "" && len(events) > 0 || tt.wantEvent != "" && (len(events) != 1 || !strings.HasPrefix(events[0], tt.wantEvent)) {
				t.Errorf("events = %q, want %q", events, tt.wantEvent)
			}
		})
	}
}

func unannotatedClaim(name string) *corev1.PersistentVolumeClaim {
	return testutil.NewPVC(testNS, name).UID("uid-" + name).Class(testClass).Obj()
}

func newForeignClass() *storagev1.StorageClass {
	return testutil.NewSC("foreign", "other.example.com").Obj()
}

// TestCheckProvisionVolumeNameTaken: the binder's check before it hands a
// claim over (and adds the in-flight finalizer) refuses a claim whose
// volume name another claim's PV has, as ShouldProvision does: the
// finalizer on a claim the provisioner never provisions would, after a
// restart, keep the deleted claim Terminating with no CreateVolume ever
// sent.
func TestCheckProvisionVolumeNameTaken(t *testing.T) {
	claim := newClaim("c").Obj() // UID uid-c: volume pvc-uidc when cut to 4
	taken := testutil.NewPV("pvc-uidc", testDriver).ClaimRef("other", "c2", "uid-c2").Obj()
	class := newClass().Obj()
	h := newHarness(t, baseCaps(), objs(class, claim, taken), WithVolumeNameUUIDLength(4))
	if err := h.p.CheckProvision(h.ctx, claim, class); err == nil || !strings.Contains(err.Error(), "the volume name pvc-uidc of this claim is taken") {
		t.Errorf("CheckProvision = %v, want the volume name taken", err)
	}
}
