package provisioner

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"
	storagehelpers "k8s.io/component-helpers/storage/volume"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	"sigs.k8s.io/sig-storage-lib-external-provisioner/v13/controller"

	"github.com/kube-storage/csi-provisioner/internal/testutil"
	"github.com/kube-storage/csi-provisioner/pkg/csiclient"
)

const (
	testDriver   = "test.csi.example.com"
	testNS       = "ns"
	testClass    = "sc"
	testIdentity = "test-identity"
)

// fakeDriver is a scripted csiclient.Driver that records every request.
type fakeDriver struct {
	mu      sync.Mutex
	caps    csiclient.Capabilities
	creates []*csi.CreateVolumeRequest
	deletes []*csi.DeleteVolumeRequest
	// createAnswers are returned in order, the last one repeated; with none,
	// CreateVolume succeeds with the requested capacity and content source.
	createAnswers []createAnswer
	// deleteErrs are returned in order, then nil.
	deleteErrs []error
	// onCreate runs at the start of every CreateVolume, onDelete of every
	// DeleteVolume.
	onCreate func(*csi.CreateVolumeRequest)
	onDelete func(*csi.DeleteVolumeRequest)
}

type createAnswer struct {
	vol *csi.Volume
	err error
}

var _ csiclient.Driver = (*fakeDriver)(nil)

func (d *fakeDriver) Capabilities() csiclient.Capabilities { return d.caps }

func (d *fakeDriver) CreateVolume(_ context.Context, req *csi.CreateVolumeRequest) (*csi.Volume, error) {
	if d.onCreate != nil {
		d.onCreate(req)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.creates = append(d.creates, proto.Clone(req).(*csi.CreateVolumeRequest))
	if len(d.createAnswers) == 0 {
		return &csi.Volume{VolumeId: "id-" + req.GetName(), CapacityBytes: req.GetCapacityRange().GetRequiredBytes(), ContentSource: req.GetVolumeContentSource()}, nil
	}
	a := d.createAnswers[0]
	if len(d.createAnswers) > 1 {
		d.createAnswers = d.createAnswers[1:]
	}
	return a.vol, a.err
}

func (d *fakeDriver) DeleteVolume(_ context.Context, req *csi.DeleteVolumeRequest) error {
	if d.onDelete != nil {
		d.onDelete(req)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.deletes = append(d.deletes, proto.Clone(req).(*csi.DeleteVolumeRequest))
	if len(d.deleteErrs) == 0 {
		return nil
	}
	err := d.deleteErrs[0]
	d.deleteErrs = d.deleteErrs[1:]
	return err
}

func (d *fakeDriver) createCalls() []*csi.CreateVolumeRequest {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.creates)
}

func (d *fakeDriver) deleteCalls() []*csi.DeleteVolumeRequest {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.deletes)
}

// csiErr is a CSI call error as the real client returns it.
func csiErr(code codes.Code) error {
	return &csiclient.Error{Method: "CreateVolume", Volume: "v", Err: status.Error(code, "mock "+code.String())}
}

// baseCaps are the capabilities of a driver that can provision, without
// topology.
func baseCaps() csiclient.Capabilities {
	return csiclient.Capabilities{DriverName: testDriver, ControllerService: true, CreateDeleteVolume: true}
}

func topologyCaps() csiclient.Capabilities {
	c := baseCaps()
	c.VolumeAccessibility = true
	return c
}

// harness is a provisioner on a fake clientset whose informers are started
// and synced with the given objects.
type harness struct {
	t        *testing.T
	ctx      context.Context // the test's context, logging to the test
	client   *fake.Clientset
	factory  informers.SharedInformerFactory
	driver   *fakeDriver
	recorder *record.FakeRecorder
	p        *Provisioner
}

func newHarness(t *testing.T, caps csiclient.Capabilities, objs []runtime.Object, opts ...Option) *harness {
	t.Helper()
	client := fake.NewClientset(objs...)
	factory := informers.NewSharedInformerFactory(client, 0)
	driver := &fakeDriver{caps: caps}
	rec := record.NewFakeRecorder(100)
	opts = append([]Option{WithEventRecorder(rec), WithIdentity(testIdentity)}, opts...)
	p, err := New(client, driver, factory, opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	factory.Start(t.Context().Done())
	t.Cleanup(factory.Shutdown)
	for typ, ok := range factory.WaitForCacheSync(t.Context().Done()) {
		if !ok {
			t.Fatalf("informer of %v did not sync", typ)
		}
	}
	// Event handlers (the volume handle counts) sync a moment after
	// their informer.
	synced := func(context.Context) (bool, error) { return p.HasSynced(), nil }
	if err := wait.PollUntilContextTimeout(t.Context(), time.Millisecond, time.Minute, true, synced); err != nil {
		t.Fatalf("HasSynced is false after the informers synced: %v", err)
	}
	client.ClearActions()
	ctx := klog.NewContext(t.Context(), ktesting.NewLogger(t, ktesting.NewConfig()))
	return &harness{t: t, ctx: ctx, client: client, factory: factory, driver: driver, recorder: rec, p: p}
}

// provision calls Provision as the library would.
func (h *harness) provision(claim *corev1.PersistentVolumeClaim, class *storagev1.StorageClass) (*corev1.PersistentVolume, controller.ProvisioningState, error) {
	h.t.Helper()
	selected, _ := selectedNode(claim)
	return h.p.Provision(h.ctx, controller.ProvisionOptions{
		StorageClass: class, PVName: h.p.VolumeName(claim), PVC: claim, SelectedNodeName: selected,
	})
}

// events drains the recorded events.
func (h *harness) events() []string {
	var out []string
	for {
		select {
		case e := <-h.recorder.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

// liveClaim reads the claim from the fake API server.
func (h *harness) liveClaim(claim *corev1.PersistentVolumeClaim) *corev1.PersistentVolumeClaim {
	h.t.Helper()
	c, err := h.client.CoreV1().PersistentVolumeClaims(claim.Namespace).Get(h.t.Context(), claim.Name, metav1.GetOptions{})
	if err != nil {
		h.t.Fatalf("get claim: %v", err)
	}
	return c
}

// writes returns the verbs and resources of the write actions so far.
func (h *harness) writes() []string {
	var out []string
	for _, a := range h.client.Actions() {
		switch a.GetVerb() {
		case "get", "list", "watch":
			continue
		}
		out = append(out, a.GetVerb()+" "+a.GetResource().Resource)
	}
	return out
}

// failOn makes the fake API server fail verb on resource with err.
func (h *harness) failOn(verb, resource string, err error) {
	h.client.PrependReactor(verb, resource, func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, err
	})
}

// newClaim is a claim annotated for the test driver in class testClass.
func newClaim(name string) *testutil.PVCBuilder {
	return testutil.NewPVC(testNS, name).UID("uid-"+name).Class(testClass).
		Annotation(storagehelpers.AnnStorageProvisioner, testDriver)
}

// newClass is a class of the test driver.
func newClass() *testutil.SCBuilder { return testutil.NewSC(testClass, testDriver) }

// secret is a secret with the given data.
func secret(namespace, name string, data map[string]string) *corev1.Secret {
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}, Data: map[string][]byte{}}
	for k, v := range data {
		s.Data[k] = []byte(v)
	}
	return s
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func isIgnored(err error) bool { return isIgnoredError(err) }

// runGuard runs the in-flight guard with workers in the background, with
// a logger that writes to t, until the returned stop is called (once, by
// t's cleanup at the latest); stop returns once the guard has returned.
func (h *harness) runGuard(t *testing.T, workers int) (stop func()) {
	ctx, cancel := context.WithCancel(klog.NewContext(t.Context(), ktesting.NewLogger(t, ktesting.NewConfig())))
	done := make(chan struct{})
	go func() {
		defer close(done)
		h.p.RunGuard(ctx, workers)
	}()
	stop = sync.OnceFunc(func() { cancel(); <-done })
	t.Cleanup(stop)
	return stop
}
