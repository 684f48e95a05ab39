package csiclient

import (
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Class says what a caller must do after a failed CSI call. Classes are
// decided here and nowhere else.
type Class int

const (
	// Final means the driver answered and the operation is over. For CreateVolume
	// no volume was created by this call and none is being created; retrying
	// is allowed but only a change of input can make it succeed.
	Final Class = iota
	// InProgress means the driver may still be working on the request, or the
	// answer was lost. The caller must retry the SAME request (CSI calls are
	// idempotent by name) until it gets a success or a final answer; giving up
	// could leak a volume.
	InProgress
	// Reschedule means the driver cannot create the volume on the node the scheduler
	// picked; the caller should ask the scheduler for another node (remove
	// volume.kubernetes.io/selected-node). Nothing is in progress.
	Reschedule
	// Infeasible means the request itself is invalid (InvalidArgument). Nothing is
	// in progress; retry slowly, the same request will keep failing.
	Infeasible
)

func (c Class) String() string {
	switch c {
	case Final:
		return "final"
	case InProgress:
		return "in progress"
	case Reschedule:
		return "reschedule"
	case Infeasible:
		return "infeasible"
	}
	return fmt.Sprintf("Class(%d)", int(c))
}

// Classify maps the error of a CSI call to a Class. mayReschedule is true
// when the driver supports volume accessibility constraints and the scheduler
// selected a node for the volume. The table (the same as upstream
// external-provisioner's):
//
//	error                                          class
//	not a gRPC status (connection or client error)  InProgress
//	Canceled, DeadlineExceeded, Unavailable, Aborted InProgress
//	ResourceExhausted, mayReschedule                Reschedule
//	ResourceExhausted, otherwise                    Final
//	InvalidArgument                                 Infeasible
//	every other code                                Final
//
// A timeout is never final: the driver may still be creating the volume.
// err must not be nil.
func Classify(err error, mayReschedule bool) Class {
	st, ok := grpcStatus(err)
	if !ok {
		return InProgress
	}
	switch st.Code() {
	case codes.Canceled, codes.DeadlineExceeded, codes.Unavailable, codes.Aborted:
		return InProgress
	case codes.ResourceExhausted:
		if mayReschedule {
			return Reschedule
		}
		return Final
	case codes.InvalidArgument:
		return Infeasible
	default:
		return Final
	}
}

// Code returns the gRPC code of a CSI call's error: codes.OK for nil and
// codes.Unknown for an error that carries no gRPC status.
func Code(err error) codes.Code {
	if err == nil {
		return codes.OK
	}
	st, ok := grpcStatus(err)
	if !ok {
		return codes.Unknown
	}
	return st.Code()
}

// grpcStatus finds a gRPC status in err's chain. A context error that never
// reached gRPC has none, and neither has an *Error around such an error (its
// GRPCStatus returns nil); a nil status counts as none, not as codes.OK.
func grpcStatus(err error) (*status.Status, bool) {
	var se interface{ GRPCStatus() *status.Status }
	if errors.As(err, &se) {
		if st := se.GRPCStatus(); st != nil {
			return st, true
		}
	}
	return nil, false
}

// Error is the error of a CSI call made through a [Client]. It keeps the
// gRPC status for [Classify] and names the call and the volume.
type Error struct {
	// Method is the CSI method, e.g. "CreateVolume".
	Method string
	// Volume is the volume name (CreateVolume) or ID (DeleteVolume).
	Volume string
	// Err is the error returned by gRPC.
	Err error
}

func (e *Error) Error() string {
	if e.Volume == "" {
		return fmt.Sprintf("%s: %v", e.Method, e.Err)
	}
	return fmt.Sprintf("%s %q: %v", e.Method, e.Volume, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// GRPCStatus lets status.FromError and upstream code that inspects gRPC codes
// (such as the provisioner library's infeasible-error check) see the code
// through the wrapper. When Err carries no status, neither does the wrapper:
// it returns nil, so status.FromError reports ok=false and status.Code
// Unknown, exactly as for Err itself. A made-up Unknown status would look
// like a final answer from the driver to such code, while [Classify] says
// InProgress.
func (e *Error) GRPCStatus() *status.Status {
	if st, ok := grpcStatus(e.Err); ok {
		return st
	}
	return nil
}
