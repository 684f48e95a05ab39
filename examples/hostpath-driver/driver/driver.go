package driver

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/kubernetes-csi/csi-lib-utils/protosanitizer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"github.com/kube-storage/csi-provisioner/examples/hostpath-driver/backend"
	"github.com/kube-storage/csi-provisioner/examples/hostpath-driver/state"
)

// Driver implements the CSI Identity, Controller and Node services.
// Its methods may be called concurrently; see the package documentation
// for how they are serialised.
type Driver struct {
	csi.UnimplementedIdentityServer
	csi.UnimplementedControllerServer
	csi.UnimplementedNodeServer

	cfg     Config
	backend backend.Backend
	faults  *injector

	// stop is closed when the driver stops serving; it ends injected
	// hangs and latencies early.
	stop     chan struct{}
	stopOnce sync.Once

	// mu guards everything below, and every call into backend except
	// Check (Probe answers without waiting for a long copy).
	mu sync.Mutex
	st *state.State
	// volumesByName and snapshotsByName index st by name, the
	// idempotency key of CreateVolume and CreateSnapshot.
	volumesByName   map[string]*state.Volume
	snapshotsByName map[string]*state.Snapshot
	// usedBytes is the sum of the volumes' capacities, kept up to date by
	// addVolumeLocked and removeVolumeLocked so that a CreateVolume does
	// not walk every volume.
	usedBytes int64
	// unsynced is set while st is on disk but not known to be durable
	// (see commitLocked); lock saves it again before any call answers.
	unsynced bool
}

var (
	_ csi.IdentityServer   = (*Driver)(nil)
	_ csi.ControllerServer = (*Driver)(nil)
	_ csi.NodeServer       = (*Driver)(nil)
)

// Option changes how New builds a Driver.
type Option func(*Driver)

// WithBackend makes the driver use b instead of the backend that
// Config.Backend names. Tests use it to inject failing backends.
func WithBackend(b backend.Backend) Option {
	return func(d *Driver) { d.backend = b }
}

// New validates cfg, opens its backend and loads the saved state. The
// logger comes from ctx. Close the Driver when done.
func New(ctx context.Context, cfg Config, opts ...Option) (*Driver, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Faults.FailCode == 0 {
		cfg.Faults.FailCode = DefaultConfig().Faults.FailCode
	}
	if cfg.ShutdownTimeout == 0 {
		cfg.ShutdownTimeout = DefaultShutdownTimeout
	}
	d := &Driver{cfg: cfg, stop: make(chan struct{})}
	for _, opt := range opts {
		opt(d)
	}
	if d.backend == nil {
		switch cfg.Backend {
		case BackendMemory:
			d.backend = backend.NewMemory()
		case BackendDir:
			root, err := filepath.Abs(cfg.Root)
			if err != nil {
				return nil, fmt.Errorf("resolve root %q: %w", cfg.Root, err)
			}
			b, err := backend.NewDir(root)
			if err != nil {
				return nil, err
			}
			d.backend = b
		}
	}
	st, err := d.backend.Load(ctx)
	if err != nil {
		return nil, fmt.Errorf("load state: %w", err)
	}
	d.st = st
	d.volumesByName = make(map[string]*state.Volume, len(st.Volumes))
	for _, v := range st.Volumes {
		d.volumesByName[v.Name] = v
		d.usedBytes += v.CapacityBytes
	}
	d.snapshotsByName = make(map[string]*state.Snapshot, len(st.Snapshots))
	for _, s := range st.Snapshots {
		d.snapshotsByName[s.Name] = s
	}
	var seed uint64
	d.faults, seed = newInjector(cfg.Faults)
	logger := klog.FromContext(ctx)
	if cfg.Faults.Enabled() {
		logger.Info("Fault injection enabled", "faults", cfg.Faults, "seed", seed)
	}
	logger.V(2).Info("Driver ready", "name", cfg.DriverName, "nodeID", cfg.NodeID, "backend", cfg.Backend,
		"volumes", len(st.Volumes), "snapshots", len(st.Snapshots))
	return d, nil
}

// Close ends injected hangs and latencies. The Driver must not serve after
// Close; the backend holds no resources that need releasing. Close is
// idempotent.
func (d *Driver) Close() error {
	d.stopOnce.Do(func() { close(d.stop) })
	return nil
}

// Serve answers CSI calls on lis until ctx ends, then stops gracefully:
// injected hangs and latencies end, calls in flight get up to
// Config.ShutdownTimeout to finish, and lis is closed. It returns nil
// after a shutdown caused by ctx, or the error that made the gRPC server
// fail. A Driver serves once.
func (d *Driver) Serve(ctx context.Context, lis net.Listener) error {
	logger := klog.FromContext(ctx)
	srv := grpc.NewServer(grpc.UnaryInterceptor(logCalls(logger)))
	csi.RegisterIdentityServer(srv, d)
	csi.RegisterControllerServer(srv, d)
	csi.RegisterNodeServer(srv, d)

	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	select {
	case err := <-served:
		_ = d.Close()
		return fmt.Errorf("serve CSI on %s: %w", lis.Addr(), err)
	case <-ctx.Done():
	}
	logger.V(2).Info("Stopping", "address", lis.Addr().String())
	_ = d.Close()
	stopped := make(chan struct{})
	go func() {
		srv.GracefulStop()
		close(stopped)
	}()
	timer := time.NewTimer(d.cfg.ShutdownTimeout)
	defer timer.Stop()
	select {
	case <-stopped:
	case <-timer.C:
		logger.Info("Calls still running after the shutdown timeout, cancelling them", "timeout", d.cfg.ShutdownTimeout)
		srv.Stop()
		<-stopped
	}
	if err := <-served; err != nil {
		return fmt.Errorf("serve CSI on %s: %w", lis.Addr(), err)
	}
	return nil
}

// Run builds a Driver from cfg, listens on cfg.Endpoint and serves until
// ctx ends (the binary cancels ctx on SIGTERM and SIGINT). The socket is
// removed on the way out.
func Run(ctx context.Context, cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	path, err := ParseEndpoint(cfg.Endpoint)
	if err != nil {
		return err
	}
	d, err := New(ctx, cfg)
	if err != nil {
		return err
	}
	defer d.Close()
	lis, err := Listen(path)
	if err != nil {
		return err
	}
	defer func() {
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			klog.FromContext(ctx).Error(err, "Removing the socket")
		}
	}()
	klog.FromContext(ctx).Info("Serving CSI", "endpoint", path, "driver", cfg.DriverName, "version", cfg.VendorVersion, "backend", cfg.Backend)
	return d.Serve(ctx, lis)
}

// Listen listens on the unix socket path. A socket file left behind by a
// process that died (SIGKILL leaves it) is removed first; a socket that
// still answers is refused, so two drivers never share one endpoint.
func Listen(path string) (net.Listener, error) {
	fi, err := os.Lstat(path)
	switch {
	case err == nil:
		if fi.Mode()&fs.ModeSocket == 0 {
			return nil, fmt.Errorf("listen on %s: the path exists and is not a socket", path)
		}
		if conn, err := net.DialTimeout("unix", path, time.Second); err == nil {
			_ = conn.Close()
			return nil, fmt.Errorf("listen on %s: another process is serving this socket", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("remove stale socket %s: %w", path, err)
		}
	case !errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	lis, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	return lis, nil
}

// logCalls logs every call at V(3) with its method, duration and code,
// and the request and response at V(5) with secrets stripped. It puts
// logger into the handler's context.
func logCalls(logger klog.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if !logger.V(3).Enabled() {
			return handler(klog.NewContext(ctx, logger), req)
		}
		l := logger.WithValues("method", info.FullMethod)
		l.V(5).Info("gRPC request", "request", protosanitizer.StripSecrets(req))
		start := time.Now()
		resp, err := handler(klog.NewContext(ctx, l), req)
		elapsed := time.Since(start)
		if err != nil {
			l.V(3).Info("gRPC call failed", "duration", elapsed, "code", status.Code(err), "err", err)
		} else {
			l.V(3).Info("gRPC call", "duration", elapsed, "code", status.Code(err))
			l.V(5).Info("gRPC response", "response", protosanitizer.StripSecrets(resp))
		}
		return resp, err
	}
}

// newID returns a random ID with the given prefix, e.g. vol-0123456789abcdef.
func newID(prefix string) string {
	b := make([]byte, 8)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	return prefix + hex.EncodeToString(b)
}
