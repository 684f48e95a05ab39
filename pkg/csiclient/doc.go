// Package csiclient is the sidecar's only boundary to the CSI driver and the
// only package that speaks gRPC. It connects to the driver's unix socket,
// waits for Probe, discovers the driver's name and capabilities once, carries
// CreateVolume and DeleteVolume with a per-call timeout, and classifies every
// error into what the caller must do next (see [Class]).
//
// It never imports client-go: it knows nothing of Kubernetes objects.
//
// # Connecting
//
// [Connect] accepts only a unix domain socket named by an absolute path, bare
// (/run/csi/socket) or as a URL (unix:///run/csi/socket, or gRPC's
// unix:/run/csi/socket, which upstream also dials); anything else,
// TCP and gRPC resolver targets included, is refused with [ErrNotUnixSocket]
// or another error before anything is dialled. It then waits, up to the probe
// timeout, until the driver's Probe reports ready, and reads GetPluginInfo,
// GetPluginCapabilities and, for a driver with the controller service,
// ControllerGetCapabilities, each exactly once and each within the call
// timeout. The result is the [Capabilities] of the [Client], fixed for its
// life; CreateVolume and DeleteVolume never ask again.
//
// # Losing the connection
//
// By default a client whose established connection drops ends the process:
// Connect installs csi-lib-utils' connection.ExitOnConnectionLoss, which
// writes "Lost connection to CSI driver, exiting" to /dev/termination-log and
// exits with status 1. Upstream external-provisioner and the other CSI
// sidecars do the same, and for the same reason: the driver has restarted,
// possibly as a new version, so the capabilities read once at start-up may no
// longer hold, and anything the driver was doing for an unanswered call is
// unknown. Kubernetes restarts the sidecar container, which shows the message
// as its termination reason; the new process connects, probes and reads the
// capabilities again, and since CSI calls are idempotent by name it can
// repeat whatever was in flight.
//
// [WithOnConnectionLoss] replaces that handler, for tests and for programs
// that rebuild their client themselves. It runs once per loss, on a gRPC
// goroutine, when gRPC next dials the socket (in practice at the next call).
// Returning true redials the same socket and keeps the old capabilities;
// returning false leaves the connection down, and every later call fails
// with codes.Unavailable, which [Classify] reports as InProgress.
//
// # Errors
//
// Every failed call returns an [*Error] naming the method and volume. It
// keeps the driver's gRPC status visible to errors.As, status.FromError and
// status.Code, and [Classify] maps it to a [Class] once, here. An error
// without a gRPC status (a timeout before gRPC, a reply without a volume ID)
// is InProgress: the volume may exist.
//
// # Logging and metrics
//
// csi-lib-utils logs every request and response at V(5) through the logger
// of the call's context, with fields marked csi_secret (all secrets maps)
// replaced by "***stripped***". A driver's error message cannot be sanitized
// that way, and some drivers format the request into it: CreateVolume and
// DeleteVolume replace the values of the request's secrets in the error they
// return, and in what is logged during the call, by "***stripped***" too,
// keeping the gRPC code. So are the value's quoted forms and, for a value
// of four bytes or more, its base64 and URL-escaped forms. Every
// occurrence is replaced, wherever it is: a secret of a character or two
// ("1", "ab") also strips those characters from the driver's own words,
// which is the price of never showing it. A secret encoded in any other
// way (hex, or base64 of a longer text that contains it, such as
// "user:password") is not recognised. With [WithMetrics], every call is recorded in
// csi_sidecar_operations_seconds{driver_name, method_name, grpc_status_code}.
// Connect sets the manager's driver name once GetPluginInfo has answered; the
// probes before it carry the manager's initial name ("unknown-driver" for a
// manager created without one).
package csiclient
