package driver

import (
	"context"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
	"k8s.io/klog/v2"
)

// GetPluginInfo returns the driver's name and version.
func (d *Driver) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: d.cfg.DriverName, VendorVersion: d.cfg.VendorVersion}, nil
}

// GetPluginCapabilities reports the controller service and, when topology
// is enabled, volume accessibility constraints.
func (d *Driver) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	services := []csi.PluginCapability_Service_Type{csi.PluginCapability_Service_CONTROLLER_SERVICE}
	if d.cfg.EnableTopology {
		services = append(services, csi.PluginCapability_Service_VOLUME_ACCESSIBILITY_CONSTRAINTS)
	}
	caps := make([]*csi.PluginCapability, 0, len(services))
	for _, s := range services {
		caps = append(caps, &csi.PluginCapability{Type: &csi.PluginCapability_Service_{
			Service: &csi.PluginCapability_Service{Type: s},
		}})
	}
	return &csi.GetPluginCapabilitiesResponse{Capabilities: caps}, nil
}

// Probe reports ready when the backend can store data: a Driver that
// exists has loaded its state. Storage that is gone (the dir backend's root
// unmounted or removed) is FAILED_PRECONDITION with the reason, as the CSI
// spec asks of an unhealthy plugin, so that the CO can say why. It does not
// take the driver's lock, so it answers at once even while another call
// copies a large volume: a Probe that waited would fail the CO's liveness
// check and get the driver restarted in the middle of the copy.
func (d *Driver) Probe(ctx context.Context, _ *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	if err := d.backend.Check(); err != nil {
		klog.FromContext(ctx).Error(err, "Probe: not healthy")
		return nil, status.Errorf(codes.FailedPrecondition, "not healthy: %v", err)
	}
	return &csi.ProbeResponse{Ready: wrapperspb.Bool(true)}, nil
}
