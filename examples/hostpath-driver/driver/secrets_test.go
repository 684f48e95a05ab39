package driver

import (
	"bytes"
	"context"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"
)

func TestSecretEnforcement(t *testing.T) {
	required := func(c *Config) {
		c.RequireCreateSecrets = map[string]string{"user": "admin", "password": "create-pw"}
		c.RequireDeleteSecrets = map[string]string{"token": "delete-pw"}
	}
	tests := []struct {
		name          string
		createSecrets map[string]string
		deleteSecrets map[string]string
		wantCreate    codes.Code
		wantDelete    codes.Code
	}{
		{
			name:          "all present, plus extra",
			createSecrets: map[string]string{"user": "admin", "password": "create-pw", "extra": "x"},
			deleteSecrets: map[string]string{"token": "delete-pw"},
		},
		{name: "none", wantCreate: codes.Unauthenticated, wantDelete: codes.Unauthenticated},
		{
			name:          "one missing",
			createSecrets: map[string]string{"user": "admin"},
			deleteSecrets: map[string]string{"other": "delete-pw"},
			wantCreate:    codes.Unauthenticated, wantDelete: codes.Unauthenticated,
		},
		{
			name:          "wrong values",
			createSecrets: map[string]string{"user": "admin", "password": "guess"},
			deleteSecrets: map[string]string{"token": "guess"},
			wantCreate:    codes.Unauthenticated, wantDelete: codes.Unauthenticated,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := newTestDriver(t, required)
			req := createReq("pvc-1", gi)
			req.Secrets = tt.createSecrets
			resp, err := d.CreateVolume(t.Context(), req)
			wantCode(t, err, tt.wantCreate)
			if msg := status.Convert(err).Message(); strings.Contains(msg, "create-pw") || strings.Contains(msg, "guess") {
				t.Errorf("error message %q shows a secret value", msg)
			}
			if err != nil {
				if n := len(volumeIDs(t, d)); n != 0 {
					t.Fatalf("an unauthenticated CreateVolume left %d volumes", n)
				}
				// Delete a volume created with the right secrets.
				req.Secrets = map[string]string{"user": "admin", "password": "create-pw"}
				resp = &csi.CreateVolumeResponse{Volume: mustCreate(t, d, req)}
			}
			id := resp.GetVolume().GetVolumeId()
			if got, want := d.st.Volumes[id].SecretKeys, slices.Sorted(maps.Keys(req.Secrets)); !slices.Equal(got, want) {
				t.Errorf("recorded secret keys %v, want %v", got, want)
			}
			_, err = d.DeleteVolume(t.Context(), &csi.DeleteVolumeRequest{VolumeId: id, Secrets: tt.deleteSecrets})
			wantCode(t, err, tt.wantDelete)
			if _, exists := volumeIDs(t, d)[id]; exists != (tt.wantDelete != codes.OK) {
				t.Errorf("volume exists=%t after DeleteVolume answered %s", exists, tt.wantDelete)
			}
		})
	}
}

func TestStateRecordsSecretNamesOnly(t *testing.T) {
	root := filepath.Join(t.TempDir(), "root")
	d := newTestDriver(t, func(c *Config) { c.Backend, c.Root = BackendDir, root })
	req := createReq("pvc-1", gi)
	req.Secrets = map[string]string{"b-key": "value-of-b", "a-key": "value-of-a"}
	mustCreate(t, d, req)
	data, err := os.ReadFile(filepath.Join(root, "state.json"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(data, []byte(`"a-key",`)) || !bytes.Contains(data, []byte(`"b-key"`)) {
		t.Errorf("state.json does not record the secret names:\n%s", data)
	}
	if bytes.Contains(data, []byte("value-of")) {
		t.Errorf("state.json holds a secret value:\n%s", data)
	}
}

// syncBuffer is a bytes.Buffer safe for the logger's concurrent writes.
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

// TestLogsHideSecrets calls every RPC that carries secrets over gRPC with
// a logger at -v=5 and checks that no secret value reaches the log.
func TestLogsHideSecrets(t *testing.T) {
	const secret = "s3cr3t-VALUE"
	var logs syncBuffer
	logger := textlogger.NewLogger(textlogger.NewConfig(textlogger.Verbosity(5), textlogger.Output(&logs)))
	ctx := klog.NewContext(t.Context(), logger)

	cfg := DefaultConfig()
	cfg.NodeID, cfg.Backend, cfg.EnableAttach = testNode, BackendMemory, true
	cfg.RequireCreateSecrets = map[string]string{"password": secret}
	cfg.RequireDeleteSecrets = map[string]string{"password": secret}
	d, err := New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	conn := serveTest(ctx, t, d)
	ctl, node := csi.NewControllerClient(conn), csi.NewNodeClient(conn)
	secrets := map[string]string{"password": secret, "other": secret + "-2"}

	req := createReq("pvc-1", gi)
	req.Secrets = secrets
	vol, err := ctl.CreateVolume(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	id := vol.GetVolume().GetVolumeId()
	// A failing call logs its error too.
	bad := createReq("pvc-2", gi)
	bad.Secrets = map[string]string{"password": secret + "-wrong"}
	_, err = ctl.CreateVolume(t.Context(), bad)
	wantCode(t, err, codes.Unauthenticated)
	if _, err := ctl.ControllerPublishVolume(t.Context(), &csi.ControllerPublishVolumeRequest{
		VolumeId: id, NodeId: testNode, VolumeCapability: mountCap(rwo), Secrets: secrets,
	}); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(t.TempDir(), "target")
	if _, err := node.NodePublishVolume(t.Context(), &csi.NodePublishVolumeRequest{
		VolumeId: id, TargetPath: target, VolumeCapability: mountCap(rwo), Secrets: secrets,
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := ctl.CreateSnapshot(t.Context(), &csi.CreateSnapshotRequest{Name: "snap", SourceVolumeId: id, Secrets: secrets}); err != nil {
		t.Fatal(err)
	}
	if _, err := node.NodeUnpublishVolume(t.Context(), &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
		t.Fatal(err)
	}
	if _, err := ctl.ControllerUnpublishVolume(t.Context(), &csi.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: testNode, Secrets: secrets}); err != nil {
		t.Fatal(err)
	}
	if _, err := ctl.DeleteVolume(t.Context(), &csi.DeleteVolumeRequest{VolumeId: id, Secrets: secrets}); err != nil {
		t.Fatal(err)
	}

	out := logs.String()
	for _, want := range []string{
		"/csi.v1.Controller/CreateVolume", "/csi.v1.Controller/DeleteVolume", "/csi.v1.Node/NodePublishVolume",
		"gRPC request", "gRPC response", "gRPC call failed", "duration=", "***stripped***",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q", want)
		}
	}
	if strings.Contains(out, secret) {
		t.Errorf("log shows a secret value:\n%s", out)
	}
}

// serveTest serves d on a unix socket in a temporary directory until the
// test ends, and returns a client connection.
func serveTest(ctx context.Context, t *testing.T, d *Driver) *grpc.ClientConn {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "csi.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- d.Serve(ctx, lis) }()
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = conn.Close()
		cancel()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return conn
}

// TestEchoSecretsFault: with the EchoSecrets fault a call refused for its
// secrets quotes the secrets it was sent; without it the message names
// only the key.
func TestEchoSecretsFault(t *testing.T) {
	for _, echo := range []bool{false, true} {
		d := newTestDriver(t, func(c *Config) {
			c.RequireCreateSecrets = map[string]string{"password": "create-pw"}
			c.RequireDeleteSecrets = map[string]string{"token": "delete-pw"}
			c.Faults.EchoSecrets = echo
		})
		req := createReq("pvc-1", gi)
		req.Secrets = map[string]string{"password": "guess-1"}
		_, createErr := d.CreateVolume(t.Context(), req)
		_, deleteErr := d.DeleteVolume(t.Context(), &csi.DeleteVolumeRequest{VolumeId: "v", Secrets: map[string]string{"token": "guess-2"}})
		for _, c := range []struct {
			err   error
			value string
		}{{createErr, "guess-1"}, {deleteErr, "guess-2"}} {
			wantCode(t, c.err, codes.Unauthenticated)
			if got := strings.Contains(status.Convert(c.err).Message(), c.value); got != echo {
				t.Errorf("echo %v: message %q quotes the secret sent: %v", echo, status.Convert(c.err).Message(), got)
			}
		}
	}
}
