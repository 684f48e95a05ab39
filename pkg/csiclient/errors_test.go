package csiclient_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"go.uber.org/mock/gomock"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kube-storage/csi-provisioner/pkg/csiclient"
)

// classTable is the class of every gRPC code, without and with
// mayReschedule. TestClassTableIsComplete keeps it complete.
var classTable = []struct {
	code              codes.Code
	want              csiclient.Class // mayReschedule false
	wantMayReschedule csiclient.Class // mayReschedule true
}{
	{codes.OK, csiclient.Final, csiclient.Final},
	{codes.Canceled, csiclient.InProgress, csiclient.InProgress},
	{codes.Unknown, csiclient.Final, csiclient.Final},
	{codes.InvalidArgument, csiclient.Infeasible, csiclient.Infeasible},
	{codes.DeadlineExceeded, csiclient.InProgress, csiclient.InProgress},
	{codes.NotFound, csiclient.Final, csiclient.Final},
	{codes.AlreadyExists, csiclient.Final, csiclient.Final},
	{codes.PermissionDenied, csiclient.Final, csiclient.Final},
	{codes.ResourceExhausted, csiclient.Final, csiclient.Reschedule},
	{codes.FailedPrecondition, csiclient.Final, csiclient.Final},
	{codes.Aborted, csiclient.InProgress, csiclient.InProgress},
	{codes.OutOfRange, csiclient.Final, csiclient.Final},
	{codes.Unimplemented, csiclient.Final, csiclient.Final},
	{codes.Internal, csiclient.Final, csiclient.Final},
	{codes.Unavailable, csiclient.InProgress, csiclient.InProgress},
	{codes.DataLoss, csiclient.Final, csiclient.Final},
	{codes.Unauthenticated, csiclient.Final, csiclient.Final},
}

func TestClassTableIsComplete(t *testing.T) {
	// codes.Unauthenticated is the last code gRPC defines.
	if got, want := len(classTable), int(codes.Unauthenticated)+1; got != want {
		t.Fatalf("classTable has %d codes, want %d", got, want)
	}
	for i, tc := range classTable {
		if int(tc.code) != i {
			t.Errorf("classTable[%d] is %v, want code %d", i, tc.code, i)
		}
	}
}

// okStatusError carries codes.OK. status.Error(codes.OK, ...) is nil, so
// only a type of our own can put OK into an error.
type okStatusError struct{}

func (okStatusError) Error() string              { return "ok but an error" }
func (okStatusError) GRPCStatus() *status.Status { return status.New(codes.OK, "ok but an error") }

func statusError(code codes.Code) error {
	if code == codes.OK {
		return okStatusError{}
	}
	return status.Error(code, "injected "+code.String())
}

func TestClassify(t *testing.T) {
	for _, tc := range classTable {
		t.Run(tc.code.String(), func(t *testing.T) {
			raw := statusError(tc.code)
			errs := map[string]error{
				"raw":           raw,
				"wrapped":       fmt.Errorf("provision claim ns/pvc: %w", raw),
				"*Error":        &csiclient.Error{Method: "CreateVolume", Volume: "pvc-1", Err: raw},
				"wrapped*Error": fmt.Errorf("provision claim ns/pvc: %w", &csiclient.Error{Method: "CreateVolume", Err: raw}),
			}
			for name, err := range errs {
				if got := csiclient.Classify(err, false); got != tc.want {
					t.Errorf("%s: Classify(%v, false) = %v, want %v", name, err, got, tc.want)
				}
				if got := csiclient.Classify(err, true); got != tc.wantMayReschedule {
					t.Errorf("%s: Classify(%v, true) = %v, want %v", name, err, got, tc.wantMayReschedule)
				}
				if got := csiclient.Code(err); got != tc.code {
					t.Errorf("%s: Code(%v) = %v, want %v", name, err, got, tc.code)
				}
			}
		})
	}
}

// TestClassifyNonGRPC: an error without a gRPC status never reached the
// driver or lost its answer; the volume may exist, so it is in progress.
func TestClassifyNonGRPC(t *testing.T) {
	tests := []struct {
		name string
		err  error
	}{
		{"deadline", context.DeadlineExceeded},
		{"canceled", context.Canceled},
		{"plain", errors.New("connection reset")},
		{"wrapped deadline", fmt.Errorf("create volume: %w", context.DeadlineExceeded)},
		{"*Error around plain", &csiclient.Error{Method: "CreateVolume", Volume: "pvc-1", Err: errors.New("driver returned no volume ID")}},
		{"wrapped *Error around deadline", fmt.Errorf("sync: %w", &csiclient.Error{Method: "DeleteVolume", Err: context.DeadlineExceeded})},
		{"*Error around *Error around plain", &csiclient.Error{Method: "CreateVolume", Err: fmt.Errorf("retry: %w", &csiclient.Error{Method: "CreateVolume", Err: errors.New("boom")})}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for _, mayReschedule := range []bool{false, true} {
				if got := csiclient.Classify(tc.err, mayReschedule); got != csiclient.InProgress {
					t.Errorf("Classify(%v, %t) = %v, want %v", tc.err, mayReschedule, got, csiclient.InProgress)
				}
			}
			if got := csiclient.Code(tc.err); got != codes.Unknown {
				t.Errorf("Code(%v) = %v, want %v", tc.err, got, codes.Unknown)
			}
			// status sees the same thing through our wrapper as without it:
			// no gRPC status. Upstream code (the provisioner library's
			// infeasible check, external-provisioner's checkError) treats
			// "no status" as not final, and a made-up Unknown as final.
			if _, ok := status.FromError(tc.err); ok {
				t.Errorf("status.FromError(%v) found a gRPC status, want none", tc.err)
			}
		})
	}
}

func TestCode(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want codes.Code
	}{
		{"nil", nil, codes.OK},
		{"status", status.Error(codes.NotFound, "x"), codes.NotFound},
		{"wrapped status", fmt.Errorf("a: %w", status.Error(codes.Aborted, "x")), codes.Aborted},
		{"*Error", &csiclient.Error{Method: "DeleteVolume", Err: status.Error(codes.Internal, "x")}, codes.Internal},
		{"*Error around *Error", &csiclient.Error{Method: "DeleteVolume", Err: &csiclient.Error{Method: "DeleteVolume", Err: status.Error(codes.Aborted, "x")}}, codes.Aborted},
		{"not gRPC", errors.New("x"), codes.Unknown},
		{"context", context.Canceled, codes.Unknown},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := csiclient.Code(tc.err); got != tc.want {
				t.Errorf("Code(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}

func TestClassString(t *testing.T) {
	tests := []struct {
		class csiclient.Class
		want  string
	}{
		{csiclient.Final, "final"},
		{csiclient.InProgress, "in progress"},
		{csiclient.Reschedule, "reschedule"},
		{csiclient.Infeasible, "infeasible"},
		{csiclient.Class(42), "Class(42)"},
	}
	for _, tc := range tests {
		t.Run(tc.want, func(t *testing.T) {
			if got := tc.class.String(); got != tc.want {
				t.Errorf("Class(%d).String() = %q, want %q", int(tc.class), got, tc.want)
			}
		})
	}
}

func TestErrorMessage(t *testing.T) {
	tests := []struct {
		name string
		err  *csiclient.Error
		want string
	}{
		{"with volume", &csiclient.Error{Method: "CreateVolume", Volume: "pvc-1", Err: errors.New("boom")}, `CreateVolume "pvc-1": boom`},
		{"without volume", &csiclient.Error{Method: "Probe", Err: errors.New("boom")}, "Probe: boom"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.err.Error(); got != tc.want {
				t.Errorf("Error() = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestCreateVolumeErrorClasses sends every code through a real connection:
// the mock driver fails CreateVolume with it, and the error the client
// returns must classify as the raw status does and keep the code visible to
// errors.As, status.FromError and status.Code. codes.OK is not in the loop:
// a driver cannot send an error with it (see TestCreateVolume for a driver
// that answers OK without a volume).
func TestCreateVolumeErrorClasses(t *testing.T) {
	ctx := t.Context()
	d := startDriver(t)
	d.expectConnect()
	d.controller.EXPECT().CreateVolume(gomock.Any(), gomock.Any()).
		DoAndReturn(func(_ context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
			code, ok := codes.Code(0), false
			for _, tc := range classTable {
				if req.GetName() == "pvc-"+tc.code.String() {
					code, ok = tc.code, true
				}
			}
			if !ok {
				return nil, status.Errorf(codes.Internal, "unexpected volume name %q", req.GetName())
			}
			return nil, status.Error(code, "injected")
		}).Times(len(classTable) - 1)
	c := d.connect(ctx, t)

	for _, tc := range classTable[1:] {
		t.Run(tc.code.String(), func(t *testing.T) {
			name := "pvc-" + tc.code.String()
			vol, err := c.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: name})
			if err == nil {
				t.Fatalf("CreateVolume returned %v and no error, want code %v", vol, tc.code)
			}
			if vol != nil {
				t.Errorf("CreateVolume returned volume %v with error %v", vol, err)
			}
			var ce *csiclient.Error
			if !errors.As(err, &ce) {
				t.Fatalf("CreateVolume error %v (%T) is not a *csiclient.Error", err, err)
			}
			if ce.Method != "CreateVolume" || ce.Volume != name {
				t.Errorf("Error{Method: %q, Volume: %q}, want {CreateVolume, %q}", ce.Method, ce.Volume, name)
			}
			if !strings.Contains(err.Error(), name) {
				t.Errorf("error %q does not name the volume %q", err, name)
			}
			if st, ok := status.FromError(err); !ok || st.Code() != tc.code {
				t.Errorf("status.FromError(%v) = %v, %t, want code %v", err, st.Code(), ok, tc.code)
			}
			if got := status.Code(err); got != tc.code {
				t.Errorf("status.Code(%v) = %v, want %v", err, got, tc.code)
			}
			if got := csiclient.Code(err); got != tc.code {
				t.Errorf("Code(%v) = %v, want %v", err, got, tc.code)
			}
			if got := csiclient.Classify(err, false); got != tc.want {
				t.Errorf("Classify(%v, false) = %v, want %v", err, got, tc.want)
			}
			if got := csiclient.Classify(err, true); got != tc.wantMayReschedule {
				t.Errorf("Classify(%v, true) = %v, want %v", err, got, tc.wantMayReschedule)
			}
		})
	}
}
