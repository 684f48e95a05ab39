package badinput

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
)

// processRow is a sidecar command line that must fail at start-up, and how.
type processRow struct {
	name string
	args []string
	// kubeconfig adds a valid --kubeconfig, so the failure is the one the
	// row is about.
	kubeconfig bool
	// socket returns a --csi-address to add (nil: none).
	socket func(t *testing.T) string
	// code is the exit code; -1 means any non-zero code.
	code int
	// line holds fragments of the one line on stderr that is not a log
	// line; it must start with "csi-provisioner: ".
	line []string
	// onlyLine: stderr must be that one line, with no log lines at all
	// (flag errors happen before logging starts), and stdout empty.
	onlyLine bool
	// env are NAME=value pairs added to the test's environment.
	env []string
	// jsonLogs: the log lines are JSON objects (--logging-format=json),
	// and there must be some, none in klog's text format.
	jsonLogs bool
}

func processRows() []processRow {
	return []processRow{
		{name: "uuid-length-out-of-range", args: []string{"--volume-name-uuid-length=40"}, code: 2, onlyLine: true, line: []string{"--volume-name-uuid-length", "40"}},
		{name: "timeout-not-a-duration", args: []string{"--timeout=abc"}, code: 2, onlyLine: true, line: []string{"-timeout", "abc"}},
		{name: "unknown-flag", args: []string{"--no-such-flag"}, code: 2, onlyLine: true, line: []string{"-no-such-flag"}},
		{name: "positional-argument", args: []string{"extra"}, code: 2, onlyLine: true, line: []string{`"extra"`}},
		{name: "worker-threads-zero", args: []string{"--worker-threads=0"}, code: 2, onlyLine: true, line: []string{"--worker-threads"}},
		{
			name: "lease-shorter-than-renew-deadline",
			args: []string{"--leader-election", "--leader-election-lease-duration=2s", "--leader-election-renew-deadline=3s"},
			code: 2, onlyLine: true, line: []string{"--leader-election-lease-duration"},
		},
		{
			name: "kubeconfig-missing",
			args: []string{"--kubeconfig=/nonexistent/kubeconfig", "--csi-address=/nonexistent/csi.sock"},
			code: 1, line: []string{"/nonexistent/kubeconfig"},
		},
		{
			// As upstream, $KUBECONFIG wins over --kubeconfig; the error says so.
			name: "kubeconfig-from-environment", env: []string{"KUBECONFIG=/nonexistent/env"},
			args: []string{"--kubeconfig=/nonexistent/flag", "--csi-address=/nonexistent/csi.sock"},
			code: 1, line: []string{`$KUBECONFIG "/nonexistent/env", which wins over --kubeconfig "/nonexistent/flag"`, "stat /nonexistent/env"},
		},
		{
			name: "socket-missing", kubeconfig: true,
			args: []string{"--csi-address=/nonexistent/csi.sock", "--csi-connect-timeout=2s"},
			code: 1, line: []string{"/nonexistent/csi.sock", "the socket does not exist"},
		},
		{
			// Upstream registers the JSON log format; a drop-in must accept it.
			name: "socket-missing-json-logs", kubeconfig: true, jsonLogs: true,
			args: []string{"--logging-format=json", "--csi-address=/nonexistent/csi.sock", "--csi-connect-timeout=2s"},
			code: 1, line: []string{"/nonexistent/csi.sock", "the socket does not exist"},
		},
		{
			name: "tcp-address", kubeconfig: true,
			args: []string{"--csi-address=tcp://127.0.0.1:1", "--csi-connect-timeout=2s"},
			code: 2, line: []string{"--csi-address", "tcp://127.0.0.1:1", "unix domain socket"},
		},
		{
			name: "driver-without-controller-service", kubeconfig: true, socket: identityOnlyDriver,
			code: 1, line: []string{"identity-only.csi.kube-storage.io", "CONTROLLER_SERVICE"},
		},
		{
			name: "capacity-without-namespace", args: []string{"--enable-capacity"}, env: []string{"NAMESPACE=", "POD_NAME=csi-0"},
			code: 2, onlyLine: true, line: []string{"--enable-capacity", "NAMESPACE"},
		},
		{
			name: "capacity-owner-without-pod-name", args: []string{"--enable-capacity", "--capacity-ownerref-level=2"}, env: []string{"NAMESPACE=default", "POD_NAME="},
			code: 2, onlyLine: true, line: []string{"--capacity-ownerref-level=2", "POD_NAME"},
		},
		{
			name: "node-deployment-without-node-name", args: []string{"--node-deployment"}, env: []string{"NODE_NAME="},
			code: 2, onlyLine: true, line: []string{"--node-deployment", "NODE_NAME"},
		},
		{
			name: "node-deployment-driver-without-node-service", kubeconfig: true, socket: noCapacityDriver,
			args: []string{"--node-deployment"}, env: []string{"NODE_NAME=worker-1"},
			code: 1, line: []string{"--node-deployment", "no-capacity.csi.kube-storage.io", "NodeGetInfo"},
		},
		{
			name: "capacity-driver-without-get-capacity", kubeconfig: true, socket: noCapacityDriver,
			args: []string{"--enable-capacity", "--capacity-ownerref-level=-1"}, env: []string{"NAMESPACE=default"},
			code: 1, line: []string{"--enable-capacity", "no-capacity.csi.kube-storage.io", "GET_CAPACITY"},
		},
		{
			// This control plane has no Gateway API CRDs.
			name: "cross-namespace-data-source-without-reference-grants", kubeconfig: true, socket: noCapacityDriver,
			args: []string{"--feature-gates=CrossNamespaceVolumeDataSource=true"},
			code: 1, line: []string{"--feature-gates=CrossNamespaceVolumeDataSource=true", "referencegrants.gateway.networking.k8s.io", "install the Gateway API CRDs"},
		},
	}
}

// runProcessRow runs the sidecar with the row's flags (at most a minute)
// and checks its exit code and stderr.
func runProcessRow(t *testing.T, sidecar, kubeconfig string, row processRow) {
	args := row.args
	if row.kubeconfig {
		args = append([]string{"--kubeconfig=" + kubeconfig}, args...)
	}
	if row.socket != nil {
		args = append(args, "--csi-address="+row.socket(t))
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, sidecar, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Env = append(os.Environ(), row.env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	var exitErr *exec.ExitError
	switch {
	case errors.As(err, &exitErr):
		code = exitErr.ExitCode()
	case err != nil:
		t.Fatalf("run %v: %v", args, err)
	}
	if ctx.Err() != nil {
		t.Fatalf("csi-provisioner %v did not exit within a minute; stderr:\n%s", args, stderr.String())
	}
	if (row.code == -1 && code == 0) || (row.code != -1 && code != row.code) {
		t.Errorf("exit code %d, want %d", code, row.code)
	}
	lines := strings.Split(strings.TrimRight(stderr.String(), "\n"), "\n")
	var plain, logs []string
	for _, l := range lines {
		switch {
		case l == "":
		case row.jsonLogs && isJSONLogLine(l), !row.jsonLogs && klogLine.MatchString(l):
			logs = append(logs, l)
		default:
			plain = append(plain, l)
		}
	}
	if row.jsonLogs && !slices.ContainsFunc(logs, func(l string) bool { return strings.Contains(l, `"msg":"Starting csi-provisioner"`) }) {
		t.Errorf("no JSON log line with msg \"Starting csi-provisioner\"; stderr:\n%s", stderr.String())
	}
	switch {
	case len(plain) != 1:
		t.Errorf("stderr has %d lines that are not log lines, want 1:\n%s", len(plain), stderr.String())
	case !strings.HasPrefix(plain[0], "csi-provisioner: ") || !containsAll(plain[0], row.line):
		t.Errorf("stderr line %q, want it to start with \"csi-provisioner: \" and contain %q", plain[0], row.line)
	}
	if row.onlyLine && (len(lines) != 1 || stdout.Len() > 0) {
		t.Errorf("want exactly one line on stderr and nothing on stdout; stderr:\n%s\nstdout:\n%s", stderr.String(), stdout.String())
	}
	t.Logf("exit %d; stderr line: %q", code, plain)
}

// isJSONLogLine reports whether l is a log line of --logging-format=json:
// a JSON object with a message.
func isJSONLogLine(l string) bool {
	var entry struct {
		Msg *string `json:"msg"`
	}
	return json.Unmarshal([]byte(l), &entry) == nil && entry.Msg != nil
}

// identityOnly is a CSI driver with an Identity service only: no
// CONTROLLER_SERVICE, as a node-only driver.
type identityOnly struct {
	csi.UnimplementedIdentityServer
}

func (identityOnly) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: "identity-only.csi.kube-storage.io", VendorVersion: "test"}, nil
}

func (identityOnly) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	return &csi.GetPluginCapabilitiesResponse{}, nil
}

func (identityOnly) Probe(context.Context, *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	return &csi.ProbeResponse{}, nil
}

var _ csi.IdentityServer = identityOnly{}

// identityOnlyDriver serves identityOnly on a unix socket for the test and
// returns the socket's path.
func identityOnlyDriver(t *testing.T) string {
	return serveDriver(t, func(srv *grpc.Server) { csi.RegisterIdentityServer(srv, identityOnly{}) })
}

// noCapacity is a CSI driver that creates and deletes volumes but has no
// GET_CAPACITY and no node service.
type noCapacity struct {
	csi.UnimplementedIdentityServer
	csi.UnimplementedControllerServer
}

func (noCapacity) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: "no-capacity.csi.kube-storage.io", VendorVersion: "test"}, nil
}

func (noCapacity) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	return &csi.GetPluginCapabilitiesResponse{Capabilities: []*csi.PluginCapability{{Type: &csi.PluginCapability_Service_{
		Service: &csi.PluginCapability_Service{Type: csi.PluginCapability_Service_CONTROLLER_SERVICE}}}}}, nil
}

func (noCapacity) Probe(context.Context, *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	return &csi.ProbeResponse{}, nil
}

func (noCapacity) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	return &csi.ControllerGetCapabilitiesResponse{Capabilities: []*csi.ControllerServiceCapability{{Type: &csi.ControllerServiceCapability_Rpc{
		Rpc: &csi.ControllerServiceCapability_RPC{Type: csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME}}}}}, nil
}

// noCapacityDriver serves noCapacity on a unix socket for the test and
// returns the socket's path.
func noCapacityDriver(t *testing.T) string {
	return serveDriver(t, func(srv *grpc.Server) {
		csi.RegisterIdentityServer(srv, noCapacity{})
		csi.RegisterControllerServer(srv, noCapacity{})
	})
}

// serveDriver serves what register registers on a unix socket for the test
// and returns the socket's path.
func serveDriver(t *testing.T, register func(*grpc.Server)) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "csi.sock")
	lis, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	register(srv)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return path
}
