package csiclient_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/kubernetes-csi/csi-lib-utils/metrics"
	"github.com/kubernetes-csi/csi-test/v5/utils"
	"go.uber.org/mock/gomock"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/kube-storage/csi-provisioner/pkg/csiclient"
)

func TestCreateVolume(t *testing.T) {
	req := &csi.CreateVolumeRequest{
		Name:          "pvc-0f2b",
		CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 30},
		VolumeCapabilities: []*csi.VolumeCapability{{
			AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "ext4"}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		}},
		Parameters: map[string]string{"type": "fast"},
		Secrets:    map[string]string{"password": "x"},
		AccessibilityRequirements: &csi.TopologyRequirement{
			Preferred: []*csi.Topology{{Segments: map[string]string{"zone": "a"}}},
		},
	}
	volume := &csi.Volume{
		VolumeId:           "vol-0f2b",
		CapacityBytes:      1 << 30,
		VolumeContext:      map[string]string{"path": "/data/vol-0f2b"},
		AccessibleTopology: []*csi.Topology{{Segments: map[string]string{"zone": "a"}}},
	}
	tests := []struct {
		name string
		resp *csi.CreateVolumeResponse
		want *csi.Volume // nil: an error classified InProgress
	}{
		{name: "volume", resp: &csi.CreateVolumeResponse{Volume: volume}, want: volume},
		{name: "empty volume ID", resp: &csi.CreateVolumeResponse{Volume: &csi.Volume{CapacityBytes: 1 << 30}}},
		{name: "no volume", resp: &csi.CreateVolumeResponse{}},
		{name: "nil response", resp: nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			d := startDriver(t)
			d.expectConnect()
			d.controller.EXPECT().CreateVolume(gomock.Any(), utils.Protobuf(req)).Return(tc.resp, nil).Times(1)
			c := d.connect(ctx, t)

			got, err := c.CreateVolume(ctx, req)
			if tc.want != nil {
				if err != nil {
					t.Fatalf("CreateVolume: %v", err)
				}
				if !proto.Equal(got, tc.want) {
					t.Errorf("CreateVolume = %v, want %v", got, tc.want)
				}
				return
			}
			if err == nil {
				t.Fatalf("CreateVolume = %v, want an error", got)
			}
			var ce *csiclient.Error
			if !errors.As(err, &ce) || ce.Method != "CreateVolume" || ce.Volume != req.GetName() {
				t.Errorf("error %v (%T) is not an *Error for CreateVolume %q", err, err, req.GetName())
			}
			for _, mayReschedule := range []bool{false, true} {
				if class := csiclient.Classify(err, mayReschedule); class != csiclient.InProgress {
					t.Errorf("Classify(%v, %t) = %v, want %v: the volume may exist", err, mayReschedule, class, csiclient.InProgress)
				}
			}
			if _, ok := status.FromError(err); ok {
				t.Errorf("status.FromError(%v) reports a gRPC status the driver never sent", err)
			}
		})
	}
}

func TestDeleteVolume(t *testing.T) {
	tests := []struct {
		name      string
		driverErr error
		wantClass csiclient.Class // when driverErr is not nil
	}{
		{name: "deleted"},
		{name: "in use", driverErr: status.Error(codes.FailedPrecondition, "attached"), wantClass: csiclient.Final},
		{name: "busy", driverErr: status.Error(codes.Aborted, "operation pending"), wantClass: csiclient.InProgress},
		{name: "invalid ID", driverErr: status.Error(codes.InvalidArgument, "bad id"), wantClass: csiclient.Infeasible},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			req := &csi.DeleteVolumeRequest{VolumeId: "vol-0f2b", Secrets: map[string]string{"password": "x"}}
			d := startDriver(t)
			d.expectConnect()
			resp := &csi.DeleteVolumeResponse{}
			if tc.driverErr != nil {
				resp = nil
			}
			d.controller.EXPECT().DeleteVolume(gomock.Any(), utils.Protobuf(req)).Return(resp, tc.driverErr).Times(1)
			c := d.connect(ctx, t)

			err := c.DeleteVolume(ctx, req)
			if tc.driverErr == nil {
				if err != nil {
					t.Fatalf("DeleteVolume: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("DeleteVolume succeeded, want an error")
			}
			var ce *csiclient.Error
			if !errors.As(err, &ce) || ce.Method != "DeleteVolume" || ce.Volume != req.GetVolumeId() {
				t.Errorf("error %v (%T) is not an *Error for DeleteVolume %q", err, err, req.GetVolumeId())
			}
			if got, want := status.Code(err), status.Code(tc.driverErr); got != want {
				t.Errorf("status.Code(%v) = %v, want %v", err, got, want)
			}
			if got := csiclient.Classify(err, false); got != tc.wantClass {
				t.Errorf("Classify(%v, false) = %v, want %v", err, got, tc.wantClass)
			}
		})
	}
}

func TestGetCapacity(t *testing.T) {
	req := &csi.GetCapacityRequest{
		Parameters:         map[string]string{"type": "fast"},
		AccessibleTopology: &csi.Topology{Segments: map[string]string{"zone": "a"}},
	}
	answer := &csi.GetCapacityResponse{AvailableCapacity: 5 << 30, MaximumVolumeSize: wrapperspb.Int64(1 << 30)}
	tests := []struct {
		name      string
		driverErr error
	}{
		{name: "capacity"},
		{name: "error", driverErr: status.Error(codes.Unavailable, "backend down")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := connectWith(t, func(d *testDriver) {
				d.controller.EXPECT().GetCapacity(gomock.Any(), utils.Protobuf(req)).Return(orNil(answer, tc.driverErr), tc.driverErr).Times(1)
			})
			got, err := c.GetCapacity(t.Context(), req)
			checkAnswer(t, "GetCapacity", got, answer, err, tc.driverErr)
		})
	}
}

func TestNodeGetInfo(t *testing.T) {
	answer := &csi.NodeGetInfoResponse{NodeId: "node-a", AccessibleTopology: &csi.Topology{Segments: map[string]string{"zone": "a"}}}
	tests := []struct {
		name      string
		driverErr error
	}{
		{name: "info"},
		{name: "no node service", driverErr: status.Error(codes.Unimplemented, "controller only")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := connectWith(t, func(d *testDriver) {
				d.node.EXPECT().NodeGetInfo(gomock.Any(), gomock.Any()).Return(orNil(answer, tc.driverErr), tc.driverErr).Times(1)
			})
			got, err := c.NodeGetInfo(t.Context())
			checkAnswer(t, "NodeGetInfo", got, answer, err, tc.driverErr)
		})
	}
}

// connectWith starts a mock driver, expects the calls of Connect and then
// those expect sets up, and connects to it.
func connectWith(t *testing.T, expect func(*testDriver)) *csiclient.Client {
	t.Helper()
	d := startDriver(t)
	d.expectConnect()
	expect(d)
	return d.connect(t.Context(), t)
}

// orNil is the driver's response: answer, or nil when it fails with err.
func orNil[T any](answer *T, err error) *T {
	if err != nil {
		return nil
	}
	return answer
}

// checkAnswer checks the result of a call that either returns the driver's
// answer (driverErr nil) or fails with an *Error for method that carries
// the driver's gRPC code.
func checkAnswer(t *testing.T, method string, got, want proto.Message, err, driverErr error) {
	t.Helper()
	if driverErr == nil {
		if err != nil || !proto.Equal(got, want) {
			t.Fatalf("%s = %v, %v; want %v", method, got, err, want)
		}
		return
	}
	var ce *csiclient.Error
	if !errors.As(err, &ce) || ce.Method != method {
		t.Errorf("error %v (%T) is not an *Error for %s", err, err, method)
	}
	if got, want := status.Code(err), status.Code(driverErr); got != want {
		t.Errorf("status.Code(%v) = %v, want %v", err, got, want)
	}
}

func TestProbe(t *testing.T) {
	tests := []struct {
		name     string
		resp     *csi.ProbeResponse
		err      error
		wantErr  bool
		wantCode codes.Code
	}{
		{name: "ready", resp: &csi.ProbeResponse{Ready: wrapperspb.Bool(true)}},
		{name: "not ready", resp: &csi.ProbeResponse{Ready: wrapperspb.Bool(false)}, wantErr: true, wantCode: codes.Unknown},
		{name: "failing", err: status.Error(codes.FailedPrecondition, "disk missing"), wantErr: true, wantCode: codes.FailedPrecondition},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			d := startDriver(t)
			d.expectConnect()
			c := d.connect(ctx, t)
			d.identity.EXPECT().Probe(gomock.Any(), gomock.Any()).Return(tc.resp, tc.err).Times(1)

			err := c.Probe(ctx)
			if !tc.wantErr {
				if err != nil {
					t.Fatalf("Probe: %v", err)
				}
				return
			}
			var ce *csiclient.Error
			if !errors.As(err, &ce) || ce.Method != "Probe" {
				t.Fatalf("Probe error %v (%T) is not an *Error for Probe", err, err)
			}
			if got := csiclient.Code(err); got != tc.wantCode {
				t.Errorf("Code(%v) = %v, want %v", err, got, tc.wantCode)
			}
		})
	}
}

// TestChangeGate: while the gate refuses (a leader that may have lost its
// Lease), CreateVolume and DeleteVolume reach no driver (the mock fails
// the test on any call it does not expect) and fail as "may be in
// progress"; once the gate allows, each call goes out once.
func TestChangeGate(t *testing.T) {
	ctx := t.Context()
	d := startDriver(t)
	d.expectConnect()
	refuse := errors.New("not the leader")
	var gateErr error
	c := d.connect(ctx, t, csiclient.WithChangeGate(func() error { return gateErr }))

	gateErr = refuse
	_, createErr := c.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "pvc-1"})
	deleteErr := c.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: "vol-1"})
	for _, err := range []error{createErr, deleteErr} {
		if status.Code(err) != codes.Aborted || !strings.Contains(err.Error(), refuse.Error()) {
			t.Errorf("refused call: error %v, want Aborted naming %q", err, refuse)
		}
		if got := csiclient.Classify(err, false); got != csiclient.InProgress {
			t.Errorf("Classify(%v) = %v, want InProgress: a refused call must not release a claim's in-flight finalizer", err, got)
		}
	}

	gateErr = nil
	d.controller.EXPECT().CreateVolume(gomock.Any(), gomock.Any()).
		Return(&csi.CreateVolumeResponse{Volume: &csi.Volume{VolumeId: "vol-1"}}, nil).Times(1)
	d.controller.EXPECT().DeleteVolume(gomock.Any(), gomock.Any()).Return(&csi.DeleteVolumeResponse{}, nil).Times(1)
	if _, err := c.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "pvc-1"}); err != nil {
		t.Errorf("CreateVolume with the gate open: %v", err)
	}
	if err := c.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: "vol-1"}); err != nil {
		t.Errorf("DeleteVolume with the gate open: %v", err)
	}
}

// TestCallTimeout: a call that the driver does not answer ends at the call
// timeout (or when the caller cancels), the driver sees the deadline, and the
// error is InProgress: the driver may still be creating or deleting.
func TestCallTimeout(t *testing.T) {
	const callTimeout = 200 * time.Millisecond
	tests := []struct {
		name     string
		method   string
		cancel   bool // the caller cancels; the call timeout is long
		wantCode codes.Code
	}{
		{name: "CreateVolume times out", method: "CreateVolume", wantCode: codes.DeadlineExceeded},
		{name: "DeleteVolume times out", method: "DeleteVolume", wantCode: codes.DeadlineExceeded},
		{name: "CreateVolume canceled", method: "CreateVolume", cancel: true, wantCode: codes.Canceled},
		{name: "DeleteVolume canceled", method: "DeleteVolume", cancel: true, wantCode: codes.Canceled},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := startDriver(t)
			d.expectConnect()
			// started is closed when the driver has the call.
			started := make(chan struct{})
			hasDeadline := make(chan bool, 1)
			block := func(ctx context.Context) error {
				_, ok := ctx.Deadline()
				hasDeadline <- ok
				close(started)
				<-ctx.Done()
				return status.FromContextError(ctx.Err()).Err()
			}
			var call func(ctx context.Context, c *csiclient.Client) error
			switch tc.method {
			case "CreateVolume":
				d.controller.EXPECT().CreateVolume(gomock.Any(), gomock.Any()).
					DoAndReturn(func(ctx context.Context, _ *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
						return nil, block(ctx)
					}).Times(1)
				call = func(ctx context.Context, c *csiclient.Client) error {
					_, err := c.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "pvc-slow"})
					return err
				}
			case "DeleteVolume":
				d.controller.EXPECT().DeleteVolume(gomock.Any(), gomock.Any()).
					DoAndReturn(func(ctx context.Context, _ *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
						return nil, block(ctx)
					}).Times(1)
				call = func(ctx context.Context, c *csiclient.Client) error {
					return c.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: "vol-slow"})
				}
			}
			timeout := callTimeout
			if tc.cancel {
				timeout = time.Hour
			}
			c := d.connect(t.Context(), t, csiclient.WithCallTimeout(timeout))

			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			if tc.cancel {
				go func() {
					select {
					case <-started:
						cancel()
					case <-ctx.Done():
					}
				}()
			}
			start := time.Now()
			err := call(ctx, c)
			elapsed := time.Since(start)

			if got := csiclient.Code(err); got != tc.wantCode {
				t.Fatalf("%s error %v has code %v, want %v", tc.method, err, got, tc.wantCode)
			}
			var ce *csiclient.Error
			if !errors.As(err, &ce) {
				t.Errorf("error %v (%T) is not an *Error", err, err)
			}
			for _, mayReschedule := range []bool{false, true} {
				if got := csiclient.Classify(err, mayReschedule); got != csiclient.InProgress {
					t.Errorf("Classify(%v, %t) = %v, want %v", err, mayReschedule, got, csiclient.InProgress)
				}
			}
			if elapsed > callBound {
				t.Errorf("%s returned after %v", tc.method, elapsed)
			}
			select {
			case ok := <-hasDeadline:
				if !ok {
					t.Errorf("the driver's %s context had no deadline", tc.method)
				}
			case <-time.After(callBound):
				t.Errorf("the driver never received %s", tc.method)
			}
		})
	}
}

// TestSecretsAreNotLogged captures the client's logs at V(5), where
// csi-lib-utils logs every gRPC request through klog.FromContext, and checks
// that the request was logged without its secret.
func TestSecretsAreNotLogged(t *testing.T) {
	const secret = "s3cr3t-value"
	secrets := map[string]string{"password": secret}
	// secretArrived fails the call when the secret did not reach the driver,
	// so that the test cannot pass by not sending it.
	secretArrived := func(got map[string]string) error {
		if got["password"] != secret {
			return status.Error(codes.InvalidArgument, "the secret did not arrive")
		}
		return nil
	}
	tests := []struct {
		name   string
		method string
		expect func(d *testDriver)
		call   func(ctx context.Context, c *csiclient.Client) error
	}{
		{
			name:   "CreateVolume",
			method: "/csi.v1.Controller/CreateVolume",
			expect: func(d *testDriver) {
				d.controller.EXPECT().CreateVolume(gomock.Any(), gomock.Any()).
					DoAndReturn(func(_ context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
						if err := secretArrived(req.GetSecrets()); err != nil {
							return nil, err
						}
						return &csi.CreateVolumeResponse{Volume: &csi.Volume{VolumeId: "vol-1"}}, nil
					}).Times(1)
			},
			call: func(ctx context.Context, c *csiclient.Client) error {
				_, err := c.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "pvc-1", Secrets: secrets})
				return err
			},
		},
		{
			name:   "DeleteVolume",
			method: "/csi.v1.Controller/DeleteVolume",
			expect: func(d *testDriver) {
				d.controller.EXPECT().DeleteVolume(gomock.Any(), gomock.Any()).
					DoAndReturn(func(_ context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
						if err := secretArrived(req.GetSecrets()); err != nil {
							return nil, err
						}
						return &csi.DeleteVolumeResponse{}, nil
					}).Times(1)
			},
			call: func(ctx context.Context, c *csiclient.Client) error {
				return c.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: "vol-1", Secrets: secrets})
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx, c, logs := connectLogged(t, tc.expect)

			if err := tc.call(ctx, c); err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			out := logs.String()
			for _, want := range []string{`"GRPC call"`, tc.method, "***stripped***"} {
				if !strings.Contains(out, want) {
					t.Errorf("the logs do not contain %s: the request was not logged as expected\n%s", want, out)
				}
			}
			if strings.Contains(out, secret) {
				t.Errorf("the logs contain the secret:\n%s", out)
			}
		})
	}
}

func TestMetrics(t *testing.T) {
	tests := []struct {
		name      string
		method    string
		expect    func(d *testDriver)
		call      func(ctx context.Context, c *csiclient.Client) error
		wantCode  string
		wantError bool
	}{
		{
			name:   "CreateVolume OK",
			method: "/csi.v1.Controller/CreateVolume",
			expect: func(d *testDriver) {
				d.controller.EXPECT().CreateVolume(gomock.Any(), gomock.Any()).
					Return(&csi.CreateVolumeResponse{Volume: &csi.Volume{VolumeId: "vol-1"}}, nil).Times(1)
			},
			call: func(ctx context.Context, c *csiclient.Client) error {
				_, err := c.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "pvc-1"})
				return err
			},
			wantCode: "OK",
		},
		{
			name:   "CreateVolume ResourceExhausted",
			method: "/csi.v1.Controller/CreateVolume",
			expect: func(d *testDriver) {
				d.controller.EXPECT().CreateVolume(gomock.Any(), gomock.Any()).
					Return(nil, status.Error(codes.ResourceExhausted, "full")).Times(1)
			},
			call: func(ctx context.Context, c *csiclient.Client) error {
				_, err := c.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "pvc-1"})
				return err
			},
			wantCode:  "ResourceExhausted",
			wantError: true,
		},
		{
			name:   "DeleteVolume OK",
			method: "/csi.v1.Controller/DeleteVolume",
			expect: func(d *testDriver) {
				d.controller.EXPECT().DeleteVolume(gomock.Any(), gomock.Any()).Return(&csi.DeleteVolumeResponse{}, nil).Times(1)
			},
			call: func(ctx context.Context, c *csiclient.Client) error {
				return c.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: "vol-1"})
			},
			wantCode: "OK",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			mm := metrics.NewCSIMetricsManagerWithOptions("", metrics.WithSubsystem(metrics.SubsystemSidecar))
			d := startDriver(t)
			d.expectConnect()
			tc.expect(d)
			c := d.connect(ctx, t, csiclient.WithMetrics(mm))

			if err := tc.call(ctx, c); (err != nil) != tc.wantError {
				t.Fatalf("call error = %v, want error %t", err, tc.wantError)
			}
			labels := map[string]string{
				"driver_name":      testDriverName,
				"method_name":      tc.method,
				"grpc_status_code": tc.wantCode,
			}
			if got := histogramCount(t, mm, "csi_sidecar_operations_seconds", labels); got != 1 {
				t.Errorf("csi_sidecar_operations_seconds%v has %d samples, want 1", labels, got)
			}
		})
	}
}

// TestConnectionLoss: when the driver goes away after Connect, the
// connection-loss handler is called once; its answer decides whether the
// client reconnects.
func TestConnectionLoss(t *testing.T) {
	tests := []struct {
		name      string
		reconnect bool
	}{
		{name: "reconnect", reconnect: true},
		{name: "stay disconnected", reconnect: false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			d := startDriver(t)
			d.expectConnect()
			var calls atomic.Int32
			lost := make(chan struct{})
			onLoss := func(context.Context) bool {
				if calls.Add(1) == 1 {
					close(lost)
				}
				return tc.reconnect
			}
			c := d.connect(ctx, t, csiclient.WithOnConnectionLoss(onLoss), csiclient.WithCallTimeout(callBound))

			d.server.Stop()
			// gRPC dials again, and so notices the loss, when a call needs the
			// connection: keep calling until the handler has run.
			err := poll(ctx, 30*time.Second, func(ctx context.Context) (bool, error) {
				if err := c.Probe(ctx); err == nil {
					return false, errors.New("Probe succeeded on a stopped driver")
				}
				select {
				case <-lost:
					return true, nil
				default:
					return false, nil
				}
			})
			if err != nil {
				t.Fatalf("wait for the connection-loss handler: %v", err)
			}

			if tc.reconnect {
				d.identity.EXPECT().Probe(gomock.Any(), gomock.Any()).
					Return(&csi.ProbeResponse{Ready: wrapperspb.Bool(true)}, nil).MinTimes(1)
				if err := d.server.StartOnAddress("unix", d.socket); err != nil {
					t.Fatalf("restart the mock driver: %v", err)
				}
				err := poll(ctx, 30*time.Second, func(ctx context.Context) (bool, error) {
					return c.Probe(ctx) == nil, nil
				})
				if err != nil {
					t.Fatalf("the client did not reconnect to the restarted driver: %v", err)
				}
			} else {
				_, err := c.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "pvc-1"})
				if got := csiclient.Code(err); got != codes.Unavailable {
					t.Errorf("CreateVolume after the loss: error %v has code %v, want %v", err, got, codes.Unavailable)
				}
				if got := csiclient.Classify(err, false); got != csiclient.InProgress {
					t.Errorf("Classify(%v) = %v, want %v", err, got, csiclient.InProgress)
				}
			}
			if got := calls.Load(); got != 1 {
				t.Errorf("the connection-loss handler ran %d times, want 1", got)
			}
		})
	}
}

// TestMetricsMigrated: with a metrics manager that has the migrated label,
// calls made with WithMigrated are recorded with migrated="true", the others
// with "false".
func TestMetricsMigrated(t *testing.T) {
	ctx := t.Context()
	mm := metrics.NewCSIMetricsManagerWithOptions("", metrics.WithSubsystem(metrics.SubsystemSidecar), metrics.WithMigration())
	d := startDriver(t)
	d.expectConnect()
	d.controller.EXPECT().DeleteVolume(gomock.Any(), gomock.Any()).Return(&csi.DeleteVolumeResponse{}, nil).Times(3)
	c := d.connect(ctx, t, csiclient.WithMetrics(mm))
	for _, callCtx := range []context.Context{csiclient.WithMigrated(ctx), csiclient.WithMigrated(ctx), ctx} {
		if err := c.DeleteVolume(callCtx, &csi.DeleteVolumeRequest{VolumeId: "vol-1"}); err != nil {
			t.Fatal(err)
		}
	}
	for migrated, want := range map[string]uint64{"true": 2, "false": 1} {
		labels := map[string]string{
			"driver_name": testDriverName, "method_name": "/csi.v1.Controller/DeleteVolume", "grpc_status_code": "OK", "migrated": migrated,
		}
		if got := histogramCount(t, mm, "csi_sidecar_operations_seconds", labels); got != want {
			t.Errorf("csi_sidecar_operations_seconds%v has %d samples, want %d", labels, got, want)
		}
	}
}
