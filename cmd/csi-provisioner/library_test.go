package main

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	storagehelpers "k8s.io/component-helpers/storage/volume"
	"k8s.io/klog/v2"

	"github.com/kube-storage/csi-provisioner/internal/testutil"
	"github.com/kube-storage/csi-provisioner/pkg/csiclient"
	"github.com/kube-storage/csi-provisioner/pkg/provisioner"
)

// blockingDriver is a driver whose CreateVolume, once called, answers only
// after the test releases it, whatever its context says.
type blockingDriver struct {
	called  chan struct{}
	release chan struct{}
}

var _ csiclient.Driver = (*blockingDriver)(nil)

func (d *blockingDriver) Capabilities() csiclient.Capabilities {
	return csiclient.Capabilities{DriverName: "test.csi.example.com", ControllerService: true, CreateDeleteVolume: true}
}

func (d *blockingDriver) CreateVolume(ctx context.Context, req *csi.CreateVolumeRequest) (*csi.Volume, error) {
	close(d.called)
	<-d.release
	return nil, &csiclient.Error{Method: "CreateVolume", Volume: req.GetName(), Err: ctx.Err()}
}

func (d *blockingDriver) DeleteVolume(context.Context, *csi.DeleteVolumeRequest) error { return nil }

// TestLibraryWorkersWaitedAtStop: when the sidecar stops, the run function
// returns (and then the informers stop, the queued events are written and,
// with leader election, the Lease goes) only after the provisioning
// library's workers have: a worker still in CreateVolume could otherwise
// record events no one writes, or still act while the next leader does.
// The check that the run went on while the call ran waits a second: a run
// that does not wait for the workers returns within milliseconds.
func TestLibraryWorkersWaitedAtStop(t *testing.T) {
	d := &blockingDriver{called: make(chan struct{}), release: make(chan struct{})}
	release := sync.OnceFunc(func() { close(d.release) })
	t.Cleanup(release)
	class := testutil.NewSC("sc", d.Capabilities().DriverName).Obj()
	claim := testutil.NewPVC("ns", "c").UID("uid-c").Class("sc").
		Annotation(storagehelpers.AnnStorageProvisioner, d.Capabilities().DriverName).Obj()
	client := fake.NewClientset(class, claim)
	factory := informers.NewSharedInformerFactory(client, 0)
	prov, err := provisioner.New(client, d, factory)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := parseFlags(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The library's goroutines log through the context's logger, as in
	// main: without one they read klog's global logger, which a later test
	// (TestStandardLogGoesThroughKlog) sets while a goroutine the library
	// does not wait for may still be reading it (a race).
	ctx, stop := context.WithCancel(klog.NewContext(t.Context(), klog.Background()))
	defer stop()
	lib := newProvisionController(context.WithoutCancel(ctx), cfg, client, d.Capabilities().DriverName, "", prov, factory,
		&httpServer{libRegistry: prometheus.NewRegistry()})
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	done := make(chan struct{})
	go func() {
		defer close(done)
		var wg sync.WaitGroup
		defer wg.Wait()
		runLibrary(ctx, lib, &wg)
	}()
	select {
	case <-d.called:
	case <-time.After(time.Minute):
		t.Fatal("CreateVolume was not called")
	}
	stop()
	select {
	case <-done:
		t.Fatal("the run returned while a library worker was still in CreateVolume")
	case <-time.After(time.Second):
	}
	release()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("the run did not return after the worker's CreateVolume returned")
	}
}
