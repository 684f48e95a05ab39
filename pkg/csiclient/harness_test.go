package csiclient_test

import (
	"bytes"
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/kubernetes-csi/csi-lib-utils/metrics"
	"github.com/kubernetes-csi/csi-test/v5/driver"
	"go.uber.org/mock/gomock"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"

	"github.com/kube-storage/csi-provisioner/pkg/csiclient"
)

const (
	testDriverName    = "mock.csi.example.com"
	testVendorVersion = "1.2.3"
)

// testDriver is csi-test's in-process gomock CSI driver listening on a unix
// socket in the test's temporary directory. All service mocks are created:
// csi-test registers every service, also those given as nil, and a call to a
// nil mock would panic inside the gRPC server and kill the test binary.
type testDriver struct {
	identity   *driver.MockIdentityServer
	controller *driver.MockControllerServer
	node       *driver.MockNodeServer
	server     *driver.MockCSIDriver
	socket     string
}

// startDriver starts a mock driver that is stopped when the test ends. It
// has no expectations: every call the test does not expect fails the test.
func startDriver(t *testing.T) *testDriver {
	t.Helper()
	ctrl := gomock.NewController(t)
	d := &testDriver{
		identity:   driver.NewMockIdentityServer(ctrl),
		controller: driver.NewMockControllerServer(ctrl),
		node:       driver.NewMockNodeServer(ctrl),
		socket:     filepath.Join(t.TempDir(), "csi.sock"),
	}
	d.server = driver.NewMockCSIDriver(&driver.MockCSIDriverServers{
		Identity:   d.identity,
		Controller: d.controller,
		Node:       d.node,
	})
	if err := d.server.StartOnAddress("unix", d.socket); err != nil {
		t.Fatalf("start the mock CSI driver on %s: %v", d.socket, err)
	}
	t.Cleanup(d.server.Stop)
	return d
}

// expectProbe expects one Probe that reports ready.
func (d *testDriver) expectProbe() {
	d.identity.EXPECT().Probe(gomock.Any(), gomock.Any()).
		Return(&csi.ProbeResponse{Ready: wrapperspb.Bool(true)}, nil).Times(1)
}

// expectDiscovery expects the discovery calls of Connect, each exactly once.
// With a nil controller the driver must not be asked for its controller
// capabilities (it does not report CONTROLLER_SERVICE).
func (d *testDriver) expectDiscovery(plugin []csi.PluginCapability_Service_Type, controller []csi.ControllerServiceCapability_RPC_Type) {
	d.identity.EXPECT().GetPluginInfo(gomock.Any(), gomock.Any()).
		Return(&csi.GetPluginInfoResponse{Name: testDriverName, VendorVersion: testVendorVersion}, nil).Times(1)
	d.identity.EXPECT().GetPluginCapabilities(gomock.Any(), gomock.Any()).
		Return(pluginCapabilities(plugin...), nil).Times(1)
	if controller != nil {
		d.controller.EXPECT().ControllerGetCapabilities(gomock.Any(), gomock.Any()).
			Return(controllerCapabilities(controller...), nil).Times(1)
	}
}

// expectConnect expects what a successful Connect to a provisioning driver
// sends: one Probe and the discovery calls.
func (d *testDriver) expectConnect() {
	d.expectProbe()
	d.expectDiscovery(
		[]csi.PluginCapability_Service_Type{csi.PluginCapability_Service_CONTROLLER_SERVICE},
		[]csi.ControllerServiceCapability_RPC_Type{csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME})
}

// connect connects a client with testOptions and closes it when the test
// ends, before the driver stops.
func (d *testDriver) connect(ctx context.Context, t *testing.T, opts ...csiclient.Option) *csiclient.Client {
	t.Helper()
	c, err := csiclient.Connect(ctx, d.socket, testOptions(opts...)...)
	if err != nil {
		t.Fatalf("Connect(%s): %v", d.socket, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// testOptions puts in front of opts what every test needs: the default
// connection-loss handler exits the process, which would end the test
// binary when a test stops its driver before closing the client.
func testOptions(opts ...csiclient.Option) []csiclient.Option {
	return append([]csiclient.Option{
		csiclient.WithOnConnectionLoss(func(context.Context) bool { return false }),
	}, opts...)
}

func pluginCapabilities(types ...csi.PluginCapability_Service_Type) *csi.GetPluginCapabilitiesResponse {
	resp := &csi.GetPluginCapabilitiesResponse{}
	for _, typ := range types {
		resp.Capabilities = append(resp.Capabilities, &csi.PluginCapability{
			Type: &csi.PluginCapability_Service_{Service: &csi.PluginCapability_Service{Type: typ}},
		})
	}
	return resp
}

func controllerCapabilities(types ...csi.ControllerServiceCapability_RPC_Type) *csi.ControllerGetCapabilitiesResponse {
	resp := &csi.ControllerGetCapabilitiesResponse{}
	for _, typ := range types {
		resp.Capabilities = append(resp.Capabilities, &csi.ControllerServiceCapability{
			Type: &csi.ControllerServiceCapability_Rpc{Rpc: &csi.ControllerServiceCapability_RPC{Type: typ}},
		})
	}
	return resp
}

// delay answers after d unless ctx ends first. It injects latency into a
// mock call; it never makes a test wait for something to happen.
func delay(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	}
}

// poll calls cond every 50ms until it reports done or an error, or until
// timeout. It waits on a condition; the interval only spaces the checks.
// (apimachinery's wait package is off limits here: depguard keeps this
// package free of k8s.io/api*.)
func poll(ctx context.Context, timeout time.Duration, cond func(context.Context) (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		done, err := cond(ctx)
		if err != nil || done {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// syncBuffer is a bytes.Buffer that gRPC goroutines and the test can share.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// histogramCount gathers mm's registry and returns the number of samples of
// the histogram name whose labels include labels. (component-base's
// metrics/testutil would need a module our go.mod does not list.)
func histogramCount(t *testing.T, mm metrics.CSIMetricsManager, name string, labels map[string]string) uint64 {
	t.Helper()
	families, err := mm.GetRegistry().Gather()
	if err != nil {
		t.Fatalf("gather metrics: %v", err)
	}
	var count uint64
	for _, family := range families {
		if family.GetName() != name {
			continue
		}
	metric:
		for _, m := range family.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for k, v := range labels {
				if have[k] != v {
					continue metric
				}
			}
			count += m.GetHistogram().GetSampleCount()
		}
	}
	return count
}

// connectLogged starts a mock driver that answers the connection's calls and
// those expect sets up, and connects to it with a context whose logger
// writes at verbosity 5 (csi-lib-utils' call log) to the returned buffer.
func connectLogged(t *testing.T, expect func(*testDriver)) (context.Context, *csiclient.Client, *syncBuffer) {
	t.Helper()
	logs := &syncBuffer{}
	logger := textlogger.NewLogger(textlogger.NewConfig(textlogger.Verbosity(5), textlogger.Output(logs)))
	ctx := klog.NewContext(t.Context(), logger)
	d := startDriver(t)
	d.expectConnect()
	expect(d)
	return ctx, d.connect(ctx, t), logs
}
