package binder

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/kube-storage/csi-provisioner/internal/testutil"
)

const (
	driver      = "csi.example.com"
	otherDriver = "other.example.com"
	ns          = "ns"
)

// now is the fake clock's start. Claims are created a second earlier, well
// within the provisioning grace of the tests (30s) unless a test says otherwise.
var (
	now     = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	created = now.Add(-time.Second)
	// turnC1 is how long a claim c1 that is nobody's waits from now for
	// this binder's turn to explain it (unowned.go).
	turnC1 = MissingClassTurn("uid-c1", driver) - time.Second
)

var (
	pvGVR  = corev1.SchemeGroupVersion.WithResource("persistentvolumes")
	pvcGVR = corev1.SchemeGroupVersion.WithResource("persistentvolumeclaims")
)

// Builders with the defaults of these tests: claims in namespace ns with UID
// "uid-<name>", volumes of driver with UID "uid-<name>".
func claimB(name string) *testutil.PVCBuilder {
	return testutil.NewPVC(ns, name).UID("uid-" + name).Created(created)
}

func volumeB(name string) *testutil.PVBuilder { return testutil.NewPV(name, driver).UID("uid-" + name) }

func classFast() *storagev1.StorageClass { return testutil.NewSC("fast", driver).Obj() }
func classWait() *storagev1.StorageClass {
	return testutil.NewSC("wait", driver).WaitForFirstConsumer().Obj()
}
func classOther() *storagev1.StorageClass { return testutil.NewSC("other", otherDriver).Obj() }

// apiServer makes the fake clientset behave like the API server where the
// binder depends on it: updates are rejected with a conflict when their
// resourceVersion is stale, every write gets a new resourceVersion, an update
// of the main resource keeps the stored status and an update of the status
// subresource keeps everything else, and an update that removes the last
// finalizer of an object being deleted deletes it. It can also fail chosen
// writes.
type apiServer struct {
	tracker k8stesting.ObjectTracker

	mu     sync.Mutex
	rv     int64
	writes int
	// fail, when set, is asked before each write (numbered from 1) and
	// returns the error to fail it with.
	fail func(n int, a k8stesting.Action) error
	// observe, when set, sees each successful update (old and new object).
	observe func(old, updated runtime.Object)
	// ignoreRV turns the resourceVersion check off (every update wins).
	ignoreRV bool
}

func installAPIServer(client *fake.Clientset) *apiServer {
	s := &apiServer{tracker: client.Tracker(), rv: 1000}
	for _, resource := range []string{"persistentvolumes", "persistentvolumeclaims"} {
		client.PrependReactor("update", resource, s.update)
	}
	return s
}

func (s *apiServer) update(action k8stesting.Action) (bool, runtime.Object, error) {
	ua := action.(k8stesting.UpdateAction)
	obj := ua.GetObject()
	m, err := meta.Accessor(obj)
	if err != nil {
		return true, nil, err
	}
	gvr, namespace := action.GetResource(), action.GetNamespace()

	s.mu.Lock()
	defer s.mu.Unlock()
	s.writes++
	if s.fail != nil {
		if err := s.fail(s.writes, action); err != nil {
			return true, nil, err
		}
	}
	cur, err := s.tracker.Get(gvr, namespace, m.GetName())
	if err != nil {
		return true, nil, err
	}
	cm, _ := meta.Accessor(cur)
	if rv := m.GetResourceVersion(); !s.ignoreRV && rv != "" && rv != cm.GetResourceVersion() {
		return true, nil, apierrors.NewConflict(gvr.GroupResource(), m.GetName(),
			fmt.Errorf("the object has been modified; please apply your changes to the latest version and try again"))
	}
	status := action.GetSubresource() == "status"
	var next runtime.Object
	switch c := cur.(type) {
	case *corev1.PersistentVolume:
		sent := obj.(*corev1.PersistentVolume)
		var o *corev1.PersistentVolume
		if status {
			o = c.DeepCopy()
			o.Status = *sent.Status.DeepCopy()
		} else {
			o = sent.DeepCopy()
			o.Status = *c.Status.DeepCopy()
		}
		next = o
	case *corev1.PersistentVolumeClaim:
		sent := obj.(*corev1.PersistentVolumeClaim)
		var o *corev1.PersistentVolumeClaim
		if status {
			o = c.DeepCopy()
			o.Status = *sent.Status.DeepCopy()
		} else {
			o = sent.DeepCopy()
			o.Status = *c.Status.DeepCopy()
		}
		next = o
	default:
		return false, nil, nil
	}
	s.rv++
	nm, _ := meta.Accessor(next)
	nm.SetResourceVersion(strconv.FormatInt(s.rv, 10))
	if !status && nm.GetDeletionTimestamp() != nil && len(nm.GetFinalizers()) == 0 {
		// The API server deletes an object being deleted once an update
		// removes its last finalizer, and answers with the object.
		if err := s.tracker.Delete(gvr, namespace, nm.GetName()); err != nil {
			return true, nil, err
		}
		return true, next.DeepCopyObject(), nil
	}
	if err := s.tracker.Update(gvr, next, namespace); err != nil {
		return true, nil, err
	}
	if s.observe != nil {
		s.observe(cur, next)
	}
	return true, next.DeepCopyObject(), nil
}

// eventLog is a hand-written record.EventRecorder that keeps what reaches it.
type eventLog struct {
	mu     sync.Mutex
	events []string
}

var _ record.EventRecorder = (*eventLog)(nil)

func (e *eventLog) Event(object runtime.Object, eventtype, reason, message string) {
	var who string
	switch o := object.(type) {
	case *corev1.PersistentVolume:
		who = "pv/" + o.Name
	case *corev1.PersistentVolumeClaim:
		who = "pvc/" + o.Name
	default:
		who = fmt.Sprintf("%T", object)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.events = append(e.events, fmt.Sprintf("%s %s %s %s", who, eventtype, reason, message))
}

func (e *eventLog) Eventf(object runtime.Object, eventtype, reason, messageFmt string, args ...interface{}) {
	e.Event(object, eventtype, reason, fmt.Sprintf(messageFmt, args...))
}

func (e *eventLog) AnnotatedEventf(object runtime.Object, _ map[string]string, eventtype, reason, messageFmt string, args ...interface{}) {
	e.Event(object, eventtype, reason, fmt.Sprintf(messageFmt, args...))
}

func (e *eventLog) take() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := e.events
	e.events = nil
	return out
}

// fixture is a binder over a fake clientset whose informers are not running:
// their stores are filled from the fake API by loadInformers, so a test
// decides when "the informer catches up".
type fixture struct {
	t       *testing.T
	ctx     context.Context
	client  *fake.Clientset
	api     *apiServer
	factory informers.SharedInformerFactory
	binder  *Binder
	events  *eventLog
	clock   *testingclock.FakeClock
}

func newFixture(t *testing.T, objs []runtime.Object, opts ...Option) *fixture {
	t.Helper()
	client := fake.NewSimpleClientset(objs...)
	f := &fixture{
		t:       t,
		ctx:     klog.NewContext(t.Context(), ktesting.NewLogger(t, ktesting.NewConfig(ktesting.Verbosity(5)))),
		client:  client,
		api:     installAPIServer(client),
		factory: informers.NewSharedInformerFactory(client, 0),
		events:  &eventLog{},
		clock:   testingclock.NewFakeClock(now),
	}
	opts = append([]Option{WithEventRecorder(f.events), WithClock(f.clock), WithProvisioningGrace(30 * time.Second)}, opts...)
	b, err := New(client, driver, f.factory, opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	f.binder = b
	f.loadInformers()
	client.ClearActions()
	return f
}

// loadInformers replaces the informer stores with the API's current objects.
func (f *fixture) loadInformers() {
	f.t.Helper()
	for _, x := range []struct {
		store interface {
			Replace([]interface{}, string) error
		}
		gvr  schema.GroupVersionResource
		kind string
	}{
		{f.factory.Core().V1().PersistentVolumes().Informer().GetStore(), pvGVR, "PersistentVolume"},
		{f.factory.Core().V1().PersistentVolumeClaims().Informer().GetStore(), pvcGVR, "PersistentVolumeClaim"},
		{f.factory.Storage().V1().StorageClasses().Informer().GetStore(), storagev1.SchemeGroupVersion.WithResource("storageclasses"), "StorageClass"},
		{f.factory.Core().V1().Pods().Informer().GetStore(), corev1.SchemeGroupVersion.WithResource("pods"), "Pod"},
	} {
		list, err := f.client.Tracker().List(x.gvr, x.gvr.GroupVersion().WithKind(x.kind), "")
		if err != nil {
			f.t.Fatalf("list %s: %v", x.gvr.Resource, err)
		}
		items, err := meta.ExtractList(list)
		if err != nil {
			f.t.Fatalf("extract %s: %v", x.gvr.Resource, err)
		}
		objs := make([]interface{}, len(items))
		for i := range items {
			objs[i] = items[i]
		}
		if err := x.store.Replace(objs, ""); err != nil {
			f.t.Fatalf("replace %s: %v", x.gvr.Resource, err)
		}
	}
}

// actions returns the client calls since the last call, as "verb kind/name"
// ("status" for an update of the status subresource).
func (f *fixture) actions() []string {
	var out []string
	for _, a := range f.client.Actions() {
		verb := a.GetVerb()
		if verb == "list" || verb == "watch" {
			continue
		}
		if a.GetSubresource() == "status" {
			verb = "status"
		}
		kind := map[string]string{"persistentvolumes": "pv", "persistentvolumeclaims": "pvc"}[a.GetResource().Resource]
		if kind == "" {
			kind = a.GetResource().Resource
		}
		var name string
		switch a := a.(type) {
		case k8stesting.UpdateAction:
			name = a.GetObject().(metav1.Object).GetName()
		case k8stesting.GetAction:
			name = a.GetName()
		}
		out = append(out, verb+" "+kind+"/"+name)
	}
	f.client.ClearActions()
	return out
}

// writes returns actions() without reads.
func writesOnly(actions []string) []string {
	return slices.DeleteFunc(slices.Clone(actions), func(a string) bool { return strings.HasPrefix(a, "get ") })
}

func (f *fixture) volume(name string) *corev1.PersistentVolume {
	f.t.Helper()
	o, err := f.client.Tracker().Get(pvGVR, "", name)
	if err != nil {
		return nil
	}
	return o.(*corev1.PersistentVolume)
}

func (f *fixture) claim(name string) *corev1.PersistentVolumeClaim {
	f.t.Helper()
	o, err := f.client.Tracker().Get(pvcGVR, ns, name)
	if err != nil {
		return nil
	}
	return o.(*corev1.PersistentVolumeClaim)
}

func (f *fixture) volumes() []*corev1.PersistentVolume {
	list, err := f.client.Tracker().List(pvGVR, corev1.SchemeGroupVersion.WithKind("PersistentVolume"), "")
	if err != nil {
		f.t.Fatal(err)
	}
	var out []*corev1.PersistentVolume
	for i := range list.(*corev1.PersistentVolumeList).Items {
		out = append(out, &list.(*corev1.PersistentVolumeList).Items[i])
	}
	return out
}

func (f *fixture) claims() []*corev1.PersistentVolumeClaim {
	list, err := f.client.Tracker().List(pvcGVR, corev1.SchemeGroupVersion.WithKind("PersistentVolumeClaim"), "")
	if err != nil {
		f.t.Fatal(err)
	}
	var out []*corev1.PersistentVolumeClaim
	for i := range list.(*corev1.PersistentVolumeClaimList).Items {
		out = append(out, &list.(*corev1.PersistentVolumeClaimList).Items[i])
	}
	return out
}

// cmpOpts compare API objects by meaning: quantities by value, times by
// instant, and without resourceVersions (they are the fake API's business).
var cmpOpts = []cmp.Option{
	cmp.Comparer(func(a, b resource.Quantity) bool { return a.Cmp(b) == 0 }),
	cmp.Comparer(func(a, b metav1.Time) bool { return a.Equal(&b) }),
	cmp.FilterPath(func(p cmp.Path) bool {
		return strings.HasSuffix(p.String(), "ResourceVersion")
	}, cmp.Ignore()),
}

// Expected results of a binding, built independently of the code under
// test.

// boundVolume returns pv as bind leaves it for claim.
func boundVolume(pv *corev1.PersistentVolume, claim *corev1.PersistentVolumeClaim, byController bool) *corev1.PersistentVolume {
	pv = pv.DeepCopy()
	pv.Spec.ClaimRef = &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1",
		Namespace: claim.Namespace, Name: claim.Name, UID: claim.UID}
	if byController {
		metav1.SetMetaDataAnnotation(&pv.ObjectMeta, "pv.kubernetes.io/bound-by-controller", "yes")
	}
	pv.Status.Phase = corev1.VolumeBound
	pv.Status.Message = ""
	return pv
}

// boundClaim returns claim as bind leaves it for pv.
func boundClaim(claim *corev1.PersistentVolumeClaim, pv *corev1.PersistentVolume, byController bool) *corev1.PersistentVolumeClaim {
	claim = claim.DeepCopy()
	if claim.Spec.VolumeName == "" || byController {
		claim.Spec.VolumeName = pv.Name
		if byController {
			metav1.SetMetaDataAnnotation(&claim.ObjectMeta, "pv.kubernetes.io/bound-by-controller", "yes")
		}
	}
	metav1.SetMetaDataAnnotation(&claim.ObjectMeta, "pv.kubernetes.io/bind-completed", "yes")
	claim.Finalizers = slices.DeleteFunc(claim.Finalizers, func(s string) bool { return s == "csi-provisioner.kube-storage.io/provisioning" })
	if len(claim.Finalizers) == 0 {
		claim.Finalizers = nil
	}
	if claim.Status.Phase != corev1.ClaimBound {
		claim.Status.Capacity = pv.Spec.Capacity.DeepCopy()
		if claim.Status.Phase == corev1.ClaimPending {
			claim.Status.CurrentVolumeAttributesClassName = pv.Spec.VolumeAttributesClassName
		}
	}
	claim.Status.Phase = corev1.ClaimBound
	claim.Status.AccessModes = pv.Spec.AccessModes
	return claim
}

func objs(list ...runtime.Object) []runtime.Object { return list }

// syncCase is one row of the sync tables: objects in the API and the
// informers, one sync, and everything it must have done.
type syncCase struct {
	name    string
	objects []runtime.Object
	opts    []Option
	// setup runs after the informers are loaded, to make them differ from
	// the API.
	setup func(f *fixture)
	// sync is "pvc/<name>" (in namespace ns) or "pv/<name>".
	sync string

	// claims and volumes are the objects the sync changed, as they must
	// end up; every other object must be unchanged.
	claims  []*corev1.PersistentVolumeClaim
	volumes []*corev1.PersistentVolume
	// actions are the client calls, in order ("get pvc/c1", "update pv/pv1",
	// "status pvc/c1").
	actions []string
	events  []string
	wantErr bool
	// requeueAfter is the delay the sync asks for.
	requeueAfter time.Duration
	// queued are the keys the sync queued ("pvc/ns/c1", "pv/pv1").
	queued []string
}

func runSyncCases(t *testing.T, cases []syncCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, tc.objects, tc.opts...)
			if tc.setup != nil {
				tc.setup(f)
			}
			cached := f.cachedObjects()
			before := make([]runtime.Object, len(cached))
			for i, o := range cached {
				before[i] = o.DeepCopyObject()
			}
			res, err := f.runSync(tc.sync)
			if (err != nil) != tc.wantErr {
				t.Errorf("sync error = %v, want error: %v", err, tc.wantErr)
			}
			if res.requeueAfter != tc.requeueAfter {
				t.Errorf("requeueAfter = %v, want %v", res.requeueAfter, tc.requeueAfter)
			}
			if diff := cmp.Diff(tc.actions, f.actions()); diff != "" {
				t.Errorf("actions (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.events, f.events.take()); diff != "" {
				t.Errorf("events (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.queued, f.queued()); diff != "" {
				t.Errorf("queued (-want +got):\n%s", diff)
			}
			f.checkState(tc.objects, tc.claims, tc.volumes)
			for i, o := range cached {
				if diff := cmp.Diff(before[i], o, cmpOpts...); diff != "" {
					t.Errorf("the binder modified an informer's object (-before +after):\n%s", diff)
				}
			}
		})
	}
}

// runSync runs one sync named "pvc/<name>" or "pv/<name>".
func (f *fixture) runSync(what string) (result, error) {
	f.t.Helper()
	kind, name, _ := strings.Cut(what, "/")
	switch kind {
	case "pvc":
		return f.binder.syncClaim(f.ctx, ns+"/"+name)
	case "pv":
		return f.binder.syncVolume(f.ctx, name)
	}
	f.t.Fatalf("bad sync %q", what)
	return result{}, nil
}

// queued drains both queues of the keys added without delay.
func (f *fixture) queued() []string {
	var out []string
	for f.binder.claimQueue.Len() > 0 {
		k, _ := f.binder.claimQueue.Get()
		f.binder.claimQueue.Done(k)
		out = append(out, "pvc/"+k)
	}
	for f.binder.volumeQueue.Len() > 0 {
		k, _ := f.binder.volumeQueue.Get()
		f.binder.volumeQueue.Done(k)
		out = append(out, "pv/"+k)
	}
	return out
}

// checkState compares the API's claims and volumes with the initial objects
// overridden by the expected changed ones.
func (f *fixture) checkState(initial []runtime.Object, claims []*corev1.PersistentVolumeClaim, volumes []*corev1.PersistentVolume) {
	f.t.Helper()
	wantClaims := map[string]*corev1.PersistentVolumeClaim{}
	wantVolumes := map[string]*corev1.PersistentVolume{}
	for _, o := range initial {
		switch o := o.(type) {
		case *corev1.PersistentVolumeClaim:
			wantClaims[o.Name] = o
		case *corev1.PersistentVolume:
			wantVolumes[o.Name] = o
		}
	}
	for _, c := range claims {
		wantClaims[c.Name] = c
	}
	for _, v := range volumes {
		wantVolumes[v.Name] = v
	}
	gotClaims := map[string]*corev1.PersistentVolumeClaim{}
	for _, c := range f.claims() {
		gotClaims[c.Name] = c
	}
	gotVolumes := map[string]*corev1.PersistentVolume{}
	for _, v := range f.volumes() {
		gotVolumes[v.Name] = v
	}
	if diff := cmp.Diff(wantClaims, gotClaims, cmpOpts...); diff != "" {
		f.t.Errorf("claims (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(wantVolumes, gotVolumes, cmpOpts...); diff != "" {
		f.t.Errorf("volumes (-want +got):\n%s", diff)
	}
}

// cachedObjects returns the objects in the informers' stores (the shared
// copies the binder must never modify).
func (f *fixture) cachedObjects() []runtime.Object {
	var out []runtime.Object
	for _, inf := range []cache.SharedIndexInformer{
		f.factory.Core().V1().PersistentVolumes().Informer(),
		f.factory.Core().V1().PersistentVolumeClaims().Informer(),
		f.factory.Storage().V1().StorageClasses().Informer(),
		f.factory.Core().V1().Pods().Informer(),
	} {
		for _, o := range inf.GetStore().List() {
			out = append(out, o.(runtime.Object))
		}
	}
	return out
}

// hideFromInformer removes an object from the informer's store only.
func (f *fixture) hideFromInformer(o runtime.Object) {
	f.t.Helper()
	if err := f.store(o).Delete(o); err != nil {
		f.t.Fatal(err)
	}
}

// putInInformer puts a (different) copy of an object in the informer's store
// only.
func (f *fixture) putInInformer(o runtime.Object) {
	f.t.Helper()
	if err := f.store(o).Update(o); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) store(o runtime.Object) interface {
	Update(interface{}) error
	Delete(interface{}) error
} {
	switch o.(type) {
	case *corev1.PersistentVolumeClaim:
		return f.factory.Core().V1().PersistentVolumeClaims().Informer().GetStore()
	case *corev1.PersistentVolume:
		return f.factory.Core().V1().PersistentVolumes().Informer().GetStore()
	case *storagev1.StorageClass:
		return f.factory.Storage().V1().StorageClasses().Informer().GetStore()
	}
	f.t.Fatalf("no store for %T", o)
	return nil
}
