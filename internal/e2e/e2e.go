// Package e2e runs the real binaries of this repository, the example
// hostpath driver and the csi-provisioner sidecar, as separate processes
// next to a local control plane (internal/controlplane). The demo, the
// end-to-end tests, the benchmark and the chaos suite share it.
package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kube-storage/csi-provisioner/internal/controlplane"
)

// Binaries are the paths of the two programs under test.
type Binaries struct {
	Sidecar string
	Driver  string
}

var (
	buildOnce sync.Once
	built     Binaries
	buildErr  error
)

// BinDirEnv names the environment variable with a directory holding
// csi-provisioner and hostpath-driver already built (`make test` sets it to
// bin/ after `make build`).
const BinDirEnv = "CSI_PROVISIONER_BIN_DIR"

// BuildTags are the build tags of the shipped binaries: the Makefile's
// GOTAGS (see the reason there).
const BuildTags = "grpcnotrace"

// Build returns the binaries to run: those in dir, else those in $BinDirEnv,
// else it compiles cmd/csi-provisioner and examples/hostpath-driver once per
// process into one directory under the system's temporary directory, shared
// by all test processes (each binary is written under a temporary name and
// renamed into place, so a process still running the old one is unharmed).
func Build(ctx context.Context, dir string) (Binaries, error) {
	if dir == "" {
		dir = os.Getenv(BinDirEnv)
	}
	if dir != "" {
		b := Binaries{Sidecar: filepath.Join(dir, "csi-provisioner"), Driver: filepath.Join(dir, "hostpath-driver")}
		for _, p := range []string{b.Sidecar, b.Driver} {
			if _, err := os.Stat(p); err != nil {
				return Binaries{}, fmt.Errorf("binary missing (run `make build`): %w", err)
			}
		}
		return b, nil
	}
	buildOnce.Do(func() { built, buildErr = build(ctx) })
	return built, buildErr
}

func build(ctx context.Context) (Binaries, error) {
	root, err := controlplane.RepoRoot()
	if err != nil {
		return Binaries{}, err
	}
	out := filepath.Join(os.TempDir(), fmt.Sprintf("csi-provisioner-bin-%d", os.Getuid()))
	if err := os.MkdirAll(out, 0o700); err != nil {
		return Binaries{}, err
	}
	b := Binaries{Sidecar: filepath.Join(out, "csi-provisioner"), Driver: filepath.Join(out, "hostpath-driver")}
	for pkg, bin := range map[string]string{"./cmd/csi-provisioner": b.Sidecar, "./examples/hostpath-driver": b.Driver} {
		tmp := fmt.Sprintf("%s.%d", bin, os.Getpid())
		cmd := exec.CommandContext(ctx, "go", "build", "-tags", BuildTags, "-o", tmp, pkg)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			_ = os.Remove(tmp)
			return Binaries{}, fmt.Errorf("go build %s: %w\n%s", pkg, err, out)
		}
		if err := os.Rename(tmp, bin); err != nil {
			return Binaries{}, err
		}
	}
	return b, nil
}

// Driver is a running hostpath driver.
type Driver struct {
	*controlplane.Process
	// Socket is the unix socket path.
	Socket string
	// Name is the CSI driver name.
	Name string
	// Root is the dir backend's state directory ("" for memory).
	Root string
	// NodeID is the node the driver serves.
	NodeID string

	bin  string
	args []string
}

// DriverConfig configures [StartDriver].
type DriverConfig struct {
	// Dir holds the socket, the state and the log.
	Dir string
	// Name is the driver name; default "hostpath.csi.kube-storage.io".
	Name string
	// Memory selects the memory backend instead of dir.
	Memory bool
	// NodeID is the node the driver reports; default "node-1".
	NodeID string
	// Topology makes the driver report topology (VOLUME_ACCESSIBILITY_
	// CONSTRAINTS). Off by default: no kubelet runs here, so no CSINode
	// lists the driver's topology keys, and a provisioner then refuses
	// immediate claims of a topology-aware driver, as upstream does. A test
	// that turns it on calls [Driver.RegisterNode] to play the kubelet.
	Topology bool
	// Args are extra flags (fault injection, secrets, capabilities).
	Args []string
}

// StartDriver starts the hostpath driver and waits until its socket accepts
// connections.
func StartDriver(ctx context.Context, bin string, cfg DriverConfig) (*Driver, error) {
	if cfg.Name == "" {
		cfg.Name = "hostpath.csi.kube-storage.io"
	}
	if cfg.NodeID == "" {
		cfg.NodeID = "node-1"
	}
	d := &Driver{Socket: filepath.Join(cfg.Dir, "csi.sock"), Name: cfg.Name, NodeID: cfg.NodeID, bin: bin}
	d.args = []string{"--endpoint=unix://" + d.Socket, "--drivername=" + cfg.Name, "--node-id=" + cfg.NodeID, "-v=3"}
	if cfg.Memory {
		d.args = append(d.args, "--backend=memory")
	} else {
		d.Root = filepath.Join(cfg.Dir, "driver-root")
		if err := os.MkdirAll(d.Root, 0o755); err != nil {
			return nil, err
		}
		d.args = append(d.args, "--backend=dir", "--root="+d.Root)
	}
	if !cfg.Topology {
		d.args = append(d.args, "--enable-topology=false")
	}
	d.args = append(d.args, cfg.Args...)
	return d, d.start(ctx, filepath.Join(cfg.Dir, "driver.log"))
}

func (d *Driver) start(ctx context.Context, logPath string) error {
	p, err := controlplane.StartProcess("hostpath-driver", d.bin, d.args, nil, logPath)
	if err != nil {
		return err
	}
	d.Process = p
	return waitSocket(ctx, p, d.Socket)
}

// Restart starts the driver again with the same flags after it stopped.
func (d *Driver) Restart(ctx context.Context) error {
	return d.start(ctx, d.LogPath)
}

// ListVolumes returns every volume the driver has, following pagination.
func (d *Driver) ListVolumes(ctx context.Context) ([]*csi.Volume, error) {
	conn, err := dial(d.Socket)
	if err != nil {
		return nil, err
	}
	defer func() { _ = conn.Close() }()
	ctrl := csi.NewControllerClient(conn)
	var vols []*csi.Volume
	token := ""
	for {
		resp, err := ctrl.ListVolumes(ctx, &csi.ListVolumesRequest{StartingToken: token})
		if err != nil {
			return nil, fmt.Errorf("ListVolumes on %s: %w", d.Socket, err)
		}
		for _, e := range resp.GetEntries() {
			vols = append(vols, e.GetVolume())
		}
		if token = resp.GetNextToken(); token == "" {
			return vols, nil
		}
	}
}

// VolumeIDs returns the sorted IDs of the driver's volumes.
func (d *Driver) VolumeIDs(ctx context.Context) ([]string, error) {
	vols, err := d.ListVolumes(ctx)
	if err != nil {
		return nil, err
	}
	ids := make([]string, 0, len(vols))
	for _, v := range vols {
		ids = append(ids, v.GetVolumeId())
	}
	slices.Sort(ids)
	return ids, nil
}

// CreateVolume creates a 1Gi mount volume named name in the driver, as an
// administrator would before writing a static PV for it, and returns its ID.
func (d *Driver) CreateVolume(ctx context.Context, name string) (string, error) {
	conn, err := dial(d.Socket)
	if err != nil {
		return "", err
	}
	defer func() { _ = conn.Close() }()
	resp, err := csi.NewControllerClient(conn).CreateVolume(ctx, &csi.CreateVolumeRequest{
		Name:          name,
		CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 30},
		VolumeCapabilities: []*csi.VolumeCapability{{
			AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		}},
	})
	if err != nil {
		return "", fmt.Errorf("CreateVolume %s on %s: %w", name, d.Socket, err)
	}
	return resp.GetVolume().GetVolumeId(), nil
}

// DeleteVolume deletes the driver's volume with ID id, as an administrator
// would in the storage backend.
func (d *Driver) DeleteVolume(ctx context.Context, id string) error {
	conn, err := dial(d.Socket)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	if _, err := csi.NewControllerClient(conn).DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
		return fmt.Errorf("DeleteVolume %s on %s: %w", id, d.Socket, err)
	}
	return nil
}

func dial(socket string) (*grpc.ClientConn, error) {
	return grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
}

// waitSocket waits until a CSI Probe over socket succeeds or p exits.
func waitSocket(ctx context.Context, p *controlplane.Process, socket string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		if _, err := os.Stat(socket); err == nil {
			conn, err := dial(socket)
			if err == nil {
				pctx, pcancel := context.WithTimeout(ctx, time.Second)
				_, err = csi.NewIdentityClient(conn).Probe(pctx, &csi.ProbeRequest{})
				pcancel()
				_ = conn.Close()
				if err == nil {
					return nil
				}
			}
		}
		select {
		case <-p.Exited():
			return fmt.Errorf("%s exited: %w; log:\n%s", p.Name, p.ExitErr(), controlplane.TailFile(p.LogPath, 20))
		case <-ctx.Done():
			return fmt.Errorf("%s socket %s not ready: %w", p.Name, socket, ctx.Err())
		case <-tick.C:
		}
	}
}

// Sidecar is a running csi-provisioner.
type Sidecar struct {
	*controlplane.Process
	bin  string
	args []string
	env  []string
}

// SidecarConfig configures [StartSidecar].
type SidecarConfig struct {
	// Kubeconfig is the API server's kubeconfig.
	Kubeconfig string
	// Socket is the driver's socket.
	Socket string
	// LogPath receives the sidecar's output.
	LogPath string
	// Args are extra flags.
	Args []string
	// Env are extra NAME=value environment variables (for example
	// NAMESPACE and POD_NAME for --enable-capacity).
	Env []string
}

// StartSidecar starts csi-provisioner. It does not wait for it to be ready;
// see [Sidecar.WaitReady].
func StartSidecar(bin string, cfg SidecarConfig) (*Sidecar, error) {
	s := &Sidecar{bin: bin, env: append(sidecarEnv(), cfg.Env...)}
	s.args = append([]string{"--kubeconfig=" + cfg.Kubeconfig, "--csi-address=" + cfg.Socket}, cfg.Args...)
	p, err := controlplane.StartProcess("csi-provisioner", bin, s.args, s.env, cfg.LogPath)
	if err != nil {
		return nil, err
	}
	s.Process = p
	return s, nil
}

// MutationDetectorEnv is client-go's switch for its cache mutation
// detector: a process that has it on panics, printing "ALTERED!", when an
// object in its informer cache changes. `make test` turns it on; the
// sidecars started here inherit it.
const MutationDetectorEnv = "KUBE_CACHE_MUTATION_DETECTOR"

func sidecarEnv() []string {
	env := []string{"PATH=" + os.Getenv("PATH")}
	if v, ok := os.LookupEnv(MutationDetectorEnv); ok {
		env = append(env, MutationDetectorEnv+"="+v)
	}
	return env
}

// Restart starts the sidecar again with the same flags after it stopped,
// and with extra after them (a later flag overrides an earlier one), as a
// rolling update that changes flags would.
func (s *Sidecar) Restart(extra ...string) error {
	s.args = append(s.args, extra...)
	p, err := controlplane.StartProcess("csi-provisioner", s.bin, s.args, s.env, s.LogPath)
	if err != nil {
		return err
	}
	s.Process = p
	return nil
}

// WaitLog waits until the sidecar's log contains substr, which shows how far
// it got (for example "Started provisioner controller").
func (s *Sidecar) WaitLog(ctx context.Context, substr string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		b, err := os.ReadFile(s.LogPath)
		if err == nil && strings.Contains(string(b), substr) {
			return nil
		}
		select {
		case <-s.Exited():
			// It may have logged substr just before it exited.
			if b, err := os.ReadFile(s.LogPath); err == nil && strings.Contains(string(b), substr) {
				return nil
			}
			exit := s.ExitErr()
			if exit == nil {
				exit = errors.New("exit status 0")
			}
			return fmt.Errorf("csi-provisioner exited (%w) before logging %q; log:\n%s", exit, substr, controlplane.TailFile(s.LogPath, 30))
		case <-ctx.Done():
			return fmt.Errorf("csi-provisioner did not log %q: %w; log:\n%s", substr, ctx.Err(), controlplane.TailFile(s.LogPath, 30))
		case <-tick.C:
		}
	}
}
