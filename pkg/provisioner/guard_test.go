package provisioner

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/util/workqueue"
	storagehelpers "k8s.io/component-helpers/storage/volume"
	"sigs.k8s.io/sig-storage-lib-external-provisioner/v13/controller"

	"github.com/kube-storage/csi-provisioner/internal/testutil"
	"github.com/kube-storage/csi-provisioner/pkg/inflight"
)

// TestGuardSync covers the guard's removal rules.
func TestGuardSync(t *testing.T) {
	guarded := func() *testutil.PVCBuilder { return newClaim("c").Finalizers(inflight.Finalizer) }
	ourPV := func(claim *corev1.PersistentVolumeClaim) *testutil.PVBuilder {
		return testutil.NewPV("pvc-uid-c", testDriver).BoundTo(claim)
	}
	tests := []struct {
		name       string
		claim      *corev1.PersistentVolumeClaim
		pvs        func(*corev1.PersistentVolumeClaim) []runtime.Object
		class      *storagev1.StorageClass // newClass() unless set or classGone
		classGone  bool
		binderOff  bool
		ledger     func(*ledger)
		failUpdate bool
		wantErr    bool
		wantKept   bool
		wantEvent  string
	}{
		{
			name: "provisioned PV and bound claim", claim: guarded().VolumeName("pvc-uid-c").Obj(),
			pvs: func(c *corev1.PersistentVolumeClaim) []runtime.Object { return objs(ourPV(c).Obj()) },
		},
		{
			name: "provisioned PV, unbound claim, binder on: left to the binder", claim: guarded().Obj(), wantKept: true,
			pvs: func(c *corev1.PersistentVolumeClaim) []runtime.Object { return objs(ourPV(c).Obj()) },
		},
		{
			name: "provisioned PV, unbound claim, binder off", claim: guarded().Obj(), binderOff: true,
			pvs: func(c *corev1.PersistentVolumeClaim) []runtime.Object { return objs(ourPV(c).Obj()) },
		},
		{
			name: "provisioned PV, claim being deleted", claim: guarded().Deleted().Obj(),
			pvs: func(c *corev1.PersistentVolumeClaim) []runtime.Object { return objs(ourPV(c).Obj()) },
		},
		{
			name: "PV annotated as provisioned by the driver under another name", claim: guarded().VolumeName("old-name").Obj(),
			pvs: func(c *corev1.PersistentVolumeClaim) []runtime.Object {
				return objs(testutil.NewPV("old-name", testDriver).BoundTo(c).Annotation(storagehelpers.AnnDynamicallyProvisioned, testDriver).Obj())
			},
		},
		{
			name: "bound to a static PV while a create may be in flight: kept, with a warning", claim: guarded().VolumeName("static").Obj(),
			pvs: func(c *corev1.PersistentVolumeClaim) []runtime.Object {
				return objs(testutil.NewPV("static", testDriver).BoundTo(c).Obj())
			},
			wantKept:  true,
			wantEvent: "Warning ProvisioningFailed the claim was bound to volume static while a CreateVolume for it may have been in progress",
		},
		{
			name: "bound to a static PV after a final answer", claim: guarded().VolumeName("static").Obj(),
			pvs: func(c *corev1.PersistentVolumeClaim) []runtime.Object {
				return objs(testutil.NewPV("static", testDriver).BoundTo(c).Obj())
			},
			ledger: func(l *ledger) { l.final("uid-c") },
		},
		{
			name: "PV of an older claim of the same name", claim: guarded().Obj(), binderOff: true, wantKept: true,
			pvs: func(*corev1.PersistentVolumeClaim) []runtime.Object {
				return objs(testutil.NewPV("pvc-uid-old", testDriver).ClaimRef(testNS, "c", "uid-old").Obj())
			},
		},
		{
			// Its claimRef names the claim but for the UID: that volume
			// does not record this claim's create, which may still run.
			name: "PV the driver provisioned for an older claim of the same name", claim: guarded().Deleted().Obj(), binderOff: true, wantKept: true,
			pvs: func(*corev1.PersistentVolumeClaim) []runtime.Object {
				return objs(testutil.NewPV("old-volume", testDriver).ClaimRef(testNS, "c", "uid-old").Annotation(storagehelpers.AnnDynamicallyProvisioned, testDriver).Obj())
			},
		},
		{
			name: "PV of another driver", claim: guarded().Obj(), binderOff: true, wantKept: true,
			pvs: func(c *corev1.PersistentVolumeClaim) []runtime.Object {
				return objs(testutil.NewPV("pvc-uid-c", "other.example.com").BoundTo(c).Obj())
			},
		},
		{name: "being deleted, last answer final", claim: guarded().Deleted().Obj(), ledger: func(l *ledger) { l.final("uid-c") }},
		{name: "being deleted, seen without the finalizer, nothing sent since", claim: guarded().Deleted().Obj(), ledger: func(l *ledger) { l.observeClean("uid-c") }},
		{
			name: "bound to a static PV, nothing sent since seen clean", claim: guarded().VolumeName("static").Obj(),
			pvs: func(c *corev1.PersistentVolumeClaim) []runtime.Object {
				return objs(testutil.NewPV("static", testDriver).BoundTo(c).Obj())
			},
			ledger: func(l *ledger) { l.observeClean("uid-c") },
		},
		{name: "being deleted, create in flight", claim: guarded().Deleted().Obj(), ledger: func(l *ledger) { l.begin("uid-c") }, wantKept: true},
		{name: "being deleted, nothing known (after a restart)", claim: guarded().Deleted().Obj(), wantKept: true},
		{
			name: "being deleted, class gone, nothing known: kept, with a warning", claim: guarded().Deleted().Obj(), wantKept: true, classGone: true,
			wantEvent: "Warning ProvisioningFailed the claim is being deleted, a CreateVolume for it may have been in progress, and its StorageClass " + testClass +
				" no longer exists, so the provisioner cannot ask the driver again; finalizer " + inflight.Finalizer + " stays so that a volume named pvc-uid-c of driver " + testDriver + " cannot leak: recreate the class",
		},
		{
			name: "being deleted, class gone, create sent without a final answer: kept, with a warning", claim: guarded().Deleted().Obj(), wantKept: true, classGone: true,
			ledger:    func(l *ledger) { l.begin("uid-c") },
			wantEvent: "Warning ProvisioningFailed the claim is being deleted, a CreateVolume for it may have been in progress, and its StorageClass " + testClass + " no longer exists",
		},
		{
			name: "being deleted, class gone, volume created and its PV being saved: kept (the PV releases it)", claim: guarded().Deleted().Obj(), wantKept: true, classGone: true,
			ledger: func(l *ledger) { l.begin("uid-c"); l.created("uid-c") },
		},
		{
			name: "being deleted, late binding, no node selected, nothing known: kept, with a warning", claim: guarded().Deleted().Obj(),
			class: newClass().WaitForFirstConsumer().Obj(), wantKept: true,
			wantEvent: "Warning ProvisioningFailed the claim is being deleted without a selected node, and a CreateVolume for it may have been in progress before this provisioner started; finalizer " + inflight.Finalizer + " stays so that a volume named pvc-uid-c cannot leak",
		},
		{
			name: "being deleted, late binding, node selected, nothing known: kept (the library sends a CreateVolume)", claim: guarded().Deleted().Annotation(storagehelpers.AnnSelectedNode, "n1").Obj(),
			class: newClass().WaitForFirstConsumer().Obj(), wantKept: true,
		},
		{
			name: "being deleted, late binding, no node selected, create in flight: kept (its answer releases it)", claim: guarded().Deleted().Obj(),
			class: newClass().WaitForFirstConsumer().Obj(), ledger: func(l *ledger) { l.begin("uid-c") }, wantKept: true,
		},
		{
			name: "being deleted, late binding, no node selected, last answer final", claim: guarded().Deleted().Obj(),
			class: newClass().WaitForFirstConsumer().Obj(), ledger: func(l *ledger) { l.final("uid-c") },
		},
		{name: "pending, last answer final: the library retries", claim: guarded().Obj(), ledger: func(l *ledger) { l.final("uid-c") }, wantKept: true},
		{
			name: "claim of another driver", wantKept: true, binderOff: true,
			claim: guarded().Annotation(storagehelpers.AnnStorageProvisioner, "other.example.com").Obj(),
			pvs:   func(c *corev1.PersistentVolumeClaim) []runtime.Object { return objs(ourPV(c).Obj()) },
		},
		{
			// The class was recreated with another provisioner, which
			// provisioned and bound the claim: this driver's create is over.
			name:  "handed to another provisioner and bound there after a final answer",
			claim: guarded().VolumeName("pvc-uid-c").Annotation(storagehelpers.AnnStorageProvisioner, "other.example.com").Obj(),
			pvs: func(c *corev1.PersistentVolumeClaim) []runtime.Object {
				return objs(testutil.NewPV("pvc-uid-c", "other.example.com").BoundTo(c).Obj())
			},
			ledger: func(l *ledger) { l.final("uid-c") },
		},
		{
			name:   "handed to another provisioner, being deleted, after a final answer",
			claim:  guarded().Deleted().Annotation(storagehelpers.AnnStorageProvisioner, "other.example.com").Obj(),
			ledger: func(l *ledger) { l.final("uid-c") },
		},
		{
			name:   "handed to another provisioner and bound there while a create may be in flight",
			claim:  guarded().VolumeName("pvc-uid-c").Annotation(storagehelpers.AnnStorageProvisioner, "other.example.com").Obj(),
			ledger: func(l *ledger) { l.begin("uid-c") }, wantKept: true,
		},
		{
			// The other provisioner names its volumes as this one does:
			// the claim is bound to a PV named as this driver's would be.
			name:  "handed to another provisioner and bound there to a PV of the same name while a create may be in flight: kept, with a warning",
			claim: guarded().VolumeName("pvc-uid-c").Annotation(storagehelpers.AnnStorageProvisioner, "other.example.com").Obj(),
			pvs: func(c *corev1.PersistentVolumeClaim) []runtime.Object {
				return objs(testutil.NewPV("pvc-uid-c", "other.example.com").BoundTo(c).Obj())
			},
			ledger: func(l *ledger) { l.begin("uid-c") }, wantKept: true,
			wantEvent: "Warning ProvisioningFailed the claim was bound to volume pvc-uid-c while a CreateVolume for it may have been in progress; finalizer " + inflight.Finalizer +
				" stays so that a volume named pvc-uid-c of driver " + testDriver + " cannot leak",
		},
		{
			name:   "handed to another provisioner, being deleted, while a create may be in flight: kept, with a warning",
			claim:  guarded().Deleted().Annotation(storagehelpers.AnnStorageProvisioner, "other.example.com").Obj(),
			ledger: func(l *ledger) { l.begin("uid-c") }, wantKept: true,
			wantEvent: "Warning ProvisioningFailed the claim is being deleted, and was handed to another provisioner while a CreateVolume for it may have been in progress; finalizer " +
				inflight.Finalizer + " stays so that a volume named pvc-uid-c of driver " + testDriver + " cannot leak",
		},
		{
			name:   "handed to another provisioner, still pending there after a final answer",
			claim:  guarded().Annotation(storagehelpers.AnnStorageProvisioner, "other.example.com").Obj(),
			ledger: func(l *ledger) { l.final("uid-c") }, wantKept: true,
		},
		{
			// Seen clean, so the finalizer is the other provisioner's (this
			// product's sidecar of another driver): not touched.
			name:   "claim of another driver, being deleted, seen clean",
			claim:  guarded().Deleted().Annotation(storagehelpers.AnnStorageProvisioner, "other.example.com").Obj(),
			ledger: func(l *ledger) { l.observeClean("uid-c") }, wantKept: true,
		},
		{
			name: "removal fails", claim: guarded().Deleted().Obj(), ledger: func(l *ledger) { l.final("uid-c") },
			failUpdate: true, wantErr: true, wantKept: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := objs(tt.claim)
			if tt.pvs != nil {
				o = append(o, tt.pvs(tt.claim)...)
			}
			switch {
			case tt.class != nil:
				o = append(o, tt.class)
			case !tt.classGone:
				o = append(o, newClass().Obj())
			}
			h := newHarness(t, baseCaps(), o, WithBinderEnabled(!tt.binderOff))
			if tt.ledger != nil {
				tt.ledger(h.p.attempts)
			}
			if tt.failUpdate {
				h.failOn("update", "persistentvolumeclaims", apierrors.NewInternalError(errors.New("etcd down")))
			}
			err := h.p.guardSync(h.ctx, testNS+"/c")
			if (err != nil) != tt.wantErr {
				t.Fatalf("guardSync = %v, want error %v", err, tt.wantErr)
			}
			if got := inflight.Has(h.liveClaim(tt.claim)); got != tt.wantKept {
				t.Errorf("finalizer kept = %v, want %v", got, tt.wantKept)
			}
			events := h.events()
			if tt.wantEvent == "" && len(events) > 0 || tt.wantEvent != "" && (len(events) != 1 || !strings.HasPrefix(events[0], tt.wantEvent)) {
				t.Errorf("events = %q, want %q", events, tt.wantEvent)
			}
			if tt.failUpdate {
				// The failed release is undone: a retry can still release.
				if !h.p.attempts.release(tt.claim.UID) {
					t.Error("the claim stayed released after a failed removal")
				}
			}
		})
	}
	t.Run("claim not found", func(t *testing.T) {
		h := newHarness(t, baseCaps(), nil)
		if err := h.p.guardSync(h.ctx, "ns/none"); err != nil {
			t.Errorf("guardSync = %v", err)
		}
		if err := h.p.guardSync(h.ctx, "a/b/c"); err != nil {
			t.Errorf("guardSync(bad key) = %v", err)
		}
	})
}

// TestRunGuard runs the guard on live informers: a PV that appears for a
// claim makes the guard remove the finalizer, a deleted claim is forgotten,
// and RunGuard returns once its context is done.
func TestRunGuard(t *testing.T) {
	claim := newClaim("c").Finalizers(inflight.Finalizer).Obj()
	other := newClaim("d").Finalizers(inflight.Finalizer).Obj()
	fresh := testutil.NewPVC(testNS, "e").UID("uid-e").Class(testClass).Obj()
	foreign := newClaim("f").Annotation(storagehelpers.AnnStorageProvisioner, "other.example.com").Obj()
	h := newHarness(t, baseCaps(), objs(claim, other, fresh, foreign), WithBinderEnabled(false))
	h.p.attempts.final(other.UID)

	stop := h.runGuard(t, 2)

	pv := testutil.NewPV(h.p.VolumeName(claim), testDriver).BoundTo(claim).Obj()
	if _, err := h.client.CoreV1().PersistentVolumes().Create(t.Context(), pv, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 0, "finalizer removed after the PV appeared", func(ctx context.Context) (bool, error) {
		c, err := h.client.CoreV1().PersistentVolumeClaims(testNS).Get(ctx, "c", metav1.GetOptions{})
		return err == nil && !inflight.Has(c), err
	})
	if err := h.client.CoreV1().PersistentVolumeClaims(testNS).Delete(t.Context(), "d", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 0, "deleted claim forgotten", func(context.Context) (bool, error) {
		h.p.attempts.mu.Lock()
		defer h.p.attempts.mu.Unlock()
		_, known := h.p.attempts.states[other.UID]
		return !known, nil
	})

	// A claim seen without the finalizer that gets it (from the binder) and
	// is deleted before any CreateVolume is released; a claim of another
	// driver is not recorded.
	testutil.Eventually(t, 0, "fresh claim recorded as clean", func(context.Context) (bool, error) {
		h.p.attempts.mu.Lock()
		defer h.p.attempts.mu.Unlock()
		if _, known := h.p.attempts.states[foreign.UID]; known {
			t.Error("claim of another driver recorded")
		}
		return h.p.attempts.states[fresh.UID] == attemptClean, nil
	})
	handed := fresh.DeepCopy()
	handed.Annotations = map[string]string{storagehelpers.AnnStorageProvisioner: testDriver}
	handed.Finalizers = []string{inflight.Finalizer}
	now := metav1.Now()
	handed.DeletionTimestamp = &now
	if _, err := h.client.CoreV1().PersistentVolumeClaims(testNS).Update(t.Context(), handed, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 0, "deleted claim released", func(ctx context.Context) (bool, error) {
		c, err := h.client.CoreV1().PersistentVolumeClaims(testNS).Get(ctx, "e", metav1.GetOptions{})
		return err == nil && !inflight.Has(c), err
	})

	stop()
	if slices.Contains(h.writes(), "update persistentvolumeclaims") == false {
		t.Error("no claim update recorded")
	}
}

func TestLedger(t *testing.T) {
	l := newLedger()
	const uid = "u"
	if l.release(uid) {
		t.Error("an unknown claim was released")
	}
	l.observeClean(uid)
	if !l.begin(uid) {
		t.Fatal("begin refused")
	}
	l.observeClean(uid) // a stale observation must not hide the create
	if l.release(uid) {
		t.Error("released while a create is in flight")
	}
	l.final(uid)
	if !l.release(uid) {
		t.Fatal("not released after a final answer")
	}
	if l.begin(uid) {
		t.Error("a create started after the release")
	}
	l.final(uid) // a late answer keeps the release
	if l.begin(uid) {
		t.Error("a late final answer undid the release")
	}
	l.created(uid) // so does a late success
	if l.state(uid) != attemptReleased {
		t.Errorf("a late success undid the release: state %d", l.state(uid))
	}
	l.unrelease(uid)
	if !l.begin(uid) {
		t.Error("begin refused after unrelease")
	}
	l.forget(uid)
	l.observeClean(uid)
	if !l.release(uid) {
		t.Error("a claim seen clean was not released")
	}

	// After a success the volume exists until its PV is saved: a late
	// copy of the claim without the finalizer must not make it clean.
	const done = "done"
	l.begin(done)
	l.created(done)
	l.observeClean(done)
	if l.release(done) || l.state(done).idle() {
		t.Error("a claim whose volume was created looks idle")
	}
}

// TestCreatedVolumeKeepsClaim: after CreateVolume succeeded and before the
// library saved the PV, an old copy of the claim without the finalizer
// (still on its way from the watch) must not let the guard release a claim
// being deleted: the volume exists, and only its PV records it.
func TestCreatedVolumeKeepsClaim(t *testing.T) {
	claim, class := newClaim("c").Finalizers(inflight.Finalizer).Deleted().Obj(), newClass().Obj()
	h := newHarness(t, baseCaps(), objs(claim, class))
	if pv, _, err := h.provision(claim, class); err != nil || pv == nil {
		t.Fatalf("Provision = %v, %v; want a PV", pv, err)
	}
	queue := workqueue.NewTyped[string]()
	defer queue.ShutDown()
	h.p.enqueueClaim(queue, newClaim("c").Obj())
	if err := h.p.guardSync(h.ctx, testNS+"/c"); err != nil {
		t.Fatal(err)
	}
	if !inflight.Has(h.liveClaim(claim)) {
		t.Error("the in-flight finalizer went before the PV of the created volume was saved")
	}
}

// TestLedgerShrinks checks that after a burst the ledger moves what is left
// into a smaller map (a Go map keeps the size of its peak) and keeps every
// state it still holds.
func TestLedgerShrinks(t *testing.T) {
	l := newLedger()
	const n = 10000
	uid := func(i int) types.UID { return types.UID(fmt.Sprintf("uid-%d", i)) }
	for i := range n {
		if i%2 == 0 {
			l.observeClean(uid(i))
		} else if !l.begin(uid(i)) {
			t.Fatalf("begin %d refused", i)
		}
	}
	const kept = 100
	for i := kept; i < n; i++ {
		l.forget(uid(i))
	}
	if l.peak >= n {
		t.Errorf("peak %d after forgetting all but %d of %d claims: the map was not replaced", l.peak, kept, n)
	}
	if len(l.states) != kept {
		t.Fatalf("%d states left, want %d", len(l.states), kept)
	}
	for i := range kept {
		// Seen clean: releasable. Create in flight: not.
		if got, want := l.release(uid(i)), i%2 == 0; got != want {
			t.Errorf("release(%s) = %t, want %t: its state was lost", uid(i), got, want)
		}
	}
}

// TestChangeInflight covers the finalizer writes when the claim vanished or
// was replaced by another claim of the same name.
func TestChangeInflight(t *testing.T) {
	claim := newClaim("c").Obj()
	guarded := newClaim("c").Finalizers(inflight.Finalizer).Obj()
	h := newHarness(t, baseCaps(), nil)
	if err := h.p.addInflight(h.ctx, claim); !errors.Is(err, errClaimGone) {
		t.Errorf("add to a missing claim = %v, want errClaimGone", err)
	}
	if err := h.p.removeInflight(h.ctx, guarded); err != nil {
		t.Errorf("remove from a missing claim = %v, want nil", err)
	}

	replaced := testutil.NewPVC(testNS, "c").UID("uid-new").Finalizers(inflight.Finalizer).Obj()
	h = newHarness(t, baseCaps(), objs(replaced))
	h.client.PrependReactor("update", "persistentvolumeclaims", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewConflict(schema.GroupResource{Resource: "persistentvolumeclaims"}, "c", errors.New("stale"))
	})
	if err := h.p.addInflight(h.ctx, claim); !errors.Is(err, errClaimGone) {
		t.Errorf("add after the claim was replaced = %v, want errClaimGone", err)
	}
	if err := h.p.removeInflight(h.ctx, guarded); err != nil {
		t.Errorf("remove after the claim was replaced = %v, want nil", err)
	}
	if !inflight.Has(h.liveClaim(replaced)) {
		t.Error("the finalizer of the new claim was removed")
	}
}

// TestCreatedVolumeNotCreatedAgain: the library may call Provision again
// after a CreateVolume succeeded, before its informer has the PV it saved.
// With the PV saved, no second CreateVolume is sent (a slow one could
// create the volume again after the claim was bound, deleted and its volume
// deleted); without it, the call is repeated as before (idempotent).
func TestCreatedVolumeNotCreatedAgain(t *testing.T) {
	for _, tt := range []struct {
		name  string
		ref   func(*corev1.PersistentVolumeClaim) *corev1.ObjectReference // the saved PV's claimRef; nil: no PV
		saved bool
	}{
		{name: "PV saved true", saved: true, ref: func(c *corev1.PersistentVolumeClaim) *corev1.ObjectReference {
			// As the library saves it: bound to the claim.
			return &corev1.ObjectReference{Namespace: c.Namespace, Name: c.Name, UID: c.UID}
		}},
		{name: "PV saved false"},
		{
			// A PV of that name that records another claim (a truncated
			// --volume-name-uuid-length, a PV made by hand) is not this
			// claim's.
			name: "PV of that name records another claim",
			ref: func(c *corev1.PersistentVolumeClaim) *corev1.ObjectReference {
				return &corev1.ObjectReference{Namespace: c.Namespace, Name: "other", UID: "uid-other"}
			},
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			claim, class := newClaim("c").Obj(), newClass().Obj()
			h := newHarness(t, baseCaps(), objs(claim, class))
			pv, _, err := h.provision(claim, class)
			if err != nil || pv == nil {
				t.Fatalf("Provision = %v, %v; want a PV", pv, err)
			}
			if tt.ref != nil {
				pv.Spec.ClaimRef = tt.ref(claim)
				if _, err := h.client.CoreV1().PersistentVolumes().Create(h.ctx, pv, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			again, state, err := h.provision(claim, class)
			calls := len(h.driver.createCalls())
			if tt.saved {
				if again != nil || state != controller.ProvisioningFinished || !isIgnoredError(err) || calls != 1 {
					t.Errorf("second Provision = %v, %v, %v with %d CreateVolume calls; want an ignored error and no second call", again, state, err, calls)
				}
				return
			}
			if again == nil || err != nil || calls != 2 {
				t.Errorf("second Provision = %v, %v with %d CreateVolume calls; want the PV from a repeated call", again, err, calls)
			}
		})
	}
}

// TestEnqueueForgetsBoundClaim: a claim seen bound without the in-flight
// finalizer needs no record any more; the ledger forgets it then rather
// than when the claim is deleted, which may be never.
func TestEnqueueForgetsBoundClaim(t *testing.T) {
	h := newHarness(t, baseCaps(), nil)
	queue := workqueue.NewTyped[string]()
	defer queue.ShutDown()
	claim := newClaim("c").VolumeName("pvc-uid-c").Obj()
	h.p.attempts.begin(claim.UID)
	h.p.attempts.created(claim.UID)
	h.p.enqueueClaim(queue, claim)
	if st := h.p.attempts.state(claim.UID); st != attemptUnknown {
		t.Errorf("ledger state of a bound claim without the finalizer = %d, want it forgotten", st)
	}
	if n := queue.Len(); n != 0 {
		t.Errorf("%d keys queued, want none", n)
	}
}

// TestGuardForgetsClaimReplacedThroughRelist: a claim deleted and created
// again under its name while the watch was down comes back as one update
// from the old UID to the new; what the provisioner kept about the old
// claim goes, as it would on a delete.
func TestGuardForgetsClaimReplacedThroughRelist(t *testing.T) {
	old := newClaim("c").UID("uid-old").Finalizers(inflight.Finalizer).Obj()
	cur := newClaim("c").UID("uid-new").Obj()
	h := newHarness(t, baseCaps(), objs(newClass().Obj(), cur))
	h.p.attempts.begin(old.UID)
	queue := workqueue.NewTyped[string]()
	defer queue.ShutDown()
	h.p.claimUpdated(queue, old, cur)
	if got := h.p.attempts.state(old.UID); got != attemptUnknown {
		t.Errorf("ledger state of the replaced claim = %v, want forgotten (%v)", got, attemptUnknown)
	}
	if got := h.p.attempts.state(cur.UID); got != attemptClean {
		t.Errorf("ledger state of the new claim = %v, want clean (%v): seen without the finalizer", got, attemptClean)
	}
}

// TestGuardWarnsWhenClassDeletedAfterClaim: a claim is deleted while its
// CreateVolume has no final answer (it timed out: attemptSent), so it keeps
// the in-flight finalizer; then its StorageClass is deleted. The library can
// no longer ask the driver again, and the guard has a Warning for exactly
// this case (60ed12a), but nothing queues the claim in the guard when a
// class goes: the claim did not change. It stays Terminating without the
// Warning until the informer's resync (an hour).
func TestGuardWarnsWhenClassDeletedAfterClaim(t *testing.T) {
	claim := newClaim("c").Finalizers(inflight.Finalizer).Deleted().Obj()
	// Markers: deleted claims with a final answer, which the guard releases;
	// seeing them released tells that the guard worked through its queue.
	m1 := newClaim("m1").Finalizers(inflight.Finalizer).Deleted().Obj()
	h := newHarness(t, baseCaps(), objs(newClass().Obj(), claim, m1))
	h.p.attempts.begin(claim.UID) // CreateVolume sent, timed out: no final answer
	h.p.attempts.final(m1.UID)

	h.runGuard(t, 1)
	released := func(name string) func(context.Context) (bool, error) {
		return func(ctx context.Context) (bool, error) {
			c, err := h.client.CoreV1().PersistentVolumeClaims(testNS).Get(ctx, name, metav1.GetOptions{})
			return err == nil && !inflight.Has(c), nil
		}
	}
	testutil.Eventually(t, 0, "m1 not released: the guard did not run", released("m1"))
	// m2 is queued after c (one worker, FIFO): once it is released, c was
	// synced with its class still there.
	m2 := newClaim("m2").Finalizers(inflight.Finalizer).Deleted().Obj()
	h.p.attempts.final(m2.UID)
	if _, err := h.client.CoreV1().PersistentVolumeClaims(testNS).Create(t.Context(), m2, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 0, "m2 not released", released("m2"))
	for _, e := range h.events() {
		if strings.Contains(e, "no longer exists") {
			t.Fatalf("class-gone Warning while the class exists: %q", e)
		}
	}

	if err := h.client.StorageV1().StorageClasses().Delete(t.Context(), testClass, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	var seen []string
	testutil.Eventually(t, 0, "no Warning that class "+testClass+" is gone after its deletion (the claim is Terminating with the in-flight finalizer, CreateVolume without a final answer)", func(context.Context) (bool, error) {
		seen = append(seen, h.events()...)
		return slices.ContainsFunc(seen, func(e string) bool { return strings.Contains(e, "its StorageClass "+testClass+" no longer exists") }), nil
	})
}
