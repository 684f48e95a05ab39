package capacity

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/types/known/wrapperspb"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	"github.com/kube-storage/csi-provisioner/internal/testutil"
)

const (
	testDriver    = "test.csi.example.com"
	testNamespace = "csi-system"
	zoneKey       = "topology.example.com/zone"
	rackKey       = "topology.example.com/rack"
)

// fakeDriver is a Driver that records its requests and answers with
// available bytes (by segment string, else the default), an optional
// maximum volume size, or err.
type fakeDriver struct {
	mu        sync.Mutex
	requests  []*csi.GetCapacityRequest
	available int64
	bySegment map[string]int64
	maxSize   *int64
	err       error
}

var _ Driver = (*fakeDriver)(nil)

func (d *fakeDriver) GetCapacity(_ context.Context, req *csi.GetCapacityRequest) (*csi.GetCapacityResponse, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.requests = append(d.requests, req)
	if d.err != nil {
		return nil, d.err
	}
	resp := &csi.GetCapacityResponse{AvailableCapacity: d.available}
	if v, ok := d.bySegment[segment(req.GetAccessibleTopology().GetSegments()).String()]; ok {
		resp.AvailableCapacity = v
	}
	if d.maxSize != nil {
		resp.MaximumVolumeSize = wrapperspb.Int64(*d.maxSize)
	}
	return resp, nil
}

func (d *fakeDriver) set(available int64, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.available, d.err = available, err
}

func (d *fakeDriver) calls() []*csi.GetCapacityRequest {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.requests)
}

// harness is a controller whose informers are never started: the caches are
// filled directly, and sync functions and handlers are called by the test.
type harness struct {
	c       *Controller
	client  *fake.Clientset
	factory informers.SharedInformerFactory
	driver  *fakeDriver
}

// newHarness builds a controller over objs (classes, nodes, CSINodes, PVs,
// CSIStorageCapacities), which are both in the fake API and in the caches,
// starts it (computes the desired items) and drains the queue.
func newHarness(t *testing.T, objs []runtime.Object, driver *fakeDriver, opts ...Option) *harness {
	t.Helper()
	c, client, factory := newController(t, objs, driver, opts...)
	t.Cleanup(c.queue.ShutDown)
	h := &harness{c: c, client: client, factory: factory, driver: driver}
	for _, o := range objs {
		h.cache(t, o)
	}
	c.start(testContext(t))
	h.drain()
	client.ClearActions()
	return h
}

// newController creates a controller over a fake API server holding objs,
// with the generated names the API server would give.
func newController(t *testing.T, objs []runtime.Object, driver *fakeDriver, opts ...Option) (*Controller, *fake.Clientset, informers.SharedInformerFactory) {
	t.Helper()
	client := fake.NewClientset(objs...)
	addGenerateNameReactor(client)
	factory := informers.NewSharedInformerFactory(client, 0)
	c, err := New(client, driver, testDriver, testNamespace, factory, opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return c, client, factory
}

// testContext returns t.Context() with a logger writing to t.
func testContext(t *testing.T) context.Context {
	return klog.NewContext(t.Context(), ktesting.NewLogger(t, ktesting.NewConfig(ktesting.Verbosity(5))))
}

// cache adds o to the informer cache of its kind without calling handlers.
func (h *harness) cache(t *testing.T, o runtime.Object) {
	t.Helper()
	var err error
	switch o := o.(type) {
	case *storagev1.StorageClass:
		err = h.factory.Storage().V1().StorageClasses().Informer().GetStore().Add(o)
	case *corev1.Node:
		err = h.factory.Core().V1().Nodes().Informer().GetStore().Add(o)
	case *storagev1.CSINode:
		err = h.factory.Storage().V1().CSINodes().Informer().GetStore().Add(o)
	case *corev1.PersistentVolume:
		err = h.factory.Core().V1().PersistentVolumes().Informer().GetStore().Add(o)
	case *storagev1.CSIStorageCapacity:
		err = h.c.objInformer.GetStore().Add(o)
	default:
		t.Fatalf("cache: unexpected %T", o)
	}
	if err != nil {
		t.Fatalf("cache %T: %v", o, err)
	}
}

// drain returns the keys in the queue, sorted, and empties it.
func (h *harness) drain() []string {
	var keys []string
	for h.c.queue.Len() > 0 {
		key, _ := h.c.queue.Get()
		keys = append(keys, key)
		h.c.queue.Done(key)
		h.c.queue.Forget(key)
	}
	slices.Sort(keys)
	return keys
}

// writes returns the create, update and delete actions on
// CSIStorageCapacities, in order.
func (h *harness) writes() []clienttesting.Action {
	var out []clienttesting.Action
	for _, a := range h.client.Actions() {
		if a.GetResource().Resource == "csistoragecapacities" && slices.Contains([]string{"create", "update", "delete"}, a.GetVerb()) {
			out = append(out, a)
		}
	}
	return out
}

// addGenerateNameReactor makes the fake API server name created
// CSIStorageCapacities from generateName and give them a UID, as the real
// one does.
func addGenerateNameReactor(client *fake.Clientset) {
	var n atomic.Int64
	client.PrependReactor("create", "csistoragecapacities", func(action clienttesting.Action) (bool, runtime.Object, error) {
		obj := action.(clienttesting.CreateAction).GetObject().(*storagev1.CSIStorageCapacity).DeepCopy()
		if obj.Name == "" && obj.GenerateName != "" {
			i := n.Add(1)
			obj.Name = fmt.Sprintf("%sgen%d", obj.GenerateName, i)
			obj.UID = types.UID(fmt.Sprintf("uid-gen%d", i))
		}
		if err := client.Tracker().Create(action.GetResource(), obj, obj.Namespace); err != nil {
			return true, nil, err
		}
		return true, obj, nil
	})
}

// Builders.

func wffc(name string) *storagev1.StorageClass {
	return testutil.NewSC(name, testDriver).WaitForFirstConsumer().Param("type", name).Obj()
}

func immediate(name string) *storagev1.StorageClass {
	return testutil.NewSC(name, testDriver).Param("type", name).Obj()
}

// zoneNode returns a node and its CSINode in zone.
func zoneNode(name, zone string) []runtime.Object {
	return []runtime.Object{
		testutil.NewNode(name, map[string]string{zoneKey: zone, "kubernetes.io/hostname": name}),
		testutil.NewCSINode(name, testDriver, zoneKey),
	}
}

func zone(z string) segment { return segment{zoneKey: z} }

func gi(n int64) int64 { return n << 30 }

// csc returns a published object named name for class in zone z with
// capacity bytes.
func csc(name, class, z string, capacity int64, mods ...func(*storagev1.CSIStorageCapacity)) *storagev1.CSIStorageCapacity {
	obj := &storagev1.CSIStorageCapacity{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: testNamespace, UID: types.UID("uid-" + name), ResourceVersion: "1",
			Labels: map[string]string{driverNameLabel: testDriver, managedByLabel: managedBy},
		},
		StorageClassName: class,
		NodeTopology:     &metav1.LabelSelector{MatchLabels: map[string]string{zoneKey: z}},
		Capacity:         resource.NewQuantity(capacity, resource.BinarySI),
	}
	for _, m := range mods {
		m(obj)
	}
	return obj
}

func withMax(n int64) func(*storagev1.CSIStorageCapacity) {
	return func(o *storagev1.CSIStorageCapacity) {
		o.MaximumVolumeSize = resource.NewQuantity(n, resource.BinarySI)
	}
}

func withCreated(sec int64) func(*storagev1.CSIStorageCapacity) {
	return func(o *storagev1.CSIStorageCapacity) { o.CreationTimestamp = metav1.Unix(sec, 0) }
}

func withOwners(refs ...metav1.OwnerReference) func(*storagev1.CSIStorageCapacity) {
	return func(o *storagev1.CSIStorageCapacity) { o.OwnerReferences = refs }
}

// newCSC is the object the controller creates for class in zone z.
func newCSC(class, z string, capacity int64, mods ...func(*storagev1.CSIStorageCapacity)) *storagev1.CSIStorageCapacity {
	obj := csc("", class, z, capacity, mods...)
	obj.Name, obj.UID, obj.ResourceVersion, obj.GenerateName = "", "", "", "csisc-"
	return obj
}

var testOwner = metav1.OwnerReference{
	APIVersion: "apps/v1", Kind: "StatefulSet", Name: "csi-provisioner", UID: "uid-sts", Controller: ptr.To(true),
}

// cmpOpts compares quantities by value and format.
var cmpOpts = []cmp.Option{
	cmp.Comparer(func(a, b resource.Quantity) bool { return a.Cmp(b) == 0 && a.Format == b.Format }),
}
