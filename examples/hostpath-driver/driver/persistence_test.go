package driver

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/kube-storage/csi-provisioner/examples/hostpath-driver/state"
)

// TestDirStateSurvivesRestart creates volumes, a snapshot, an attachment
// and a publication with one driver, then checks that a second driver on
// the same root sees all of them.
func TestDirStateSurvivesRestart(t *testing.T) {
	root := filepath.Join(t.TempDir(), "root")
	sameRoot := func(c *Config) { c.Backend, c.Root, c.EnableAttach = BackendDir, root, true }

	first := newTestDriver(t, sameRoot)
	want := map[string]int64{}
	for i := range 5 {
		v := mustCreate(t, first, createReq(fmt.Sprintf("pvc-%d", i), int64(i+1)*gi))
		want[v.GetVolumeId()] = v.GetCapacityBytes()
	}
	deleted := mustCreate(t, first, createReq("deleted", gi)).GetVolumeId()
	if _, err := first.DeleteVolume(t.Context(), &csi.DeleteVolumeRequest{VolumeId: deleted}); err != nil {
		t.Fatal(err)
	}
	var someID string
	for id := range want {
		someID = id
		break
	}
	snap, err := first.CreateSnapshot(t.Context(), &csi.CreateSnapshotRequest{Name: "snap", SourceVolumeId: someID})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := first.ControllerPublishVolume(t.Context(), &csi.ControllerPublishVolumeRequest{VolumeId: someID, NodeId: testNode, VolumeCapability: mountCap(rwo)}); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(t.TempDir(), "target")
	if err := os.Mkdir(target, 0o750); err != nil {
		t.Fatal(err)
	}
	// Record a publication the way NodePublishVolume does, without the
	// bind mount, so that the test needs no privileges.
	first.mu.Lock()
	first.st.Publications[target] = &state.Publication{TargetPath: target, VolumeID: someID, AccessMode: rwo.String()}
	err = first.commitLocked(func() {})
	first.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	_ = first.Close()

	second := newTestDriver(t, sameRoot)
	if got := volumeIDs(t, second); !maps.Equal(got, want) {
		t.Errorf("volumes after restart %v, want %v", got, want)
	}
	var used int64
	for _, size := range want {
		used += size
	}
	if resp, err := second.GetCapacity(t.Context(), &csi.GetCapacityRequest{}); err != nil || resp.GetAvailableCapacity() != DefaultCapacity-used {
		t.Errorf("available capacity after restart: %v, %v; want %d", resp.GetAvailableCapacity(), err, DefaultCapacity-used)
	}
	snaps, err := second.ListSnapshots(t.Context(), &csi.ListSnapshotsRequest{})
	if err != nil || len(snaps.GetEntries()) != 1 || snaps.GetEntries()[0].GetSnapshot().GetSnapshotId() != snap.GetSnapshot().GetSnapshotId() {
		t.Errorf("snapshots after restart: %v, %v", snaps, err)
	}
	// The attachment and publication survived: the volume is still in use.
	_, err = second.DeleteVolume(t.Context(), &csi.DeleteVolumeRequest{VolumeId: someID})
	wantCode(t, err, codes.FailedPrecondition)
	// Names survived too: CreateVolume is still idempotent.
	again := mustCreate(t, second, createReq("pvc-0", gi))
	if _, ok := want[again.GetVolumeId()]; !ok {
		t.Errorf("CreateVolume pvc-0 after restart made a new volume %s", again.GetVolumeId())
	}
	// And the recorded publication can be undone.
	if _, err := second.NodeUnpublishVolume(t.Context(), &csi.NodeUnpublishVolumeRequest{VolumeId: someID, TargetPath: target}); err != nil {
		t.Fatalf("NodeUnpublishVolume after restart: %v", err)
	}
	if _, err := os.Stat(target); !os.IsNotExist(err) {
		t.Errorf("target still exists after NodeUnpublishVolume (%v)", err)
	}
	if _, err := second.ControllerUnpublishVolume(t.Context(), &csi.ControllerUnpublishVolumeRequest{VolumeId: someID, NodeId: testNode}); err != nil {
		t.Fatal(err)
	}
	if _, err := second.DeleteVolume(t.Context(), &csi.DeleteVolumeRequest{VolumeId: someID}); err != nil {
		t.Fatalf("DeleteVolume after unpublishing: %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, "volumes", someID)); !os.IsNotExist(err) {
		t.Errorf("the deleted volume's directory still exists (%v)", err)
	}
}

// TestCapacityShrunkOnRestart restarts a dir driver with a --capacity
// smaller than what its volumes already use. GetCapacity must then report
// 0, never a negative size: the CSI spec forbids a negative
// available_capacity, and the API server refuses a CSIStorageCapacity
// with one, so capacity tracking would stop.
func TestCapacityShrunkOnRestart(t *testing.T) {
	root := filepath.Join(t.TempDir(), "root")
	first := newTestDriver(t, func(c *Config) { c.Backend, c.Root, c.CapacityBytes = BackendDir, root, 10*gi })
	mustCreate(t, first, createReq("a", 4*gi))
	mustCreate(t, first, createReq("b", 4*gi))
	_ = first.Close()

	second := newTestDriver(t, func(c *Config) { c.Backend, c.Root, c.CapacityBytes = BackendDir, root, 5*gi })
	resp, err := second.GetCapacity(t.Context(), &csi.GetCapacityRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if got, gotMax := resp.GetAvailableCapacity(), resp.GetMaximumVolumeSize().GetValue(); got != 0 || gotMax != 0 {
		t.Errorf("GetCapacity with 8Gi used of 5Gi: available %d, maximum volume size %d; want 0 and 0", got, gotMax)
	}
	_, err = second.CreateVolume(t.Context(), createReq("c", gi))
	wantCode(t, err, codes.ResourceExhausted)
	if err != nil && strings.Contains(err.Error(), " -") {
		t.Errorf("CreateVolume error reports a negative size: %v", err)
	}
}
