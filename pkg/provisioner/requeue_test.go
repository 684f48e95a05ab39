package provisioner

import (
	"slices"
	"sync"
	"testing"

	snapv1 "github.com/kubernetes-csi/external-snapshotter/client/v8/apis/volumesnapshot/v1"
	snapfake "github.com/kubernetes-csi/external-snapshotter/client/v8/clientset/versioned/fake"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/kube-storage/csi-provisioner/internal/testutil"
	"github.com/kube-storage/csi-provisioner/pkg/inflight"
)

// cloneNamed is a claim name in class testClass cloning the claim src.
func cloneNamed(name, src string) *testutil.PVCBuilder {
	return newClaim(name).DataSource(nil, kindClaim, src)
}

// libraryHandler stands for the provisioning library's claim handler: it
// records the claims it is given as an update without a change, which is
// how the provisioner queues a claim (informer updates carry two copies).
type libraryHandler struct {
	mu     sync.Mutex
	queued []string
}

var _ cache.ResourceEventHandler = (*libraryHandler)(nil)

func (l *libraryHandler) OnAdd(interface{}, bool) {}
func (l *libraryHandler) OnDelete(interface{})    {}
func (l *libraryHandler) OnUpdate(old, obj interface{}) {
	if old != obj {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	m, _ := meta.Accessor(obj)
	l.queued = append(l.queued, m.GetName())
}

func (l *libraryHandler) names() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	names := slices.Clone(l.queued)
	slices.Sort(names)
	return names
}

// libraryOn registers a libraryHandler as the library does on its claim
// informer; volumesOn on its volume informer.
func libraryOn(t *testing.T, p *Provisioner) *libraryHandler {
	return handlerOn(t, p.LibraryClaimsInformer())
}

func volumesOn(t *testing.T, p *Provisioner) *libraryHandler {
	return handlerOn(t, p.LibraryVolumesInformer())
}

func handlerOn(t *testing.T, inf cache.SharedIndexInformer) *libraryHandler {
	t.Helper()
	l := &libraryHandler{}
	if _, err := inf.AddEventHandlerWithResyncPeriod(l, 0); err != nil {
		t.Fatal(err)
	}
	return l
}

func TestRequeueClones(t *testing.T) {
	pending := func(b *testutil.PVCBuilder) *corev1.PersistentVolumeClaim { return b.Phase(corev1.ClaimPending).Obj() }
	clones := []runtime.Object{
		pending(cloneOf("src")),
		pending(cloneNamed("clone-by-ref", "src")),
		cloneNamed("bound-clone", "src").Phase(corev1.ClaimBound).Obj(),
		pending(cloneNamed("deleted-clone", "src").Deleted()),
		pending(cloneNamed("other-clone", "other")),
	}
	clones[1].(*corev1.PersistentVolumeClaim).Spec.DataSource = nil
	crossNS := fromNamespace(cloneNamed("cross", "src").Phase(corev1.ClaimPending).Obj(), sourceNS)
	srcInOtherNS := newClaim("src").Obj()
	srcInOtherNS.Namespace = sourceNS

	tests := []struct {
		name     string
		grants   bool
		old, new *corev1.PersistentVolumeClaim
		want     []string
	}{
		{
			name: "the source becomes Bound: its pending clones",
			old:  newClaim("src").Phase(corev1.ClaimPending).Obj(),
			new:  newClaim("src").Phase(corev1.ClaimBound).VolumeName("pv-src").Obj(),
			want: []string{"clone", "clone-by-ref"},
		},
		{
			name: "the source was Bound already: none",
			old:  newClaim("src").Phase(corev1.ClaimBound).VolumeName("pv-src").Obj(),
			new:  newClaim("src").Phase(corev1.ClaimBound).VolumeName("pv-src").Annotation("a", "b").Obj(),
		},
		{
			name: "the source stays Pending: none",
			old:  newClaim("src").Phase(corev1.ClaimPending).Obj(),
			new:  newClaim("src").Phase(corev1.ClaimPending).Annotation("a", "b").Obj(),
		},
		{
			name:   "a source in another namespace becomes Bound: its clones there",
			grants: true,
			old:    srcInOtherNS,
			new: func() *corev1.PersistentVolumeClaim {
				c := srcInOtherNS.DeepCopy()
				c.Status.Phase = corev1.ClaimBound
				return c
			}(),
			want: []string{"cross"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var opts []Option
			if tt.grants {
				opts = append(opts, WithReferenceGrants(&fakeGrants{}))
			}
			h := newHarness(t, cloneCaps(), append(slices.Clone(clones), crossNS), opts...)
			lib := libraryOn(t, h.p)
			h.p.cloneSourceChanged(tt.old, tt.new)
			if got := lib.names(); !slices.Equal(got, tt.want) {
				t.Errorf("queued %v, want %v", got, tt.want)
			}
		})
	}
}

func TestReferenceGrantHandler(t *testing.T) {
	grant := func(namespace, rv string) *unstructured.Unstructured { return referenceGrant(namespace, "g", "v1", rv) }
	claims := []runtime.Object{
		fromNamespace(cloneNamed("cross", "src").Phase(corev1.ClaimPending).Obj(), sourceNS),
		fromNamespace(cloneNamed("cross-bound", "src").Phase(corev1.ClaimBound).VolumeName("pv").Obj(), sourceNS),
		fromNamespace(cloneNamed("cross-elsewhere", "src").Phase(corev1.ClaimPending).Obj(), "elsewhere"),
		cloneNamed("same-namespace", "src").Phase(corev1.ClaimPending).Obj(),
	}
	tests := []struct {
		name   string
		grants bool
		event  func(cache.ResourceEventHandler)
		want   []string
	}{
		{
			name: "created", grants: true,
			event: func(h cache.ResourceEventHandler) { h.OnAdd(grant(sourceNS, "1"), false) },
			want:  []string{"cross"},
		},
		{
			name: "changed", grants: true,
			event: func(h cache.ResourceEventHandler) { h.OnUpdate(grant(sourceNS, "1"), grant(sourceNS, "2")) },
			want:  []string{"cross"},
		},
		{
			name: "in a namespace no claim refers to", grants: true,
			event: func(h cache.ResourceEventHandler) { h.OnAdd(grant("nobody", "1"), false) },
		},
		{
			name: "resynced", grants: true,
			event: func(h cache.ResourceEventHandler) { h.OnUpdate(grant(sourceNS, "1"), grant(sourceNS, "1")) },
		},
		{
			name: "listed at start", grants: true,
			event: func(h cache.ResourceEventHandler) { h.OnAdd(grant(sourceNS, "1"), true) },
		},
		{
			name: "deleted", grants: true,
			event: func(h cache.ResourceEventHandler) { h.OnDelete(grant(sourceNS, "1")) },
		},
		{
			name:  "feature off",
			event: func(h cache.ResourceEventHandler) { h.OnAdd(grant(sourceNS, "1"), false) },
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var opts []Option
			if tt.grants {
				opts = append(opts, WithReferenceGrants(&fakeGrants{}))
			}
			h := newHarness(t, cloneCaps(), claims, opts...)
			lib := libraryOn(t, h.p)
			tt.event(h.p.ReferenceGrantHandler())
			if got := lib.names(); !slices.Equal(got, tt.want) {
				t.Errorf("queued %v, want %v", got, tt.want)
			}
		})
	}
}

func TestRequeueRestores(t *testing.T) {
	group := ptr.To(snapshotAPIGroup)
	restoring := func(name, snap string) *testutil.PVCBuilder {
		return newClaim(name).DataSource(group, kindVolumeSnapshot, snap)
	}
	claims := []runtime.Object{
		restoring("r1", "snap").Phase(corev1.ClaimPending).Obj(),
		restoring("r2", "snap").Obj(), // no phase yet
		restoring("bound", "snap").Phase(corev1.ClaimBound).VolumeName("pv").Obj(),
		restoring("other", "other-snap").Phase(corev1.ClaimPending).Obj(),
		fromNamespace(restoring("cross", "snap").Phase(corev1.ClaimPending).Obj(), sourceNS),
		cloneNamed("clone", "snap").Phase(corev1.ClaimPending).Obj(),
	}
	snapshot := func(namespace string, bound, ready bool) *snapv1.VolumeSnapshot {
		s := &snapv1.VolumeSnapshot{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: "snap"}}
		if bound || ready {
			s.Status = &snapv1.VolumeSnapshotStatus{ReadyToUse: ptr.To(ready)}
			if bound {
				s.Status.BoundVolumeSnapshotContentName = ptr.To("content")
			}
		}
		return s
	}
	tests := []struct {
		name   string
		grants bool
		event  func(p *Provisioner)
		want   []string
	}{
		{
			name:  "becomes ready",
			event: func(p *Provisioner) { p.snapshotChanged(snapshot(testNS, true, false), snapshot(testNS, true, true)) },
			want:  []string{"r1", "r2"},
		},
		{
			name:  "bound and ready in one update",
			event: func(p *Provisioner) { p.snapshotChanged(snapshot(testNS, false, false), snapshot(testNS, true, true)) },
			want:  []string{"r1", "r2"},
		},
		{
			name:  "ready but not bound",
			event: func(p *Provisioner) { p.snapshotChanged(snapshot(testNS, false, false), snapshot(testNS, false, true)) },
		},
		{
			name:  "was ready",
			event: func(p *Provisioner) { p.snapshotChanged(snapshot(testNS, true, true), snapshot(testNS, true, true)) },
		},
		{
			name:  "created ready",
			event: func(p *Provisioner) { p.snapshotAdded(snapshot(testNS, true, true), false) },
			want:  []string{"r1", "r2"},
		},
		{
			name:  "created not ready",
			event: func(p *Provisioner) { p.snapshotAdded(snapshot(testNS, true, false), false) },
		},
		{
			name:  "listed at start",
			event: func(p *Provisioner) { p.snapshotAdded(snapshot(testNS, true, true), true) },
		},
		{
			name:   "in another namespace, with grants",
			grants: true,
			event: func(p *Provisioner) {
				p.snapshotChanged(snapshot(sourceNS, true, false), snapshot(sourceNS, true, true))
			},
			want: []string{"cross"},
		},
		{
			name: "in another namespace, without grants",
			event: func(p *Provisioner) {
				p.snapshotChanged(snapshot(sourceNS, true, false), snapshot(sourceNS, true, true))
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts := []Option{WithSnapshotClient(snapfake.NewSimpleClientset())} //nolint:staticcheck // this clientset has no NewClientset
			if tt.grants {
				opts = append(opts, WithReferenceGrants(&fakeGrants{}))
			}
			h := newHarness(t, snapshotCaps(), claims, opts...)
			lib := libraryOn(t, h.p)
			tt.event(h.p)
			if got := lib.names(); !slices.Equal(got, tt.want) {
				t.Errorf("queued %v, want %v", got, tt.want)
			}
		})
	}
}

func TestRequeueDetached(t *testing.T) {
	caps := baseCaps()
	caps.PublishUnpublish = true
	volumes := []runtime.Object{
		testutil.NewPV("released", testDriver).Phase(corev1.VolumeReleased).Obj(),
		testutil.NewPV("failed", testDriver).Phase(corev1.VolumeFailed).Obj(),
		testutil.NewPV("bound", testDriver).Phase(corev1.VolumeBound).Obj(),
		testutil.NewPV("twice", testDriver).Phase(corev1.VolumeReleased).Obj(),
		attachment("still-there", "twice", "node-b"), // the other attachment of "twice"
	}
	tests := []struct {
		name    string
		deleted interface{}
		want    []string
	}{
		{"the last attachment of a Released volume", attachment("a", "released", "node-a"), []string{"released"}},
		{"the last attachment of a Failed volume", attachment("a", "failed", "node-a"), []string{"failed"}},
		{"seen as a tombstone", cache.DeletedFinalStateUnknown{Key: "a", Obj: attachment("a", "released", "node-a")}, []string{"released"}},
		{"a Bound volume", attachment("a", "bound", "node-a"), nil},
		{"another attachment left", attachment("a", "twice", "node-a"), nil},
		{"a volume not cached", attachment("a", "gone", "node-a"), nil},
		{"an attachment of no volume", &storagev1.VolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: "inline"}}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, caps, volumes)
			lib := volumesOn(t, h.p)
			h.p.attachmentDeleted(tt.deleted)
			if got := lib.names(); !slices.Equal(got, tt.want) {
				t.Errorf("queued %v, want %v", got, tt.want)
			}
		})
	}
}

// capturingInformer stands for the shared claim informer: it keeps the
// handler registered on it, so that a test can deliver updates to it.
type capturingInformer struct {
	cache.SharedIndexInformer
	handler cache.ResourceEventHandler
}

func (c *capturingInformer) AddEventHandlerWithOptions(h cache.ResourceEventHandler, _ cache.HandlerOptions) (cache.ResourceEventHandlerRegistration, error) {
	c.handler = h
	return nil, nil
}

// updateRecorder records the names of the claims of every update it gets.
type updateRecorder struct{ updated []string }

var _ cache.ResourceEventHandler = (*updateRecorder)(nil)

func (r *updateRecorder) OnAdd(interface{}, bool) {}
func (r *updateRecorder) OnDelete(interface{})    {}
func (r *updateRecorder) OnUpdate(_, obj interface{}) {
	m, _ := meta.Accessor(obj)
	r.updated = append(r.updated, m.GetName())
}

// TestLibraryClaimUpdates: the library's claim handlers get every claim
// update except one that only adds or removes the in-flight finalizer, and
// one that brings a version the library already decided to provision
// (read from its cache before the notification came); either would make
// the library sync a claim it is provisioning or has provisioned again and
// count a provisioning failure.
func TestLibraryClaimUpdates(t *testing.T) {
	claim := func() *testutil.PVCBuilder { return newClaim("c").RV("1").Finalizers("kubernetes.io/pvc-protection") }
	withInflight := func() *testutil.PVCBuilder {
		return newClaim("c").RV("2").Finalizers("kubernetes.io/pvc-protection", inflight.Finalizer)
	}
	tests := []struct {
		name     string
		old, new *corev1.PersistentVolumeClaim
		// synced, when set, is the version ShouldProvision said yes to
		// before the update arrived.
		synced *corev1.PersistentVolumeClaim
		want   bool
	}{
		{name: "the provisioner adds the in-flight finalizer", old: claim().Obj(), new: withInflight().Obj()},
		{name: "the guard removes it", old: withInflight().Obj(), new: claim().RV("3").Obj()},
		{name: "the provisioner adds it with the volume name", old: claim().Obj(), new: withInflight().Annotation(inflight.AnnVolumeName, "pvc-uid-c").Obj()},
		{name: "the guard removes both", old: withInflight().Annotation(inflight.AnnVolumeName, "pvc-uid-c").Obj(), new: claim().RV("3").Obj()},
		{name: "the volume name alone changes", old: withInflight().Obj(), new: withInflight().RV("3").Annotation(inflight.AnnVolumeName, "pvc-uid-c").Obj(), want: true},
		{
			name: "the binder hands the claim over with it",
			old:  testutil.NewPVC(testNS, "c").UID("uid-c").Class(testClass).RV("1").Obj(),
			new:  withInflight().Obj(),
			want: true,
		},
		{name: "the binder binds the claim and removes it", old: withInflight().Obj(), new: claim().RV("3").VolumeName("pv").Obj(), want: true},
		{name: "it is removed while the claim's deletion starts", old: withInflight().Obj(), new: claim().RV("3").Deleted().Obj(), want: true},
		{name: "another finalizer changes", old: claim().Obj(), new: newClaim("c").RV("2").Obj(), want: true},
		{name: "an annotation changes", old: withInflight().Obj(), new: withInflight().RV("3").Annotation("a", "b").Obj(), want: true},
		{name: "a resync", old: withInflight().Obj(), new: withInflight().Obj(), want: true},
		{
			name:   "kube-controller-manager's hand-over, provisioned from the cache before its notification",
			old:    testutil.NewPVC(testNS, "c").UID("uid-c").Class(testClass).RV("1").Obj(),
			new:    newClaim("c").RV("2").Obj(),
			synced: newClaim("c").RV("2").Obj(),
		},
		{
			name:   "a version newer than the one provisioned",
			old:    newClaim("c").RV("2").Obj(),
			new:    newClaim("c").RV("3").VolumeName("pv").Obj(),
			synced: newClaim("c").RV("2").Obj(),
			want:   true,
		},
		{
			name:   "a resync of the version provisioned",
			old:    newClaim("c").RV("2").Obj(),
			new:    newClaim("c").RV("2").Obj(),
			synced: newClaim("c").RV("2").Obj(),
			want:   true,
		},
		{
			name:   "another claim's version",
			old:    testutil.NewPVC(testNS, "c").UID("uid-c").Class(testClass).RV("1").Obj(),
			new:    newClaim("c").RV("2").Obj(),
			synced: newClaim("d").RV("2").Obj(),
			want:   true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, cloneCaps(), nil)
			inf := &capturingInformer{}
			lib := &libraryInformer{SharedIndexInformer: inf, skip: h.p.libraryClaims.skip}
			rec := &updateRecorder{}
			if _, err := lib.AddEventHandler(rec); err != nil {
				t.Fatal(err)
			}
			if tt.synced != nil && !h.p.ShouldProvision(h.ctx, tt.synced) {
				t.Fatal("ShouldProvision = false, want true")
			}
			inf.handler.OnUpdate(tt.old, tt.new)
			if got := len(rec.updated) == 1; got != tt.want {
				t.Errorf("library got the update: %v, want %v", got, tt.want)
			}
			lib.requeue(tt.new)
			if n := len(rec.updated); n == 0 || rec.updated[n-1] != "c" {
				t.Errorf("requeue did not reach the library: %v", rec.updated)
			}
		})
	}
}
