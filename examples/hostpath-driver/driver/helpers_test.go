package driver

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

const (
	gi       = int64(1) << 30
	testNode = "node-1"
)

// newTestDriver returns a memory-backed driver with default flags, changed
// by mutate, and closes it when the test ends.
func newTestDriver(t *testing.T, mutate func(*Config), opts ...Option) *Driver {
	t.Helper()
	cfg := DefaultConfig()
	cfg.NodeID = testNode
	cfg.Backend = BackendMemory
	if mutate != nil {
		mutate(&cfg)
	}
	d, err := New(t.Context(), cfg, opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = d.Close() })
	return d
}

// dirBackend is a Config mutation for the dir backend in a temporary root.
func dirBackend(t *testing.T) func(*Config) {
	root := filepath.Join(t.TempDir(), "root")
	return func(c *Config) { c.Backend, c.Root = BackendDir, root }
}

func mountCap(mode csi.VolumeCapability_AccessMode_Mode) *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: mode},
	}
}

func blockCap(mode csi.VolumeCapability_AccessMode_Mode) *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: mode},
	}
}

const rwo = csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER

// createReq builds a CreateVolumeRequest for a mount volume of size bytes
// (no capacity range when size is 0).
func createReq(name string, size int64) *csi.CreateVolumeRequest {
	req := &csi.CreateVolumeRequest{Name: name, VolumeCapabilities: []*csi.VolumeCapability{mountCap(rwo)}}
	if size > 0 {
		req.CapacityRange = &csi.CapacityRange{RequiredBytes: size}
	}
	return req
}

// mustCreate creates a volume and fails the test on error.
func mustCreate(t *testing.T, d *Driver, req *csi.CreateVolumeRequest) *csi.Volume {
	t.Helper()
	resp, err := d.CreateVolume(t.Context(), req)
	if err != nil {
		t.Fatalf("CreateVolume(%s): %v", req.GetName(), err)
	}
	return resp.GetVolume()
}

// wantCode fails the test unless err has the given gRPC code.
func wantCode(t *testing.T, err error, want codes.Code) {
	t.Helper()
	if got := status.Code(err); got != want {
		t.Fatalf("got code %s (%v), want %s", got, err, want)
	}
}

// volumeIDs lists all volume IDs through ListVolumes.
func volumeIDs(t *testing.T, d *Driver) map[string]int64 {
	t.Helper()
	resp, err := d.ListVolumes(t.Context(), &csi.ListVolumesRequest{})
	if err != nil {
		t.Fatalf("ListVolumes: %v", err)
	}
	ids := map[string]int64{}
	for _, e := range resp.GetEntries() {
		ids[e.GetVolume().GetVolumeId()] = e.GetVolume().GetCapacityBytes()
	}
	return ids
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
