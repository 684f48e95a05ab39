package e2e

import (
	"context"
	"net"
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// controllerDriver answers the discovery calls of a controller-only CSI
// driver named name that creates and deletes volumes. The drivers that
// tests write by hand embed it and add CreateVolume and DeleteVolume.
type controllerDriver struct {
	csi.UnimplementedIdentityServer
	csi.UnimplementedControllerServer
	name string
	// topology adds VOLUME_ACCESSIBILITY_CONSTRAINTS to the plugin's
	// capabilities.
	topology bool
}

func (d *controllerDriver) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: d.name, VendorVersion: "0.0.1"}, nil
}

func (d *controllerDriver) Probe(context.Context, *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	return &csi.ProbeResponse{Ready: wrapperspb.Bool(true)}, nil
}

func (d *controllerDriver) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	caps := controllerPluginCapabilities()
	if d.topology {
		caps.Capabilities = append(caps.Capabilities, &csi.PluginCapability{
			Type: &csi.PluginCapability_Service_{Service: &csi.PluginCapability_Service{Type: csi.PluginCapability_Service_VOLUME_ACCESSIBILITY_CONSTRAINTS}},
		})
	}
	return caps, nil
}

func (d *controllerDriver) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	return createDeleteCapabilities(), nil
}

// controllerPluginCapabilities is the GetPluginCapabilities answer of a
// driver with a controller service.
func controllerPluginCapabilities() *csi.GetPluginCapabilitiesResponse {
	return &csi.GetPluginCapabilitiesResponse{Capabilities: []*csi.PluginCapability{{
		Type: &csi.PluginCapability_Service_{Service: &csi.PluginCapability_Service{Type: csi.PluginCapability_Service_CONTROLLER_SERVICE}},
	}}}
}

// createDeleteCapabilities is the ControllerGetCapabilities answer of a
// driver that only creates and deletes volumes.
func createDeleteCapabilities() *csi.ControllerGetCapabilitiesResponse {
	return &csi.ControllerGetCapabilitiesResponse{Capabilities: []*csi.ControllerServiceCapability{{
		Type: &csi.ControllerServiceCapability_Rpc{Rpc: &csi.ControllerServiceCapability_RPC{Type: csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME}},
	}}}
}

// serveDriver serves d's identity and controller services on a new unix
// socket of the test, stopped at cleanup, and returns the socket's path.
// Start the sidecar after it, so that its cleanup (registered later) runs
// first.
func serveDriver(t *testing.T, d interface {
	csi.IdentityServer
	csi.ControllerServer
}) string {
	t.Helper()
	socket := filepath.Join(t.TempDir(), "csi.sock")
	lis, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	csi.RegisterIdentityServer(srv, d)
	csi.RegisterControllerServer(srv, d)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return socket
}
