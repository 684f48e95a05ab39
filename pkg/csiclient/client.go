package csiclient

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/kubernetes-csi/csi-lib-utils/connection"
	"github.com/kubernetes-csi/csi-lib-utils/metrics"
	"github.com/kubernetes-csi/csi-lib-utils/rpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
)

// Defaults of the options; one place.
const (
	DefaultCallTimeout    = 10 * time.Second
	DefaultConnectTimeout = 30 * time.Second
	// DefaultProbeTimeout is 0: wait for the driver to be ready for as long
	// as it takes, as upstream's ProbeForever (each Probe bounded by the call
	// timeout; a Probe error other than a timeout ends the wait).
	DefaultProbeTimeout = 0
)

// ErrNotUnixSocket is returned by [Connect] for an address that is not a unix
// domain socket. The CSI spec allows only unix sockets as endpoints; the
// sidecar sends secrets over this connection without TLS, so a TCP endpoint
// would expose them to the network.
var ErrNotUnixSocket = errors.New("the CSI endpoint must be a unix domain socket (a path, or a unix:// or unix: URL)")

// Option configures [Connect].
type Option func(*options)

type options struct {
	callTimeout    time.Duration
	connectTimeout time.Duration
	probeTimeout   time.Duration
	metrics        metrics.CSIMetricsManager
	onLoss         func(context.Context) bool
	gate           func() error
}

// WithCallTimeout bounds every CSI call (the --timeout flag). Default 10s.
func WithCallTimeout(d time.Duration) Option { return func(o *options) { o.callTimeout = d } }

// WithConnectTimeout bounds the initial connection to the socket. Default 30s,
// as upstream.
func WithConnectTimeout(d time.Duration) Option { return func(o *options) { o.connectTimeout = d } }

// WithProbeTimeout bounds the wait for the driver's Probe to report ready.
// 0, the default, waits until ctx is done, as upstream.
func WithProbeTimeout(d time.Duration) Option { return func(o *options) { o.probeTimeout = d } }

// WithMetrics records csi_sidecar_operations_seconds for every call in m
// (csi-lib-utils metrics). Connect sets m's driver name.
func WithMetrics(m metrics.CSIMetricsManager) Option { return func(o *options) { o.metrics = m } }

// WithMigrated marks the calls made with the returned context as CSI
// migration operations (a volume of an in-tree plugin): a metrics manager
// built with metrics.WithMigration records them with migrated="true", and
// other calls with "false", as upstream.
func WithMigrated(ctx context.Context) context.Context {
	return context.WithValue(ctx, connection.AdditionalInfoKey, connection.AdditionalInfo{Migrated: "true"})
}

// WithOnConnectionLoss replaces what happens when an established connection
// drops. The default, as upstream, exits the process with "Lost connection
// to CSI driver, exiting" written to /dev/termination-log, so the pod
// restarts and the sidecar re-discovers a possibly upgraded driver. The
// callback returns true to reconnect instead.
func WithOnConnectionLoss(f func(context.Context) bool) Option {
	return func(o *options) { o.onLoss = f }
}

// WithChangeGate makes CreateVolume and DeleteVolume ask gate first, and not
// send the call while it returns an error. With leader election the sidecar
// gates them on its hold of the Lease: a leader that was paused past its
// Lease resumes with library retries that are due, and its API writes are
// fenced; without the gate such a retry could still create a volume that
// no process records (the new leader may have provisioned, bound and
// deleted the claim meanwhile). A refused call fails with codes.Aborted,
// which [Classify] takes for "may be in progress": nothing that keeps a
// claim's in-flight finalizer is released because of it.
func WithChangeGate(gate func() error) Option { return func(o *options) { o.gate = gate } }

// Capabilities are what the driver said about itself at start-up. They are
// read once by [Connect] and never change for the life of a Client.
type Capabilities struct {
	DriverName    string
	VendorVersion string

	// Plugin capabilities.
	ControllerService bool
	// VolumeAccessibility is VOLUME_ACCESSIBILITY_CONSTRAINTS: the driver
	// understands topology.
	VolumeAccessibility bool

	// Controller capabilities.
	CreateDeleteVolume    bool
	PublishUnpublish      bool
	ListVolumes           bool
	GetCapacity           bool
	CreateDeleteSnapshot  bool
	ListSnapshots         bool
	CloneVolume           bool
	PublishReadonly       bool
	ExpandVolume          bool
	SingleNodeMultiWriter bool
	ModifyVolume          bool
	GetVolume             bool
}

// Driver is what the provisioner needs from a CSI driver: its capabilities,
// read once, and the two calls that create and delete volumes. [Client]
// implements it; tests use hand-written fakes.
type Driver interface {
	// Capabilities returns what the driver reported at start-up.
	Capabilities() Capabilities
	// CreateVolume creates a volume or returns the existing one with the same
	// name. Errors are classified with [Classify].
	CreateVolume(ctx context.Context, req *csi.CreateVolumeRequest) (*csi.Volume, error)
	// DeleteVolume deletes a volume; an unknown volume ID is not an error.
	DeleteVolume(ctx context.Context, req *csi.DeleteVolumeRequest) error
}

var _ Driver = (*Client)(nil)

// Client carries CSI calls to one driver. It is safe for concurrent use.
type Client struct {
	address string
	conn    *grpc.ClientConn
	caps    Capabilities
	timeout time.Duration
	ctrl    csi.ControllerClient
	gate    func() error
}

// Connect dials the driver at address (a path, or a unix:// or unix: URL), waits until
// its Probe reports ready, and reads its name and capabilities once.
// Progress is logged while it waits. Every error names the socket.
func Connect(ctx context.Context, address string, opts ...Option) (*Client, error) {
	o := options{
		callTimeout:    DefaultCallTimeout,
		connectTimeout: DefaultConnectTimeout,
		probeTimeout:   DefaultProbeTimeout,
		onLoss:         connection.ExitOnConnectionLoss(),
	}
	for _, opt := range opts {
		opt(&o)
	}
	if err := CheckAddress(address); err != nil {
		return nil, err
	}
	logger := klog.FromContext(ctx).WithValues("csiAddress", address)
	ctx = klog.NewContext(ctx, logger)
	logger.V(2).Info("Connecting to the CSI driver")

	connOpts := []connection.Option{connection.WithTimeout(o.connectTimeout), connection.OnConnectionLoss(o.onLoss)}
	path := socketPath(address)
	// csi-lib-utils installs its dialer, and with it OnConnectionLoss, only
	// for a path or a unix:// URL; unix:/path would go to gRPC's resolver.
	conn, err := connection.Connect(ctx, "unix://"+path, o.metrics, connOpts...)
	if err != nil {
		if _, statErr := os.Stat(path); errors.Is(statErr, fs.ErrNotExist) {
			return nil, fmt.Errorf("connect to the CSI driver at %q within %s: the socket does not exist (is the driver running, and does it share the socket's directory with the sidecar?): %w", address, o.connectTimeout, err)
		}
		return nil, fmt.Errorf("connect to the CSI driver at %q within %s: %w", address, o.connectTimeout, err)
	}
	c := &Client{address: address, conn: conn, timeout: o.callTimeout, ctrl: csi.NewControllerClient(conn), gate: o.gate}
	if err := c.init(ctx, o); err != nil {
		_ = conn.Close()
		return nil, err
	}
	return c, nil
}

// CheckAddress accepts an absolute socket path, bare or as a unix:// or
// unix: URL,
// and refuses everything else ([ErrNotUnixSocket] for another scheme or a
// host:port). The error names the address. Connect calls it first; a
// command can call it to reject a bad flag before connecting.
func CheckAddress(address string) error {
	if err := checkAddress(address); err != nil {
		return fmt.Errorf("CSI driver at %q: %w", address, err)
	}
	return nil
}

// checkAddress is CheckAddress without the address in the message.
// csi-lib-utils dials only those as unix sockets; it hands anything else to
// gRPC's name resolution, which would dial "localhost:10000" over TCP, and
// unix:/path (gRPC's other spelling of a unix URL, which upstream accepts
// that way) to a unix socket.
func checkAddress(address string) error {
	path, isURL := cutUnixScheme(address)
	switch {
	case address == "":
		return errors.New("empty address")
	case isURL && path == "":
		return errors.New("empty socket path")
	case strings.HasPrefix(path, "/"):
		return nil
	case isURL:
		// gRPC would read "unix://run/csi.sock" as host "run".
		return errors.New("the socket path of a unix: URL must be absolute (unix:///path/to/socket or unix:/path/to/socket)")
	case strings.Contains(address, ":"):
		// Another scheme (tcp://, dns:///, passthrough:///) or host:port.
		return ErrNotUnixSocket
	default:
		return errors.New("the socket path must be absolute")
	}
}

// cutUnixScheme returns address without its unix:// or unix: scheme, and
// whether it had one.
func cutUnixScheme(address string) (string, bool) {
	if path, ok := strings.CutPrefix(address, "unix://"); ok {
		return path, true
	}
	return strings.CutPrefix(address, "unix:")
}

// socketPath returns the socket path of an address that checkAddress
// accepted.
func socketPath(address string) string {
	path, _ := cutUnixScheme(address)
	return path
}

func (c *Client) init(ctx context.Context, o options) error {
	logger := klog.FromContext(ctx)
	probeCtx, bound := ctx, "until it is ready"
	if o.probeTimeout > 0 {
		var cancel context.CancelFunc
		probeCtx, cancel = context.WithTimeout(ctx, o.probeTimeout)
		defer cancel()
		bound = "up to " + o.probeTimeout.String()
	}
	if err := rpc.ProbeForever(probeCtx, c.conn, o.callTimeout); err != nil {
		return fmt.Errorf("probe the CSI driver at %q (waiting %s for it to be ready): %w", c.address, bound, err)
	}
	// Each call gets the whole call timeout, as CreateVolume does; they do
	// not share one.
	info, err := withTimeout(ctx, o.callTimeout, func(ctx context.Context) (*csi.GetPluginInfoResponse, error) {
		return csi.NewIdentityClient(c.conn).GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
	})
	if err != nil {
		return fmt.Errorf("GetPluginInfo from the CSI driver at %q: %w", c.address, err)
	}
	if info.GetName() == "" {
		return fmt.Errorf("CSI driver at %q reports an empty driver name", c.address)
	}
	c.caps.DriverName = info.GetName()
	c.caps.VendorVersion = info.GetVendorVersion()
	if o.metrics != nil {
		o.metrics.SetDriverName(c.caps.DriverName)
	}

	plugin, err := withTimeout(ctx, o.callTimeout, func(ctx context.Context) (rpc.PluginCapabilitySet, error) {
		return rpc.GetPluginCapabilities(ctx, c.conn)
	})
	if err != nil {
		return fmt.Errorf("GetPluginCapabilities from the CSI driver %q at %q: %w", c.caps.DriverName, c.address, err)
	}
	c.caps.ControllerService = plugin[csi.PluginCapability_Service_CONTROLLER_SERVICE]
	c.caps.VolumeAccessibility = plugin[csi.PluginCapability_Service_VOLUME_ACCESSIBILITY_CONSTRAINTS]
	if c.caps.ControllerService {
		ctrl, err := withTimeout(ctx, o.callTimeout, func(ctx context.Context) (rpc.ControllerCapabilitySet, error) {
			return rpc.GetControllerCapabilities(ctx, c.conn)
		})
		if err != nil {
			return fmt.Errorf("ControllerGetCapabilities from the CSI driver %q at %q: %w", c.caps.DriverName, c.address, err)
		}
		c.caps.CreateDeleteVolume = ctrl[csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME]
		c.caps.PublishUnpublish = ctrl[csi.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME]
		c.caps.ListVolumes = ctrl[csi.ControllerServiceCapability_RPC_LIST_VOLUMES]
		c.caps.GetCapacity = ctrl[csi.ControllerServiceCapability_RPC_GET_CAPACITY]
		c.caps.CreateDeleteSnapshot = ctrl[csi.ControllerServiceCapability_RPC_CREATE_DELETE_SNAPSHOT]
		c.caps.ListSnapshots = ctrl[csi.ControllerServiceCapability_RPC_LIST_SNAPSHOTS]
		c.caps.CloneVolume = ctrl[csi.ControllerServiceCapability_RPC_CLONE_VOLUME]
		c.caps.PublishReadonly = ctrl[csi.ControllerServiceCapability_RPC_PUBLISH_READONLY]
		c.caps.ExpandVolume = ctrl[csi.ControllerServiceCapability_RPC_EXPAND_VOLUME]
		c.caps.SingleNodeMultiWriter = ctrl[csi.ControllerServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER]
		c.caps.ModifyVolume = ctrl[csi.ControllerServiceCapability_RPC_MODIFY_VOLUME]
		c.caps.GetVolume = ctrl[csi.ControllerServiceCapability_RPC_GET_VOLUME]
	}
	logger.Info("CSI driver ready", "driver", c.caps.DriverName, "vendorVersion", c.caps.VendorVersion,
		"controllerService", c.caps.ControllerService, "createDeleteVolume", c.caps.CreateDeleteVolume,
		"topology", c.caps.VolumeAccessibility, "publishUnpublish", c.caps.PublishUnpublish)
	return nil
}

// withTimeout calls f with a context that ends after d.
func withTimeout[T any](ctx context.Context, d time.Duration, f func(context.Context) (T, error)) (T, error) {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	return f(ctx)
}

// timed calls f with a context that ends after d, and says how long the
// call took.
func timed[T any](ctx context.Context, d time.Duration, f func(context.Context) (T, error)) (T, time.Duration, error) {
	start := time.Now()
	resp, err := withTimeout(ctx, d, f)
	return resp, time.Since(start), err
}

// Capabilities returns what the driver reported at Connect.
func (c *Client) Capabilities() Capabilities { return c.caps }

// Address is the socket the client is connected to.
func (c *Client) Address() string { return c.address }

// CreateVolume sends req with the configured call timeout and returns the
// created volume. On failure the error is an *Error; pass it to [Classify]
// to learn what to do; its message never carries the values of req's
// secrets, even when the driver's does. The call is idempotent by
// req.Name: repeating it after an InProgress error continues the same
// creation.
func (c *Client) CreateVolume(ctx context.Context, req *csi.CreateVolumeRequest) (*csi.Volume, error) {
	if err := c.allow(); err != nil {
		return nil, &Error{Method: "CreateVolume", Volume: req.GetName(), Err: err}
	}
	r := newRedactor(req.GetSecrets())
	resp, took, err := timed(r.context(ctx), c.timeout, func(ctx context.Context) (*csi.CreateVolumeResponse, error) {
		return c.ctrl.CreateVolume(ctx, req)
	})
	err = r.error(err)
	klog.FromContext(ctx).V(2).Info("CreateVolume", "volumeName", req.GetName(), "duration", took, "code", Code(err))
	if err != nil {
		return nil, &Error{Method: "CreateVolume", Volume: req.GetName(), Err: err}
	}
	if resp.GetVolume() == nil || resp.GetVolume().GetVolumeId() == "" {
		// A driver bug; nothing tells us whether a volume exists, so it is
		// not final: retrying the same request may return the volume.
		return nil, &Error{Method: "CreateVolume", Volume: req.GetName(), Err: errors.New("driver returned no volume ID")}
	}
	return resp.GetVolume(), nil
}

// DeleteVolume sends req with the configured call timeout. Deleting a volume
// that does not exist succeeds (CSI requires it). On failure the error is an
// *Error, whose message never carries the values of req's secrets.
func (c *Client) DeleteVolume(ctx context.Context, req *csi.DeleteVolumeRequest) error {
	if err := c.allow(); err != nil {
		return &Error{Method: "DeleteVolume", Volume: req.GetVolumeId(), Err: err}
	}
	r := newRedactor(req.GetSecrets())
	_, took, err := timed(r.context(ctx), c.timeout, func(ctx context.Context) (*csi.DeleteVolumeResponse, error) {
		return c.ctrl.DeleteVolume(ctx, req)
	})
	err = r.error(err)
	klog.FromContext(ctx).V(2).Info("DeleteVolume", "volumeID", req.GetVolumeId(), "duration", took, "code", Code(err))
	if err != nil {
		return &Error{Method: "DeleteVolume", Volume: req.GetVolumeId(), Err: err}
	}
	return nil
}

// allow asks the gate (WithChangeGate) whether a call that changes the
// backend may be sent; a refusal is a codes.Aborted status naming why.
func (c *Client) allow() error {
	if c.gate == nil {
		return nil
	}
	if err := c.gate(); err != nil {
		return status.Error(codes.Aborted, "not sent: "+err.Error())
	}
	return nil
}

// GetCapacity sends req with the configured call timeout and returns the
// driver's answer: the capacity available for volumes with req's parameters
// in req's topology segment. On failure the error is an *Error.
func (c *Client) GetCapacity(ctx context.Context, req *csi.GetCapacityRequest) (*csi.GetCapacityResponse, error) {
	resp, took, err := timed(ctx, c.timeout, func(ctx context.Context) (*csi.GetCapacityResponse, error) {
		return c.ctrl.GetCapacity(ctx, req)
	})
	klog.FromContext(ctx).V(4).Info("GetCapacity", "segment", req.GetAccessibleTopology().GetSegments(), "duration", took, "code", Code(err))
	if err != nil {
		return nil, &Error{Method: "GetCapacity", Err: err}
	}
	return resp, nil
}

// NodeGetInfo asks the driver's node service for its node ID and the
// topology of the node it runs on, for distributed provisioning, where the
// sidecar runs next to the driver on every node. On failure the error is an
// *Error.
func (c *Client) NodeGetInfo(ctx context.Context) (*csi.NodeGetInfoResponse, error) {
	resp, took, err := timed(ctx, c.timeout, func(ctx context.Context) (*csi.NodeGetInfoResponse, error) {
		return csi.NewNodeClient(c.conn).NodeGetInfo(ctx, &csi.NodeGetInfoRequest{})
	})
	klog.FromContext(ctx).V(2).Info("NodeGetInfo", "nodeID", resp.GetNodeId(), "topology", resp.GetAccessibleTopology().GetSegments(), "duration", took, "code", Code(err))
	if err != nil {
		return nil, &Error{Method: "NodeGetInfo", Err: err}
	}
	return resp, nil
}

// Probe asks the driver whether it is ready, for readiness checks.
func (c *Client) Probe(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	ready, err := rpc.Probe(ctx, c.conn)
	if err != nil {
		return &Error{Method: "Probe", Err: err}
	}
	if !ready {
		return &Error{Method: "Probe", Err: errors.New("driver reports not ready")}
	}
	return nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }
