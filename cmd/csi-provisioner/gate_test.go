package main

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kube-storage/csi-provisioner/pkg/csiclient"
)

type gateTestDriver struct {
	csi.UnimplementedIdentityServer
	csi.UnimplementedControllerServer
	creates, deletes atomic.Int32
}

func (d *gateTestDriver) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: "gate.csi.example.com", VendorVersion: "1"}, nil
}

func (d *gateTestDriver) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	return &csi.GetPluginCapabilitiesResponse{Capabilities: []*csi.PluginCapability{{Type: &csi.PluginCapability_Service_{
		Service: &csi.PluginCapability_Service{Type: csi.PluginCapability_Service_CONTROLLER_SERVICE}}}}}, nil
}

func (d *gateTestDriver) Probe(context.Context, *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	return &csi.ProbeResponse{}, nil
}

func (d *gateTestDriver) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	return &csi.ControllerGetCapabilitiesResponse{Capabilities: []*csi.ControllerServiceCapability{{Type: &csi.ControllerServiceCapability_Rpc{
		Rpc: &csi.ControllerServiceCapability_RPC{Type: csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME}}}}}, nil
}

func (d *gateTestDriver) CreateVolume(_ context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	d.creates.Add(1)
	return &csi.CreateVolumeResponse{Volume: &csi.Volume{VolumeId: req.GetName(), CapacityBytes: 1}}, nil
}

func (d *gateTestDriver) DeleteVolume(context.Context, *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	d.deletes.Add(1)
	return &csi.DeleteVolumeResponse{}, nil
}

// connectGateTestDriver serves a gateTestDriver on a unix socket and
// connects to it as runSidecar does, with opts.
func connectGateTestDriver(t *testing.T, opts ...csiclient.Option) (*gateTestDriver, *csiclient.Client) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "csi.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	d := &gateTestDriver{}
	srv := grpc.NewServer()
	csi.RegisterIdentityServer(srv, d)
	csi.RegisterControllerServer(srv, d)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	cfg := newConfig()
	cfg.CSIAddress, cfg.Timeout, cfg.CSIConnectTimeout = sock, 10*time.Second, 10*time.Second
	driver, _, _, err := connectDriver(t.Context(), cfg, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = driver.Close() })
	return d, driver
}

// TestConnectDriverPassesTheChangeGate: the options runSidecar adds (the
// Lease fence's change gate) reach the driver client, so a fenced
// process sends no CreateVolume or DeleteVolume.
func TestConnectDriverPassesTheChangeGate(t *testing.T) {
	d, driver := connectGateTestDriver(t, csiclient.WithChangeGate(func() error { return errors.New("fenced") }))
	_, err := driver.CreateVolume(t.Context(), &csi.CreateVolumeRequest{Name: "pvc-1"})
	if status.Code(errors.Unwrap(err)) != codes.Aborted && status.Code(err) != codes.Aborted {
		t.Errorf("CreateVolume through a closed gate: %v, want Aborted", err)
	}
	_ = driver.DeleteVolume(t.Context(), &csi.DeleteVolumeRequest{VolumeId: "pvc-1"})
	if n, m := d.creates.Load(), d.deletes.Load(); n != 0 || m != 0 {
		t.Errorf("the driver got %d CreateVolume and %d DeleteVolume calls through a closed gate, want none", n, m)
	}
}

// TestDriverOptionsGateOnTheFence: with leader election, the driver
// client runSidecar connects refuses CreateVolume and DeleteVolume while
// the process does not hold the Lease.
func TestDriverOptionsGateOnTheFence(t *testing.T) {
	if opts := driverOptions(nil); len(opts) != 0 {
		t.Errorf("without leader election: %d options, want none", len(opts))
	}
	notLeading := newFence(15*time.Second, func(string) {})
	d, driver := connectGateTestDriver(t, driverOptions(notLeading)...)
	_, _ = driver.CreateVolume(t.Context(), &csi.CreateVolumeRequest{Name: "pvc-1"})
	if n := d.creates.Load(); n != 0 {
		t.Errorf("%d CreateVolume calls from a process that does not hold the Lease, want none", n)
	}
}
