package capacity

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	"github.com/kube-storage/csi-provisioner/internal/testutil"
)

// write is one API write of the controller, for comparison.
type write struct {
	Verb string
	Name string
	Obj  *storagev1.CSIStorageCapacity
}

func writesOf(actions []clienttesting.Action) []write {
	var out []write
	for _, a := range actions {
		switch a.GetVerb() {
		case "create":
			obj := a.(clienttesting.CreateAction).GetObject().(*storagev1.CSIStorageCapacity)
			out = append(out, write{Verb: "create", Obj: obj})
		case "update":
			obj := a.(clienttesting.UpdateAction).GetObject().(*storagev1.CSIStorageCapacity)
			out = append(out, write{Verb: "update", Name: obj.Name, Obj: obj})
		case "delete":
			out = append(out, write{Verb: "delete", Name: a.(clienttesting.DeleteAction).GetName()})
		}
	}
	return out
}

func objects(groups ...[]runtime.Object) []runtime.Object { return slices.Concat(groups...) }

func one(objs ...runtime.Object) []runtime.Object { return objs }

func TestSync(t *testing.T) {
	// Class "fast" (WaitForFirstConsumer) over zones a (two nodes) and b.
	base := objects(one(wffc("fast")), zoneNode("n1", "a"), zoneNode("n2", "a"), zoneNode("n3", "b"))
	ka, kb := itemKey("fast", zone("a")), itemKey("fast", zone("b"))
	otherOwner := metav1.OwnerReference{APIVersion: "v1", Kind: "ConfigMap", Name: "other", UID: "uid-other"}
	oldController := metav1.OwnerReference{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "csi-provisioner-1", UID: "uid-rs-1", Controller: ptr.To(true)}
	conflict := apierrors.NewConflict(schema.GroupResource{Group: "storage.k8s.io", Resource: "csistoragecapacities"}, "csisc-old", errors.New("changed"))
	errDriver := errors.New("driver unavailable")
	matchExpr := func(o *storagev1.CSIStorageCapacity) {
		o.NodeTopology.MatchExpressions = []metav1.LabelSelectorRequirement{{Key: "x", Operator: metav1.LabelSelectorOpExists}}
	}

	// A driver without topology keys: one empty segment for all nodes.
	flat := objects(one(wffc("fast"), testutil.NewNode("n1", nil), testutil.NewCSINode("n1", testDriver)))
	kflat := itemKey("fast", segment{})
	allNodes := func(o *storagev1.CSIStorageCapacity) { o.NodeTopology = &metav1.LabelSelector{} }

	tests := []struct {
		name      string
		objs      []runtime.Object
		opts      []Option
		driver    *fakeDriver
		failWrite error // returned by every update
		keys      []string
		wantErr   func(error) bool
		want      []write
		wantCalls int
	}{
		{
			name:      "driver without topology: one object selecting every node",
			objs:      flat,
			driver:    &fakeDriver{available: gi(100)},
			keys:      []string{kflat},
			want:      []write{{Verb: "create", Obj: newCSC("fast", "", gi(100), allNodes)}},
			wantCalls: 1,
		},
		{
			name:      "driver without topology: the existing object is adopted",
			objs:      objects(flat, one(csc("csisc-flat", "fast", "", gi(100), allNodes))),
			driver:    &fakeDriver{available: gi(100)},
			keys:      []string{kflat},
			wantCalls: 1,
		},
		{
			name:      "creates one object per segment",
			objs:      base,
			driver:    &fakeDriver{available: gi(100), bySegment: map[string]int64{zone("b").String(): gi(50)}},
			keys:      []string{ka, kb},
			want:      []write{{Verb: "create", Obj: newCSC("fast", "a", gi(100))}, {Verb: "create", Obj: newCSC("fast", "b", gi(50))}},
			wantCalls: 2,
		},
		{
			name:      "creates with owner and maximum volume size",
			objs:      base,
			opts:      []Option{WithOwner(&testOwner)},
			driver:    &fakeDriver{available: gi(100), maxSize: ptr.To(gi(10))},
			keys:      []string{ka},
			want:      []write{{Verb: "create", Obj: newCSC("fast", "a", gi(100), withMax(gi(10)), withOwners(testOwner))}},
			wantCalls: 1,
		},
		{
			name:      "zero capacity is published",
			objs:      base,
			keys:      []string{ka},
			want:      []write{{Verb: "create", Obj: newCSC("fast", "a", 0)}},
			wantCalls: 1,
		},
		{
			name:      "unchanged object is adopted without writes",
			objs:      objects(base, one(csc("csisc-old", "fast", "a", gi(100)))),
			driver:    &fakeDriver{available: gi(100)},
			keys:      []string{ka},
			wantCalls: 1,
		},
		{
			name:      "changed capacity is updated",
			objs:      objects(base, one(csc("csisc-old", "fast", "a", gi(50)))),
			driver:    &fakeDriver{available: gi(100)},
			keys:      []string{ka},
			want:      []write{{Verb: "update", Name: "csisc-old", Obj: csc("csisc-old", "fast", "a", gi(100))}},
			wantCalls: 1,
		},
		{
			name:      "maximum volume size dropped when the driver reports none",
			objs:      objects(base, one(csc("csisc-old", "fast", "a", gi(100), withMax(gi(10))))),
			driver:    &fakeDriver{available: gi(100)},
			keys:      []string{ka},
			want:      []write{{Verb: "update", Name: "csisc-old", Obj: csc("csisc-old", "fast", "a", gi(100))}},
			wantCalls: 1,
		},
		{
			name:      "maximum volume size changed",
			objs:      objects(base, one(csc("csisc-old", "fast", "a", gi(100), withMax(gi(10))))),
			driver:    &fakeDriver{available: gi(100), maxSize: ptr.To(gi(5))},
			keys:      []string{ka},
			want:      []write{{Verb: "update", Name: "csisc-old", Obj: csc("csisc-old", "fast", "a", gi(100), withMax(gi(5)))}},
			wantCalls: 1,
		},
		{
			name:      "missing owner is added, other owners kept",
			objs:      objects(base, one(csc("csisc-old", "fast", "a", gi(100), withOwners(otherOwner)))),
			opts:      []Option{WithOwner(&testOwner)},
			driver:    &fakeDriver{available: gi(100)},
			keys:      []string{ka},
			want:      []write{{Verb: "update", Name: "csisc-old", Obj: csc("csisc-old", "fast", "a", gi(100), withOwners(otherOwner, testOwner))}},
			wantCalls: 1,
		},
		{
			name:      "another controller (an earlier ReplicaSet) is replaced: the API server allows one",
			objs:      objects(base, one(csc("csisc-old", "fast", "a", gi(100), withOwners(otherOwner, oldController)))),
			opts:      []Option{WithOwner(&testOwner)},
			driver:    &fakeDriver{available: gi(100)},
			keys:      []string{ka},
			want:      []write{{Verb: "update", Name: "csisc-old", Obj: csc("csisc-old", "fast", "a", gi(100), withOwners(otherOwner, testOwner))}},
			wantCalls: 1,
		},
		{
			name:      "owner present: no write",
			objs:      objects(base, one(csc("csisc-old", "fast", "a", gi(100), withOwners(testOwner)))),
			opts:      []Option{WithOwner(&testOwner)},
			driver:    &fakeDriver{available: gi(100)},
			keys:      []string{ka},
			wantCalls: 1,
		},
		{
			name: "duplicates reduced to the oldest",
			objs: objects(base, one(
				csc("csisc-new", "fast", "a", gi(100), withCreated(200)),
				csc("csisc-old", "fast", "a", gi(100), withCreated(100)))),
			driver:    &fakeDriver{available: gi(100)},
			keys:      []string{ka},
			want:      []write{{Verb: "delete", Name: "csisc-new"}},
			wantCalls: 1,
		},
		{
			name: "duplicates: newer deleted, oldest updated",
			objs: objects(base, one(
				csc("csisc-old", "fast", "a", gi(50), withCreated(100)),
				csc("csisc-b", "fast", "a", gi(100), withCreated(200)),
				csc("csisc-a", "fast", "a", gi(100), withCreated(200)))),
			driver: &fakeDriver{available: gi(100)},
			keys:   []string{ka},
			want: []write{
				{Verb: "delete", Name: "csisc-a"},
				{Verb: "delete", Name: "csisc-b"},
				{Verb: "update", Name: "csisc-old", Obj: csc("csisc-old", "fast", "a", gi(100), withCreated(100))},
			},
			wantCalls: 1,
		},
		{
			name:      "GetCapacity error leaves the object",
			objs:      objects(base, one(csc("csisc-old", "fast", "a", gi(50)))),
			driver:    &fakeDriver{err: errDriver},
			keys:      []string{ka},
			wantErr:   func(err error) bool { return errors.Is(err, errDriver) },
			wantCalls: 1,
		},
		{
			name:      "GetCapacity error creates nothing",
			objs:      base,
			driver:    &fakeDriver{err: errDriver},
			keys:      []string{ka},
			wantErr:   func(err error) bool { return errors.Is(err, errDriver) },
			wantCalls: 1,
		},
		{
			name:      "conflict on update is returned for a retry",
			objs:      objects(base, one(csc("csisc-old", "fast", "a", gi(50)))),
			driver:    &fakeDriver{available: gi(100)},
			failWrite: conflict,
			keys:      []string{ka},
			wantErr:   apierrors.IsConflict,
			want:      []write{{Verb: "update", Name: "csisc-old", Obj: csc("csisc-old", "fast", "a", gi(100))}},
			wantCalls: 1,
		},
		{
			name:      "item no longer desired: nothing",
			objs:      base,
			keys:      []string{itemKey("gone", zone("a"))},
			want:      nil,
			wantCalls: 0,
		},
		{
			name: "object of a deleted class is deleted",
			objs: objects(base, one(csc("csisc-gone", "gone", "a", gi(1)))),
			keys: []string{objectKey("csisc-gone")},
			want: []write{{Verb: "delete", Name: "csisc-gone"}},
		},
		{
			name: "object of an Immediate class is deleted",
			objs: objects(base, one(immediate("slow"), csc("csisc-slow", "slow", "a", gi(1)))),
			keys: []string{objectKey("csisc-slow")},
			want: []write{{Verb: "delete", Name: "csisc-slow"}},
		},
		{
			name: "object of an Immediate class is kept with the option",
			objs: objects(base, one(immediate("slow"), csc("csisc-slow", "slow", "a", gi(1)))),
			opts: []Option{WithImmediateBinding(true)},
			keys: []string{objectKey("csisc-slow")},
		},
		{
			name: "object of a vanished segment is deleted",
			objs: objects(base, one(csc("csisc-c", "fast", "c", gi(1)))),
			keys: []string{objectKey("csisc-c")},
			want: []write{{Verb: "delete", Name: "csisc-c"}},
		},
		{
			name: "object with match expressions is deleted",
			objs: objects(base, one(csc("csisc-x", "fast", "a", gi(1), matchExpr))),
			keys: []string{objectKey("csisc-x")},
			want: []write{{Verb: "delete", Name: "csisc-x"}},
		},
		{
			name: "desired object is not deleted",
			objs: objects(base, one(csc("csisc-old", "fast", "a", gi(1)))),
			keys: []string{objectKey("csisc-old")},
		},
		{
			name: "object already gone: nothing",
			objs: base,
			keys: []string{objectKey("csisc-gone")},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			driver := tt.driver
			if driver == nil {
				driver = &fakeDriver{}
			}
			h := newHarness(t, tt.objs, driver, tt.opts...)
			if tt.failWrite != nil {
				h.client.PrependReactor("update", "csistoragecapacities", func(clienttesting.Action) (bool, runtime.Object, error) {
					return true, nil, tt.failWrite
				})
			}
			ctx := testContext(t)
			var errs []error
			for _, key := range tt.keys {
				if err := h.c.sync(ctx, key); err != nil {
					errs = append(errs, err)
				}
			}
			err := errors.Join(errs...)
			switch {
			case tt.wantErr == nil && err != nil:
				t.Errorf("sync: unexpected error %v", err)
			case tt.wantErr != nil && (err == nil || !tt.wantErr(err)):
				t.Errorf("sync: got error %v, want a different one", err)
			}
			if diff := cmp.Diff(tt.want, writesOf(h.writes()), cmpOpts...); diff != "" {
				t.Errorf("writes (-want +got):\n%s", diff)
			}
			if got := len(h.driver.calls()); got != tt.wantCalls {
				t.Errorf("GetCapacity calls: got %d, want %d", got, tt.wantCalls)
			}
		})
	}
}

// TestGetCapacityRequest checks the request: the class's parameters as
// CreateVolume gets them (without the sidecar's csi.storage.k8s.io/ keys,
// which upstream passes on and drivers that check their parameters
// refuse) and the segment, or no accessible topology at all for the empty
// segment of a driver without topology keys: the CSI spec forbids the
// field unless the plugin has VOLUME_ACCESSIBILITY_CONSTRAINTS
// (GetCapacityRequest.accessible_topology), and the empty segment covers
// every node, which is what a request without it asks for.
func TestGetCapacityRequest(t *testing.T) {
	class := func() *storagev1.StorageClass {
		c := wffc("fast")
		c.Parameters["csi.storage.k8s.io/fstype"] = "xfs"
		c.Parameters["csi.storage.k8s.io/provisioner-secret-name"] = "secret"
		return c
	}
	tests := []struct {
		name  string
		nodes []runtime.Object
		seg   segment
		want  *csi.GetCapacityRequest
	}{
		{
			name: "segment", nodes: zoneNode("n1", "a"), seg: zone("a"),
			want: &csi.GetCapacityRequest{
				Parameters:         map[string]string{"type": "fast"},
				AccessibleTopology: &csi.Topology{Segments: map[string]string{zoneKey: "a"}},
			},
		},
		{
			name:  "driver without topology keys",
			nodes: one(testutil.NewNode("n1", nil), testutil.NewCSINode("n1", testDriver)), seg: segment{},
			want: &csi.GetCapacityRequest{Parameters: map[string]string{"type": "fast"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			driver := &fakeDriver{available: 1}
			h := newHarness(t, objects(one(class()), tt.nodes), driver)
			if err := h.c.syncItem(testContext(t), itemKey("fast", tt.seg)); err != nil {
				t.Fatalf("syncItem: %v", err)
			}
			want := []*csi.GetCapacityRequest{tt.want}
			if diff := cmp.Diff(want, driver.calls(), protocmp.Transform()); diff != "" {
				t.Errorf("GetCapacity requests (-want +got):\n%s", diff)
			}
		})
	}
}

// TestCreatedNotYetCached checks that no second object is created while the
// informer has not delivered the first, and that a deleted object is created
// again.
func TestCreatedNotYetCached(t *testing.T) {
	driver := &fakeDriver{available: gi(1)}
	h := newHarness(t, objects(one(wffc("fast")), zoneNode("n1", "a")), driver)
	ctx := testContext(t)
	key := itemKey("fast", zone("a"))
	mustSync := func() {
		t.Helper()
		if err := h.c.syncItem(ctx, key); err != nil {
			t.Fatalf("syncItem: %v", err)
		}
	}
	verbs := func() []string {
		var out []string
		for _, w := range writesOf(h.writes()) {
			out = append(out, w.Verb+" "+w.Name)
		}
		h.client.ClearActions()
		return out
	}

	mustSync()
	if got, want := verbs(), []string{"create "}; !slices.Equal(got, want) {
		t.Fatalf("first sync: got writes %q, want %q", got, want)
	}
	mustSync()
	if got := verbs(); len(got) != 0 {
		t.Fatalf("second sync before the informer saw the object: got writes %q, want none", got)
	}
	driver.set(gi(2), nil)
	mustSync()
	if got, want := verbs(), []string{"update csisc-gen1"}; !slices.Equal(got, want) {
		t.Fatalf("sync with new capacity before the informer saw the object: got writes %q, want %q", got, want)
	}

	// The informer delivers the object: the record goes.
	obj, err := h.client.StorageV1().CSIStorageCapacities(testNamespace).Get(ctx, "csisc-gen1", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get: %v", err)
	}
	h.cache(t, obj)
	h.c.onObject(obj)
	if n := len(h.c.written); n != 0 {
		t.Fatalf("records after the informer delivered the object: %d, want 0", n)
	}
	mustSync()
	if got := verbs(); len(got) != 0 {
		t.Fatalf("sync after the informer saw the object: got writes %q, want none", got)
	}

	// Someone deletes it: the item is queued and the object created again.
	if err := h.client.StorageV1().CSIStorageCapacities(testNamespace).Delete(ctx, obj.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete: %v", err)
	}
	h.client.ClearActions()
	h.drain()
	if err := h.c.objInformer.GetStore().Delete(obj); err != nil {
		t.Fatalf("delete from cache: %v", err)
	}
	h.c.onObjectDelete(obj)
	if got := h.drain(); !slices.Equal(got, []string{key}) {
		t.Fatalf("queued after deletion: %q, want %q", got, key)
	}
	mustSync()
	if got, want := verbs(), []string{"create "}; !slices.Equal(got, want) {
		t.Fatalf("sync after deletion: got writes %q, want %q", got, want)
	}
}

// TestUpdateNotFound checks that an object deleted before the informer saw
// it is forgotten, so that the retry creates it again.
func TestUpdateNotFound(t *testing.T) {
	driver := &fakeDriver{available: gi(1)}
	h := newHarness(t, objects(one(wffc("fast")), zoneNode("n1", "a")), driver)
	ctx := testContext(t)
	key := itemKey("fast", zone("a"))
	if err := h.c.syncItem(ctx, key); err != nil {
		t.Fatalf("syncItem: %v", err)
	}
	if err := h.client.StorageV1().CSIStorageCapacities(testNamespace).Delete(ctx, "csisc-gen1", metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete: %v", err)
	}
	driver.set(gi(2), nil)
	if err := h.c.syncItem(ctx, key); !apierrors.IsNotFound(err) {
		t.Fatalf("syncItem after deletion: got %v, want NotFound", err)
	}
	h.client.ClearActions()
	if err := h.c.syncItem(ctx, key); err != nil {
		t.Fatalf("retry: %v", err)
	}
	if got := writesOf(h.writes()); len(got) != 1 || got[0].Verb != "create" {
		t.Fatalf("retry: got writes %+v, want one create", got)
	}
}

// TestUpdatedNotYetCached: capacity goes 10Gi → 9Gi (published) → 10Gi
// before the informer delivers the update. The second sync compares with
// what it wrote (9Gi), not with the older cached copy (10Gi), and publishes
// 10Gi again; once the informer delivers the written version, the record
// goes.
func TestUpdatedNotYetCached(t *testing.T) {
	driver := &fakeDriver{available: gi(10)}
	cached := csc("a", "fast", "a", gi(10))
	cached.ResourceVersion = "1"
	h := newHarness(t, objects(one(wffc("fast")), zoneNode("n1", "a"), one(cached)), driver)
	// As the API server, each update makes a new resourceVersion (the
	// fake keeps the one it is given).
	rv := 1
	h.client.PrependReactor("update", "csistoragecapacities", func(action clienttesting.Action) (bool, runtime.Object, error) {
		rv++
		action.(clienttesting.UpdateAction).GetObject().(*storagev1.CSIStorageCapacity).ResourceVersion = fmt.Sprint(rv)
		return false, nil, nil
	})
	ctx := testContext(t)
	key := itemKey("fast", zone("a"))
	driver.set(gi(9), nil)
	if err := h.c.syncItem(ctx, key); err != nil {
		t.Fatal(err)
	}
	driver.set(gi(10), nil)
	if err := h.c.syncItem(ctx, key); err != nil {
		t.Fatal(err)
	}
	obj, err := h.client.StorageV1().CSIStorageCapacities(testNamespace).Get(ctx, "a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if obj.Capacity.Cmp(*resource.NewQuantity(gi(10), resource.BinarySI)) != 0 {
		t.Errorf("published capacity %v, want the driver's 10Gi", obj.Capacity)
	}
	h.cache(t, obj)
	h.c.onObject(obj)
	if n := len(h.c.written); n != 0 {
		t.Errorf("%d records after the informer delivered the written version, want none", n)
	}
}

// TestCreatedAndDeletedBeforeRecorded: the informer delivers the addition
// and the deletion (by someone else) of a just-created object before Create
// returns. The object is not recorded (a record would stand for an object
// that is gone, and hide it while the capacity stays the same): the sync
// fails, and its retry creates the object again.
func TestCreatedAndDeletedBeforeRecorded(t *testing.T) {
	driver := &fakeDriver{available: gi(1)}
	h := newHarness(t, objects(one(wffc("fast")), zoneNode("n1", "a")), driver)
	ctx := testContext(t)
	key := itemKey("fast", zone("a"))
	deletedEarly := false
	h.client.PrependReactor("create", "csistoragecapacities", func(action clienttesting.Action) (bool, runtime.Object, error) {
		if deletedEarly {
			return false, nil, nil
		}
		deletedEarly = true
		obj := action.(clienttesting.CreateAction).GetObject().(*storagev1.CSIStorageCapacity).DeepCopy()
		obj.Name, obj.UID, obj.ResourceVersion = "csisc-early", "uid-early", "1"
		h.cache(t, obj)
		h.c.onObject(obj)
		if err := h.c.objInformer.GetStore().Delete(obj); err != nil {
			t.Fatal(err)
		}
		h.c.onObjectDelete(obj)
		return true, obj, nil
	})
	if err := h.c.syncItem(ctx, key); err == nil || !strings.Contains(err.Error(), "was deleted right after it was created") {
		t.Fatalf("syncItem = %v, want the early deletion", err)
	}
	if r := h.c.written[key]; r != nil {
		t.Fatalf("record of %s, which is gone", r.Name)
	}
	if err := h.c.syncItem(ctx, key); err != nil {
		t.Fatal(err)
	}
	list, err := h.client.StorageV1().CSIStorageCapacities(testNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 1 {
		t.Errorf("%d objects, want the one created again", len(list.Items))
	}
}

// TestHandleResult checks the one place that maps sync results to the queue.
func TestHandleResult(t *testing.T) {
	driver := &fakeDriver{err: errors.New("driver unavailable")}
	h := newHarness(t, objects(one(wffc("fast")), zoneNode("n1", "a")), driver, WithRetry(time.Millisecond, time.Millisecond))
	ctx := testContext(t)
	key := itemKey("fast", zone("a"))

	h.c.queue.Add(key)
	if !h.c.processNext(ctx) {
		t.Fatal("processNext: queue shut down")
	}
	if n := h.c.queue.NumRequeues(key); n != 1 {
		t.Fatalf("requeues after a failure: %d, want 1", n)
	}
	if len(writesOf(h.writes())) != 0 {
		t.Fatal("failed sync wrote")
	}

	driver.set(gi(1), nil)
	// The rate-limited add comes back after the backoff.
	if !h.c.processNext(ctx) {
		t.Fatal("processNext: queue shut down")
	}
	if n := h.c.queue.NumRequeues(key); n != 0 {
		t.Fatalf("requeues after success: %d, want 0", n)
	}
	if got := writesOf(h.writes()); len(got) != 1 || got[0].Verb != "create" {
		t.Fatalf("writes after success: %+v, want one create", got)
	}
}

func TestNewValidation(t *testing.T) {
	client := fake.NewClientset()
	factory := informers.NewSharedInformerFactory(client, 0)
	tests := []struct {
		name      string
		driver    string
		namespace string
		opts      []Option
		wantErr   bool
	}{
		{name: "defaults", driver: testDriver, namespace: testNamespace},
		{name: "no driver name", namespace: testNamespace, wantErr: true},
		{name: "no namespace", driver: testDriver, wantErr: true},
		{name: "zero poll interval", driver: testDriver, namespace: testNamespace, opts: []Option{WithPollInterval(0)}, wantErr: true},
		{name: "max below start", driver: testDriver, namespace: testNamespace, opts: []Option{WithRetry(time.Minute, time.Second)}, wantErr: true},
		{name: "owner without UID", driver: testDriver, namespace: testNamespace, opts: []Option{WithOwner(&metav1.OwnerReference{APIVersion: "v1", Kind: "Pod", Name: "p"})}, wantErr: true},
		{name: "all options", driver: testDriver, namespace: testNamespace, opts: []Option{
			WithOwner(&testOwner), WithPollInterval(time.Second), WithImmediateBinding(true), WithRetry(time.Second, time.Second),
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := New(client, &fakeDriver{}, tt.driver, tt.namespace, factory, tt.opts...)
			if (err != nil) != tt.wantErr {
				t.Fatalf("New: got error %v, want error %v", err, tt.wantErr)
			}
			if c != nil {
				c.queue.ShutDown()
			}
		})
	}
}
