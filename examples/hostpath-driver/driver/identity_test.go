package driver

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestProbe checks that Probe reports ready while the dir backend's storage
// is there, FAILED_PRECONDITION naming what is gone when it is not, and
// ready again once it is back.
func TestProbe(t *testing.T) {
	tests := []struct {
		name string
		// lose makes the storage unusable and returns what undoes it.
		lose     func(t *testing.T, root string) (restore func() error)
		wantCode codes.Code
		wantMsg  string
	}{
		{name: "healthy", lose: func(*testing.T, string) func() error { return func() error { return nil } }, wantCode: codes.OK},
		{name: "root unmounted, empty mount point left", lose: func(t *testing.T, root string) func() error {
			moved := root + ".away"
			if err := os.Rename(root, moved); err != nil {
				t.Fatal(err)
			}
			if err := os.Mkdir(root, 0o750); err != nil {
				t.Fatal(err)
			}
			return func() error {
				if err := os.Remove(root); err != nil {
					return err
				}
				return os.Rename(moved, root)
			}
		}, wantCode: codes.FailedPrecondition, wantMsg: "volumes: no such file or directory"},
		{name: "snapshots replaced by a file", lose: func(t *testing.T, root string) func() error {
			dir := filepath.Join(root, "snapshots")
			if err := os.Rename(dir, dir+".away"); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(dir, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			return func() error {
				if err := os.Remove(dir); err != nil {
					return err
				}
				return os.Rename(dir+".away", dir)
			}
		}, wantCode: codes.FailedPrecondition, wantMsg: "snapshots is not a directory"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := filepath.Join(t.TempDir(), "root")
			d := newTestDriver(t, func(c *Config) { c.Backend, c.Root = BackendDir, root })
			restore := tt.lose(t, root)
			resp, err := d.Probe(t.Context(), &csi.ProbeRequest{})
			wantCode(t, err, tt.wantCode)
			if err != nil {
				if msg := status.Convert(err).Message(); !strings.Contains(msg, tt.wantMsg) {
					t.Errorf("Probe message %q, want it to contain %q", msg, tt.wantMsg)
				}
			} else if !resp.GetReady().GetValue() {
				t.Errorf("Probe = %v, want ready", resp)
			}
			if err := restore(); err != nil {
				t.Fatal(err)
			}
			if resp, err := d.Probe(t.Context(), &csi.ProbeRequest{}); err != nil || !resp.GetReady().GetValue() {
				t.Errorf("Probe after the storage is back = %v, %v; want ready", resp, err)
			}
		})
	}
}

// TestProbeMemory checks that the memory backend is always healthy.
func TestProbeMemory(t *testing.T) {
	d := newTestDriver(t, nil)
	if resp, err := d.Probe(t.Context(), &csi.ProbeRequest{}); err != nil || !resp.GetReady().GetValue() {
		t.Errorf("Probe = %v, %v; want ready", resp, err)
	}
}

// TestProbeWhileBusy checks that Probe answers while another call holds the
// driver's lock, as a clone or snapshot of a large volume does while it
// copies the data. A Probe that waited would fail the CO's liveness or
// readiness checks (the liveness probe sidecar restarts the driver, which
// aborts the copy, and the retried copy meets the same fate).
func TestProbeWhileBusy(t *testing.T) {
	for name, mutate := range map[string]func(*Config){"memory": nil, "dir": dirBackend(t)} {
		t.Run(name, func(t *testing.T) {
			d := newTestDriver(t, mutate)
			d.mu.Lock() // a long copy in progress
			answered := make(chan error, 1)
			go func() {
				_, err := d.Probe(t.Context(), &csi.ProbeRequest{})
				answered <- err
			}()
			select {
			case err := <-answered:
				d.mu.Unlock()
				if err != nil {
					t.Errorf("Probe while busy: %v", err)
				}
			case <-time.After(10 * time.Second):
				d.mu.Unlock()
				err := <-answered // let the goroutine finish before the driver is closed
				t.Errorf("Probe did not answer within 10s while another call held the driver's lock (then: %v)", err)
			}
		})
	}
}
