package csiclient_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"go.uber.org/mock/gomock"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/kube-storage/csi-provisioner/pkg/csiclient"
)

// callBound is how long a call that must end at a short timeout may take
// at most on a loaded machine. Tests never assert tighter timing.
const callBound = 5 * time.Second

func TestConnectDiscoversCapabilities(t *testing.T) {
	type rpc = csi.ControllerServiceCapability_RPC_Type
	controllerService := []csi.PluginCapability_Service_Type{csi.PluginCapability_Service_CONTROLLER_SERVICE}
	withIdentity := func(c csiclient.Capabilities) csiclient.Capabilities {
		c.DriverName, c.VendorVersion = testDriverName, testVendorVersion
		return c
	}
	withController := func(c csiclient.Capabilities) csiclient.Capabilities {
		c.ControllerService = true
		return withIdentity(c)
	}
	tests := []struct {
		name   string
		plugin []csi.PluginCapability_Service_Type
		// controller is what ControllerGetCapabilities reports; nil means
		// it must not be called.
		controller []rpc
		want       csiclient.Capabilities
	}{
		{name: "identity only", want: withIdentity(csiclient.Capabilities{})},
		{
			name:   "VOLUME_ACCESSIBILITY_CONSTRAINTS without controller",
			plugin: []csi.PluginCapability_Service_Type{csi.PluginCapability_Service_VOLUME_ACCESSIBILITY_CONSTRAINTS},
			want:   withIdentity(csiclient.Capabilities{VolumeAccessibility: true}),
		},
		{name: "CONTROLLER_SERVICE alone", plugin: controllerService, controller: []rpc{}, want: withController(csiclient.Capabilities{})},
		{name: "CREATE_DELETE_VOLUME", plugin: controllerService, controller: []rpc{csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME}, want: withController(csiclient.Capabilities{CreateDeleteVolume: true})},
		{name: "PUBLISH_UNPUBLISH_VOLUME", plugin: controllerService, controller: []rpc{csi.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME}, want: withController(csiclient.Capabilities{PublishUnpublish: true})},
		{name: "LIST_VOLUMES", plugin: controllerService, controller: []rpc{csi.ControllerServiceCapability_RPC_LIST_VOLUMES}, want: withController(csiclient.Capabilities{ListVolumes: true})},
		{name: "GET_CAPACITY", plugin: controllerService, controller: []rpc{csi.ControllerServiceCapability_RPC_GET_CAPACITY}, want: withController(csiclient.Capabilities{GetCapacity: true})},
		{name: "CREATE_DELETE_SNAPSHOT", plugin: controllerService, controller: []rpc{csi.ControllerServiceCapability_RPC_CREATE_DELETE_SNAPSHOT}, want: withController(csiclient.Capabilities{CreateDeleteSnapshot: true})},
		{name: "LIST_SNAPSHOTS", plugin: controllerService, controller: []rpc{csi.ControllerServiceCapability_RPC_LIST_SNAPSHOTS}, want: withController(csiclient.Capabilities{ListSnapshots: true})},
		{name: "CLONE_VOLUME", plugin: controllerService, controller: []rpc{csi.ControllerServiceCapability_RPC_CLONE_VOLUME}, want: withController(csiclient.Capabilities{CloneVolume: true})},
		{name: "PUBLISH_READONLY", plugin: controllerService, controller: []rpc{csi.ControllerServiceCapability_RPC_PUBLISH_READONLY}, want: withController(csiclient.Capabilities{PublishReadonly: true})},
		{name: "EXPAND_VOLUME", plugin: controllerService, controller: []rpc{csi.ControllerServiceCapability_RPC_EXPAND_VOLUME}, want: withController(csiclient.Capabilities{ExpandVolume: true})},
		{name: "SINGLE_NODE_MULTI_WRITER", plugin: controllerService, controller: []rpc{csi.ControllerServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER}, want: withController(csiclient.Capabilities{SingleNodeMultiWriter: true})},
		{name: "MODIFY_VOLUME", plugin: controllerService, controller: []rpc{csi.ControllerServiceCapability_RPC_MODIFY_VOLUME}, want: withController(csiclient.Capabilities{ModifyVolume: true})},
		{name: "GET_VOLUME", plugin: controllerService, controller: []rpc{csi.ControllerServiceCapability_RPC_GET_VOLUME}, want: withController(csiclient.Capabilities{GetVolume: true})},
		{
			name:   "capabilities the provisioner does not use",
			plugin: []csi.PluginCapability_Service_Type{csi.PluginCapability_Service_CONTROLLER_SERVICE, csi.PluginCapability_Service_GROUP_CONTROLLER_SERVICE},
			controller: []rpc{
				csi.ControllerServiceCapability_RPC_GET_SNAPSHOT,
				csi.ControllerServiceCapability_RPC_GET_VOLUME_HEALTH,
				csi.ControllerServiceCapability_RPC_LIST_VOLUMES_PUBLISHED_NODES,
			},
			want: withController(csiclient.Capabilities{}),
		},
		{
			name: "everything",
			plugin: []csi.PluginCapability_Service_Type{
				csi.PluginCapability_Service_CONTROLLER_SERVICE,
				csi.PluginCapability_Service_VOLUME_ACCESSIBILITY_CONSTRAINTS,
			},
			controller: []rpc{
				csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME,
				csi.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME,
				csi.ControllerServiceCapability_RPC_LIST_VOLUMES,
				csi.ControllerServiceCapability_RPC_GET_CAPACITY,
				csi.ControllerServiceCapability_RPC_CREATE_DELETE_SNAPSHOT,
				csi.ControllerServiceCapability_RPC_LIST_SNAPSHOTS,
				csi.ControllerServiceCapability_RPC_CLONE_VOLUME,
				csi.ControllerServiceCapability_RPC_PUBLISH_READONLY,
				csi.ControllerServiceCapability_RPC_EXPAND_VOLUME,
				csi.ControllerServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER,
				csi.ControllerServiceCapability_RPC_MODIFY_VOLUME,
				csi.ControllerServiceCapability_RPC_GET_VOLUME,
			},
			want: withController(csiclient.Capabilities{
				VolumeAccessibility:   true,
				CreateDeleteVolume:    true,
				PublishUnpublish:      true,
				ListVolumes:           true,
				GetCapacity:           true,
				CreateDeleteSnapshot:  true,
				ListSnapshots:         true,
				CloneVolume:           true,
				PublishReadonly:       true,
				ExpandVolume:          true,
				SingleNodeMultiWriter: true,
				ModifyVolume:          true,
				GetVolume:             true,
			}),
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			d := startDriver(t)
			d.expectProbe()
			d.expectDiscovery(tc.plugin, tc.controller)
			// Discovery happens once, in Connect: the calls below must not
			// repeat it, or gomock sees more than one call of each.
			d.controller.EXPECT().CreateVolume(gomock.Any(), gomock.Any()).
				Return(&csi.CreateVolumeResponse{Volume: &csi.Volume{VolumeId: "vol-1"}}, nil).Times(1)
			d.controller.EXPECT().DeleteVolume(gomock.Any(), gomock.Any()).
				Return(&csi.DeleteVolumeResponse{}, nil).Times(1)

			c := d.connect(ctx, t)
			if got := c.Capabilities(); got != tc.want {
				t.Errorf("Capabilities() = %+v, want %+v", got, tc.want)
			}
			if _, err := c.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "pvc-1"}); err != nil {
				t.Fatalf("CreateVolume: %v", err)
			}
			if err := c.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: "vol-1"}); err != nil {
				t.Fatalf("DeleteVolume: %v", err)
			}
			if got := c.Capabilities(); got != tc.want {
				t.Errorf("Capabilities() after calls = %+v, want %+v", got, tc.want)
			}
		})
	}

	// The "everything" row must set every capability field, so that a field
	// added to Capabilities without a test (and likely without its mapping)
	// fails here.
	for _, tc := range tests {
		if tc.name != "everything" {
			continue
		}
		v := reflect.ValueOf(tc.want)
		for i := range v.NumField() {
			if f := v.Field(i); f.Kind() == reflect.Bool && !f.Bool() {
				t.Errorf("the everything row leaves Capabilities.%s false: add it to the row and to this table", v.Type().Field(i).Name)
			}
		}
	}
}

func TestConnectDiscoveryErrors(t *testing.T) {
	infoOK := &csi.GetPluginInfoResponse{Name: testDriverName, VendorVersion: testVendorVersion}
	pluginOK := pluginCapabilities(csi.PluginCapability_Service_CONTROLLER_SERVICE)
	tests := []struct {
		name     string
		expect   func(d *testDriver)
		wantCode codes.Code // of the wrapped cause; OK when it has none
	}{
		{
			name: "GetPluginInfo fails",
			expect: func(d *testDriver) {
				d.identity.EXPECT().GetPluginInfo(gomock.Any(), gomock.Any()).Return(nil, status.Error(codes.Internal, "broken")).Times(1)
			},
			wantCode: codes.Internal,
		},
		{
			name: "empty driver name",
			expect: func(d *testDriver) {
				d.identity.EXPECT().GetPluginInfo(gomock.Any(), gomock.Any()).Return(&csi.GetPluginInfoResponse{}, nil).Times(1)
			},
		},
		{
			name: "GetPluginCapabilities fails",
			expect: func(d *testDriver) {
				d.identity.EXPECT().GetPluginInfo(gomock.Any(), gomock.Any()).Return(infoOK, nil).Times(1)
				d.identity.EXPECT().GetPluginCapabilities(gomock.Any(), gomock.Any()).Return(nil, status.Error(codes.Unimplemented, "no")).Times(1)
			},
			wantCode: codes.Unimplemented,
		},
		{
			name: "ControllerGetCapabilities fails",
			expect: func(d *testDriver) {
				d.identity.EXPECT().GetPluginInfo(gomock.Any(), gomock.Any()).Return(infoOK, nil).Times(1)
				d.identity.EXPECT().GetPluginCapabilities(gomock.Any(), gomock.Any()).Return(pluginOK, nil).Times(1)
				d.controller.EXPECT().ControllerGetCapabilities(gomock.Any(), gomock.Any()).Return(nil, status.Error(codes.Unavailable, "later")).Times(1)
			},
			wantCode: codes.Unavailable,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := startDriver(t)
			d.expectProbe()
			tc.expect(d)
			c, err := csiclient.Connect(t.Context(), d.socket, testOptions()...)
			wantConnectError(t, c, err, d.socket)
			if tc.wantCode != codes.OK {
				if got := status.Code(err); got != tc.wantCode {
					t.Errorf("status.Code(%v) = %v, want %v", err, got, tc.wantCode)
				}
			}
		})
	}
}

// TestConnectBoundsEachDiscoveryCall: the call timeout bounds every call,
// each on its own; the discovery calls do not share one budget.
func TestConnectBoundsEachDiscoveryCall(t *testing.T) {
	tests := []struct {
		name string
		// latency of each discovery call; the call timeout is 1s.
		latency time.Duration
		wantErr bool
	}{
		{name: "each call within the timeout, together beyond it", latency: 400 * time.Millisecond},
		{name: "a call beyond the timeout", latency: time.Hour, wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := startDriver(t)
			d.expectProbe()
			d.identity.EXPECT().GetPluginInfo(gomock.Any(), gomock.Any()).
				DoAndReturn(func(ctx context.Context, _ *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
					if err := delay(ctx, tc.latency); err != nil {
						return nil, err
					}
					return &csi.GetPluginInfoResponse{Name: testDriverName}, nil
				}).Times(1)
			if !tc.wantErr {
				d.identity.EXPECT().GetPluginCapabilities(gomock.Any(), gomock.Any()).
					DoAndReturn(func(ctx context.Context, _ *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
						if err := delay(ctx, tc.latency); err != nil {
							return nil, err
						}
						return pluginCapabilities(csi.PluginCapability_Service_CONTROLLER_SERVICE), nil
					}).Times(1)
				d.controller.EXPECT().ControllerGetCapabilities(gomock.Any(), gomock.Any()).
					DoAndReturn(func(ctx context.Context, _ *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
						if err := delay(ctx, tc.latency); err != nil {
							return nil, err
						}
						return controllerCapabilities(csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME), nil
					}).Times(1)
			}

			start := time.Now()
			c, err := csiclient.Connect(t.Context(), d.socket, testOptions(csiclient.WithCallTimeout(time.Second))...)
			elapsed := time.Since(start)
			if !tc.wantErr {
				wantConnected(t, c, err)
				return
			}
			wantConnectError(t, c, err, d.socket)
			if got := status.Code(err); got != codes.DeadlineExceeded {
				t.Errorf("status.Code(%v) = %v, want %v", err, got, codes.DeadlineExceeded)
			}
			if elapsed > callBound {
				t.Errorf("Connect took %v with a 1s call timeout", elapsed)
			}
		})
	}
}

func TestConnectWaitsForProbe(t *testing.T) {
	ready := func(r bool) *csi.ProbeResponse { return &csi.ProbeResponse{Ready: wrapperspb.Bool(r)} }
	tests := []struct {
		name    string
		expect  func(d *testDriver)
		opts    []csiclient.Option
		wantErr bool
		wantIs  error
	}{
		{name: "ready", expect: (*testDriver).expectProbe},
		{
			// CSI: without the field the caller assumes the plugin is ready.
			name: "ready field absent",
			expect: func(d *testDriver) {
				d.identity.EXPECT().Probe(gomock.Any(), gomock.Any()).Return(&csi.ProbeResponse{}, nil).Times(1)
			},
		},
		{
			name: "not ready twice, then ready",
			expect: func(d *testDriver) {
				gomock.InOrder(
					d.identity.EXPECT().Probe(gomock.Any(), gomock.Any()).Return(ready(false), nil).Times(2),
					d.identity.EXPECT().Probe(gomock.Any(), gomock.Any()).Return(ready(true), nil).Times(1),
				)
			},
		},
		{
			// Upstream's ProbeForever: no bound of our own.
			name: "not ready, then ready, with no bound on the wait (0, the default)",
			expect: func(d *testDriver) {
				gomock.InOrder(
					d.identity.EXPECT().Probe(gomock.Any(), gomock.Any()).Return(ready(false), nil).Times(1),
					d.identity.EXPECT().Probe(gomock.Any(), gomock.Any()).Return(ready(true), nil).Times(1),
				)
			},
			opts: []csiclient.Option{csiclient.WithProbeTimeout(0)},
		},
		{
			name: "probe fails",
			expect: func(d *testDriver) {
				d.identity.EXPECT().Probe(gomock.Any(), gomock.Any()).Return(nil, status.Error(codes.FailedPrecondition, "disk missing")).Times(1)
			},
			wantErr: true,
		},
		{
			name: "never ready",
			expect: func(d *testDriver) {
				d.identity.EXPECT().Probe(gomock.Any(), gomock.Any()).Return(ready(false), nil).MinTimes(1)
			},
			opts:    []csiclient.Option{csiclient.WithProbeTimeout(300 * time.Millisecond)},
			wantErr: true,
			wantIs:  context.DeadlineExceeded,
		},
		{
			name: "probe hangs",
			expect: func(d *testDriver) {
				d.identity.EXPECT().Probe(gomock.Any(), gomock.Any()).
					DoAndReturn(func(ctx context.Context, _ *csi.ProbeRequest) (*csi.ProbeResponse, error) {
						return nil, delay(ctx, time.Hour)
					}).MinTimes(1)
			},
			opts:    []csiclient.Option{csiclient.WithProbeTimeout(300 * time.Millisecond)},
			wantErr: true,
			wantIs:  context.DeadlineExceeded,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := startDriver(t)
			tc.expect(d)
			if !tc.wantErr {
				// Discovery only after a ready Probe; unexpected otherwise.
				d.expectDiscovery(
					[]csi.PluginCapability_Service_Type{csi.PluginCapability_Service_CONTROLLER_SERVICE},
					[]csi.ControllerServiceCapability_RPC_Type{csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME})
			}
			start := time.Now()
			c, err := csiclient.Connect(t.Context(), d.socket, testOptions(tc.opts...)...)
			elapsed := time.Since(start)
			if !tc.wantErr {
				wantConnected(t, c, err)
				return
			}
			wantConnectError(t, c, err, d.socket)
			if tc.wantIs != nil && !errors.Is(err, tc.wantIs) {
				t.Errorf("error %v is not %v", err, tc.wantIs)
			}
			if elapsed > callBound {
				t.Errorf("Connect took %v with a 300ms probe timeout", elapsed)
			}
		})
	}
}

func TestConnectAddressForms(t *testing.T) {
	tests := []struct {
		name    string
		address func(socket string) string
	}{
		{"path", func(socket string) string { return socket }},
		{"unix URL", func(socket string) string { return "unix://" + socket }},
		// gRPC's other spelling, which csi-lib-utils (upstream) accepts and
		// charts use (--csi-address=unix:/csi/csi.sock).
		{"unix URL without authority", func(socket string) string { return "unix:" + socket }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := startDriver(t)
			d.expectConnect()
			address := tc.address(d.socket)
			c, err := csiclient.Connect(t.Context(), address, testOptions()...)
			if err != nil {
				t.Fatalf("Connect(%q): %v", address, err)
			}
			t.Cleanup(func() { _ = c.Close() })
			if got := c.Address(); got != address {
				t.Errorf("Address() = %q, want %q", got, address)
			}
			if got := c.Capabilities().DriverName; got != testDriverName {
				t.Errorf("DriverName = %q, want %q", got, testDriverName)
			}
		})
	}
}

// TestConnectRefusesAddress: only unix sockets given by absolute path are
// dialled; everything else fails at once, before any network access.
func TestConnectRefusesAddress(t *testing.T) {
	tests := []struct {
		address       string
		wantNotSocket bool // errors.Is(err, ErrNotUnixSocket)
	}{
		{address: "tcp://127.0.0.1:10000", wantNotSocket: true},
		{address: "dns:///csi.example.com:10000", wantNotSocket: true},
		{address: "passthrough:///127.0.0.1:10000", wantNotSocket: true},
		{address: "127.0.0.1:10000", wantNotSocket: true},
		{address: "localhost:10000", wantNotSocket: true},
		{address: ""},
		{address: "unix://"},
		{address: "csi.sock"},
		{address: "run/csi/socket"},
		{address: "unix://run/csi/socket"},
		{address: "unix:"},
		{address: "unix:run/csi/socket"},
	}
	for _, tc := range tests {
		t.Run(tc.address, func(t *testing.T) {
			start := time.Now()
			c, err := csiclient.Connect(t.Context(), tc.address, testOptions(csiclient.WithConnectTimeout(callBound))...)
			if err == nil {
				_ = c.Close()
				t.Fatalf("Connect(%q) succeeded, want an error", tc.address)
			}
			if got := errors.Is(err, csiclient.ErrNotUnixSocket); got != tc.wantNotSocket {
				t.Errorf("errors.Is(%v, ErrNotUnixSocket) = %t, want %t", err, got, tc.wantNotSocket)
			}
			if !strings.Contains(err.Error(), `"`+tc.address+`"`) {
				t.Errorf("error %q does not name the address %q", err, tc.address)
			}
			if errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("Connect(%q) = %v: it dialled instead of refusing the address (took %v)", tc.address, err, time.Since(start))
			}
		})
	}
}

func TestConnectNoListener(t *testing.T) {
	tests := []struct {
		name    string
		prepare func(t *testing.T, path string)
	}{
		{name: "nothing at the path", prepare: func(*testing.T, string) {}},
		{name: "a plain file at the path", prepare: func(t *testing.T, path string) {
			if err := os.WriteFile(path, nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			socket := filepath.Join(t.TempDir(), "csi.sock")
			tc.prepare(t, socket)
			start := time.Now()
			c, err := csiclient.Connect(t.Context(), socket, testOptions(csiclient.WithConnectTimeout(300*time.Millisecond))...)
			elapsed := time.Since(start)
			wantConnectError(t, c, err, socket)
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("error %v is not %v", err, context.DeadlineExceeded)
			}
			if elapsed > callBound {
				t.Errorf("Connect took %v with a 300ms connect timeout", elapsed)
			}
		})
	}
}

// wantConnectError fails t unless Connect failed with an error that names
// socket; a client it returned anyway is closed.
func wantConnectError(t *testing.T, c *csiclient.Client, err error, socket string) {
	t.Helper()
	if err == nil {
		_ = c.Close()
		t.Fatal("Connect succeeded, want an error")
	}
	if !strings.Contains(err.Error(), socket) {
		t.Errorf("error %q does not name the socket %s", err, socket)
	}
}

// wantConnected fails t unless Connect succeeded, and closes the client.
func wantConnected(t *testing.T, c *csiclient.Client, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("Connect: %v", err)
	}
	_ = c.Close()
}
