package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/kube-storage/csi-provisioner/examples/hostpath-driver/driver"
)

const testVersion = "v0.0.0-test"

func TestParseFlags(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		check   func(t *testing.T, c driver.Config)
		wantErr bool
	}{
		{name: "defaults", args: []string{"--node-id=n"}, check: func(t *testing.T, c driver.Config) {
			want := driver.DefaultConfig()
			want.NodeID, want.VendorVersion = "n", version
			want.RequireCreateSecrets, want.RequireDeleteSecrets = map[string]string{}, map[string]string{}
			if fmt.Sprint(c) != fmt.Sprint(want) {
				t.Errorf("config\n %+v\nwant\n %+v", c, want)
			}
		}},
		{name: "quantities", args: []string{"--capacity=100Gi", "--max-volume-size=1500M"}, check: func(t *testing.T, c driver.Config) {
			if c.CapacityBytes != 100<<30 || c.MaxVolumeSize != 1500*1000*1000 {
				t.Errorf("capacity %d, max %d", c.CapacityBytes, c.MaxVolumeSize)
			}
		}},
		{name: "repeated secrets", args: []string{"--require-create-secret=a=1", "--require-create-secret=b=x=y", "--require-delete-secret=c="}, check: func(t *testing.T, c driver.Config) {
			if !maps.Equal(c.RequireCreateSecrets, map[string]string{"a": "1", "b": "x=y"}) || !maps.Equal(c.RequireDeleteSecrets, map[string]string{"c": ""}) {
				t.Errorf("secrets %v, %v", c.RequireCreateSecrets, c.RequireDeleteSecrets)
			}
		}},
		{name: "faults", args: []string{
			"--create-latency=2s", "--delete-latency=1s", "--fail-create-rate=0.25", "--fail-delete-rate=0.5",
			"--fail-code=RESOURCE_EXHAUSTED", "--hang-create-rate=0.1", "--hang-delete-rate=0.2", "--fault-seed=9", "--echo-secrets",
		}, check: func(t *testing.T, c driver.Config) {
			want := driver.Faults{
				CreateLatency: 2 * time.Second, DeleteLatency: time.Second, FailCreateRate: 0.25, FailDeleteRate: 0.5,
				FailCode: codes.ResourceExhausted, HangCreateRate: 0.1, HangDeleteRate: 0.2, Seed: 9, EchoSecrets: true,
			}
			if c.Faults != want {
				t.Errorf("faults %+v, want %+v", c.Faults, want)
			}
		}},
		{name: "switches", args: []string{"--enable-topology=false", "--enable-attach", "--single-node-multi-writer", "--backend=memory", "--drivername=x.y"}, check: func(t *testing.T, c driver.Config) {
			if c.EnableTopology || !c.EnableAttach || !c.SingleNodeMultiWriter || c.Backend != "memory" || c.DriverName != "x.y" {
				t.Errorf("config %+v", c)
			}
		}},
		{name: "bad quantity", args: []string{"--capacity=lots"}, wantErr: true},
		{name: "fractional bytes", args: []string{"--capacity=0.5"}, wantErr: true},
		{name: "bad secret", args: []string{"--require-create-secret=novalue"}, wantErr: true},
		{name: "bad code", args: []string{"--fail-code=Sometimes"}, wantErr: true},
		{name: "unknown flag", args: []string{"--nope"}, wantErr: true},
		{name: "positional argument", args: []string{"extra"}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stderr bytes.Buffer
			c, _, err := parseFlags(tt.args, &stderr)
			if (err != nil) != tt.wantErr {
				t.Fatalf("parseFlags: %v (stderr %q), want error %t", err, stderr.String(), tt.wantErr)
			}
			if err == nil {
				tt.check(t, c)
			} else if stderr.Len() == 0 {
				t.Error("the error was not printed")
			}
		})
	}
}

func TestRunExitCodes(t *testing.T) {
	tests := []struct {
		name       string
		args       []string
		wantCode   int
		wantStdout string
		wantStderr string
	}{
		{name: "tcp endpoint", args: []string{"--endpoint=tcp://127.0.0.1:9000", "--node-id=n", "--backend=memory"}, wantCode: 2, wantStderr: "only unix socket endpoints are supported"},
		{name: "no node id", args: []string{"--backend=memory"}, wantCode: 2, wantStderr: "node ID is required"},
		{name: "dir without root", args: []string{"--node-id=n"}, wantCode: 2, wantStderr: "--root"},
		{name: "bad flag", args: []string{"--capacity=x"}, wantCode: 2, wantStderr: "invalid value"},
		{name: "version", args: []string{"--version"}, wantCode: 0, wantStdout: version + "\n"},
		{name: "help", args: []string{"--help"}, wantCode: 0, wantStderr: "-require-create-secret"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if code := run(tt.args, &stdout, &stderr); code != tt.wantCode {
				t.Errorf("exit code %d, want %d (stderr %q)", code, tt.wantCode, stderr.String())
			}
			if tt.wantStdout != "" && stdout.String() != tt.wantStdout {
				t.Errorf("stdout %q, want %q", stdout.String(), tt.wantStdout)
			}
			if !strings.Contains(stderr.String(), tt.wantStderr) {
				t.Errorf("stderr %q does not contain %q", stderr.String(), tt.wantStderr)
			}
		})
	}
}

// TestBinary builds the real binary once and runs it as a process.
func TestBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go tool to build the binary with")
	}
	bin := filepath.Join(t.TempDir(), "hostpath-driver")
	build := exec.CommandContext(t.Context(), goTool, "build", "-ldflags", "-X main.version="+testVersion, "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}

	t.Run("version is stamped", func(t *testing.T) {
		out, err := exec.CommandContext(t.Context(), bin, "--version").Output()
		if err != nil || string(out) != testVersion+"\n" {
			t.Errorf("--version: %q, %v; want %q", out, err, testVersion)
		}
	})

	t.Run("tcp endpoint exits 2 with one line", func(t *testing.T) {
		var stderr bytes.Buffer
		cmd := exec.CommandContext(t.Context(), bin, "--endpoint=tcp://127.0.0.1:9000", "--node-id=n", "--backend=memory")
		cmd.Stderr = &stderr
		err := cmd.Run()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 2 {
			t.Fatalf("exit: %v, want exit code 2", err)
		}
		if lines := strings.Split(strings.TrimSpace(stderr.String()), "\n"); len(lines) != 1 || !strings.Contains(lines[0], "unix") {
			t.Errorf("stderr %q, want one line about unix sockets", stderr.String())
		}
	})

	t.Run("restart after SIGKILL keeps 50 volumes", func(t *testing.T) {
		dir := t.TempDir()
		sock, root := filepath.Join(dir, "csi.sock"), filepath.Join(dir, "root")
		args := []string{"--endpoint=unix://" + sock, "--node-id=node-1", "--backend=dir", "--root=" + root,
			"--require-create-secret=password=hunter2-create", "-v=5"}

		first := startDriver(t, bin, sock, args...)
		ctl := csi.NewControllerClient(first.conn)
		created := createVolumes(t, ctl, 50, map[string]string{"password": "hunter2-create"})
		first.kill(t)

		second := startDriver(t, bin, sock, args...)
		listed := listVolumes(t, csi.NewControllerClient(second.conn), 8)
		if !maps.Equal(listed, created) {
			t.Errorf("after SIGKILL and restart ListVolumes returned %d volumes, want the %d created:\n got %v\nwant %v",
				len(listed), len(created), listed, created)
		}
		second.stop(t, syscall.SIGTERM)
		if logs := first.stderr.String() + second.stderr.String(); strings.Contains(logs, "hunter2") || !strings.Contains(logs, "***stripped***") {
			t.Errorf("the -v=5 log shows a secret value or does not strip secrets:\n%s", logs)
		}
	})

	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(sig.String()+" stops gracefully during a hung call", func(t *testing.T) {
			sock := filepath.Join(t.TempDir(), "csi.sock")
			p := startDriver(t, bin, sock, "--endpoint="+sock, "--node-id=node-1", "--backend=memory", "--hang-create-rate=1")
			ctl := csi.NewControllerClient(p.conn)
			answered := make(chan error, 1)
			go func() {
				_, err := ctl.CreateVolume(context.WithoutCancel(t.Context()), &csi.CreateVolumeRequest{
					Name: "pvc-1", VolumeCapabilities: []*csi.VolumeCapability{mountCapability()},
				})
				answered <- err
			}()
			// The volume appears while CreateVolume hangs.
			waitFor(t, func() bool { return len(listVolumes(t, ctl, 0)) == 1 })

			start := time.Now()
			p.stop(t, sig)
			if elapsed := time.Since(start); elapsed > driver.DefaultShutdownTimeout/2 {
				t.Errorf("shutdown took %v: the hung call held it up", elapsed)
			}
			if code := status.Code(<-answered); code != codes.Unavailable {
				t.Errorf("the hung CreateVolume answered %s, want Unavailable", code)
			}
			if _, err := os.Stat(sock); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("socket still exists after shutdown (%v)", err)
			}
		})
	}
}

// driverProcess is a running driver binary and a connection to it.
type driverProcess struct {
	cmd    *exec.Cmd
	stderr *syncBuffer
	conn   *grpc.ClientConn
	exited chan struct{} // closed when the process has exited
	err    error         // Wait's result, valid after exited is closed
}

// startDriver starts the binary and waits until it answers Probe.
func startDriver(t *testing.T, bin, sock string, args ...string) *driverProcess {
	t.Helper()
	p := &driverProcess{cmd: exec.Command(bin, args...), stderr: &syncBuffer{}, exited: make(chan struct{})}
	p.cmd.Stderr = p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.exited
		if t.Failed() {
			t.Logf("driver log:\n%s", p.stderr.String())
		}
	})

	// Retry connecting quickly while the process creates its socket.
	fastRetry := grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: 20 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second}}
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithConnectParams(fastRetry))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	p.conn = conn
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	go func() {
		select {
		case <-p.exited: // no point waiting for a dead driver
			cancel()
		case <-ctx.Done():
		}
	}()
	resp, err := csi.NewIdentityClient(conn).Probe(ctx, &csi.ProbeRequest{}, grpc.WaitForReady(true))
	if err != nil || !resp.GetReady().GetValue() {
		t.Fatalf("driver not ready: %v, %v\n%s", resp, err, p.stderr.String())
	}
	return p
}

// kill sends SIGKILL and waits for the process to go.
func (p *driverProcess) kill(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-p.exited
	_ = p.conn.Close()
}

// stop sends sig and expects a clean exit within a minute.
func (p *driverProcess) stop(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.exited:
	case <-time.After(time.Minute):
		t.Fatalf("driver still running a minute after %s", sig)
	}
	if p.err != nil {
		t.Errorf("driver exited with %v after %s, want exit code 0\n%s", p.err, sig, p.stderr.String())
	}
}

// createVolumes creates n volumes with 4 concurrent callers, mount and
// block, of different sizes, and returns their IDs and capacities.
func createVolumes(t *testing.T, ctl csi.ControllerClient, n int, secrets map[string]string) map[string]int64 {
	t.Helper()
	var (
		mu      sync.Mutex
		created = map[string]int64{}
		wg      sync.WaitGroup
		errs    = make(chan error, n)
		next    = make(chan int)
	)
	for range 4 {
		wg.Go(func() {
			for i := range next {
				c := mountCapability()
				if i%3 == 0 {
					c.AccessType = &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}
				}
				resp, err := ctl.CreateVolume(t.Context(), &csi.CreateVolumeRequest{
					Name:               fmt.Sprintf("pvc-%03d", i),
					CapacityRange:      &csi.CapacityRange{RequiredBytes: int64(i+1) << 20},
					VolumeCapabilities: []*csi.VolumeCapability{c},
					Secrets:            secrets,
				})
				if err != nil {
					errs <- fmt.Errorf("CreateVolume pvc-%03d: %w", i, err)
					continue
				}
				mu.Lock()
				created[resp.GetVolume().GetVolumeId()] = resp.GetVolume().GetCapacityBytes()
				mu.Unlock()
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if len(created) != n {
		t.Fatalf("created %d volumes, want %d", len(created), n)
	}
	return created
}

// listVolumes lists all volumes, pageSize at a time (0: one page).
func listVolumes(t *testing.T, ctl csi.ControllerClient, pageSize int32) map[string]int64 {
	t.Helper()
	listed := map[string]int64{}
	token := ""
	for {
		resp, err := ctl.ListVolumes(t.Context(), &csi.ListVolumesRequest{MaxEntries: pageSize, StartingToken: token})
		if err != nil {
			t.Fatalf("ListVolumes: %v", err)
		}
		for _, e := range resp.GetEntries() {
			if _, dup := listed[e.GetVolume().GetVolumeId()]; dup {
				t.Errorf("volume %s listed twice", e.GetVolume().GetVolumeId())
			}
			listed[e.GetVolume().GetVolumeId()] = e.GetVolume().GetCapacityBytes()
		}
		if token = resp.GetNextToken(); token == "" {
			return listed
		}
	}
}

func mountCapability() *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
}

// waitFor polls cond until it holds, failing the test after 30 seconds.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 30s")
		}
		<-tick.C
	}
}

// syncBuffer collects a process's stderr; it is safe for concurrent use.
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
