package driver

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kube-storage/csi-provisioner/examples/hostpath-driver/backend"
	"github.com/kube-storage/csi-provisioner/examples/hostpath-driver/state"
)

func TestNodeGetInfo(t *testing.T) {
	tests := []struct {
		name     string
		topology bool
	}{{"with topology", true}, {"without topology", false}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := newTestDriver(t, func(c *Config) { c.EnableTopology = tt.topology })
			info, err := d.NodeGetInfo(t.Context(), &csi.NodeGetInfoRequest{})
			if err != nil {
				t.Fatal(err)
			}
			if info.GetNodeId() != testNode {
				t.Errorf("node ID %q, want %q", info.GetNodeId(), testNode)
			}
			if got := info.GetAccessibleTopology().GetSegments()[TopologyKey]; (got == testNode) != tt.topology {
				t.Errorf("topology %v with topology=%t", info.GetAccessibleTopology(), tt.topology)
			}
			caps, err := d.GetPluginCapabilities(t.Context(), &csi.GetPluginCapabilitiesRequest{})
			if err != nil {
				t.Fatal(err)
			}
			if got := len(caps.GetCapabilities()); got != map[bool]int{true: 2, false: 1}[tt.topology] {
				t.Errorf("%d plugin capabilities: %v", got, caps.GetCapabilities())
			}
		})
	}
}

// TestNodePublishMemory walks NodePublish/NodeUnpublish through their
// cases on the memory backend, which only creates the target path.
func TestNodePublishMemory(t *testing.T) {
	d := newTestDriver(t, func(c *Config) { c.SingleNodeMultiWriter = true })
	mountVol := mustCreate(t, d, createReq("mount", gi)).GetVolumeId()
	blockReq := createReq("block", gi)
	blockReq.VolumeCapabilities = []*csi.VolumeCapability{blockCap(rwo)}
	blockVol := mustCreate(t, d, blockReq).GetVolumeId()
	snswReq := createReq("snsw", gi)
	snswReq.VolumeCapabilities = []*csi.VolumeCapability{mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER)}
	snswVol := mustCreate(t, d, snswReq).GetVolumeId()
	dir := t.TempDir()
	target := func(name string) string { return filepath.Join(dir, name) }

	publish := func(id, path string, c *csi.VolumeCapability, readOnly bool) error {
		_, err := d.NodePublishVolume(t.Context(), &csi.NodePublishVolumeRequest{VolumeId: id, TargetPath: path, VolumeCapability: c, Readonly: readOnly})
		return err
	}
	unpublish := func(id, path string) error {
		_, err := d.NodeUnpublishVolume(t.Context(), &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: path})
		return err
	}
	snsw := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER)
	steps := []struct {
		name     string
		call     func() error
		wantCode codes.Code
		wantPath string // a path that must exist afterwards ("dir" or "file" kind in wantKind)
		wantKind string
		gonePath string // a path that must not exist afterwards
	}{
		{name: "no volume id", call: func() error { return publish("", target("a"), mountCap(rwo), false) }, wantCode: codes.InvalidArgument},
		{name: "no target", call: func() error { return publish(mountVol, "", mountCap(rwo), false) }, wantCode: codes.InvalidArgument},
		{name: "no capability", call: func() error { return publish(mountVol, target("a"), nil, false) }, wantCode: codes.InvalidArgument},
		{name: "unknown volume", call: func() error { return publish("vol-ffffffffffffffff", target("a"), mountCap(rwo), false) }, wantCode: codes.NotFound},
		{name: "block capability on mount volume", call: func() error { return publish(mountVol, target("a"), blockCap(rwo), false) }, wantCode: codes.InvalidArgument},
		{name: "parent missing", call: func() error { return publish(mountVol, target("missing/a"), mountCap(rwo), false) }, wantCode: codes.FailedPrecondition},
		{name: "publish mount", call: func() error { return publish(mountVol, target("a"), mountCap(rwo), false) }, wantPath: target("a"), wantKind: "dir"},
		{name: "publish mount again", call: func() error { return publish(mountVol, target("a"), mountCap(rwo), false) }, wantPath: target("a"), wantKind: "dir"},
		{name: "same target read-only", call: func() error { return publish(mountVol, target("a"), mountCap(rwo), true) }, wantCode: codes.AlreadyExists},
		{name: "same target other volume", call: func() error { return publish(blockVol, target("a"), blockCap(rwo), false) }, wantCode: codes.AlreadyExists},
		{name: "second target", call: func() error { return publish(mountVol, target("b"), mountCap(rwo), true) }, wantPath: target("b"), wantKind: "dir"},
		{name: "publish block", call: func() error { return publish(blockVol, target("blk"), blockCap(rwo), false) }, wantPath: target("blk"), wantKind: "file"},
		{name: "single writer", call: func() error { return publish(snswVol, target("s1"), snsw, false) }, wantPath: target("s1"), wantKind: "dir"},
		{name: "single writer elsewhere", call: func() error { return publish(snswVol, target("s2"), snsw, false) }, wantCode: codes.FailedPrecondition, gonePath: target("s2")},
		{name: "unpublish without target", call: func() error { return unpublish(mountVol, "") }, wantCode: codes.InvalidArgument},
		{name: "unpublish without volume", call: func() error { return unpublish("", target("a")) }, wantCode: codes.InvalidArgument},
		{name: "unpublish other volume's target", call: func() error { return unpublish(blockVol, target("a")) }, wantCode: codes.FailedPrecondition},
		{name: "unpublish", call: func() error { return unpublish(mountVol, target("a")) }, gonePath: target("a")},
		{name: "unpublish again", call: func() error { return unpublish(mountVol, target("a")) }, gonePath: target("a")},
		{name: "unpublish unknown target", call: func() error { return unpublish("vol-ffffffffffffffff", target("never")) }},
		// What a crash between creating the target and saving the
		// publication leaves: a target the state does not know.
		{name: "unpublish unrecorded target", call: func() error {
			if err := os.Mkdir(target("unrecorded"), 0o750); err != nil {
				return err
			}
			return unpublish(mountVol, target("unrecorded"))
		}, gonePath: target("unrecorded")},
		{name: "unpublish block", call: func() error { return unpublish(blockVol, target("blk")) }, gonePath: target("blk")},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			wantCode(t, s.call(), s.wantCode)
			if s.wantPath != "" {
				fi, err := os.Stat(s.wantPath)
				if err != nil {
					t.Fatalf("target: %v", err)
				}
				if kind := map[bool]string{true: "dir", false: "file"}[fi.IsDir()]; kind != s.wantKind {
					t.Errorf("target is a %s, want a %s", kind, s.wantKind)
				}
			}
			if s.gonePath != "" {
				if _, err := os.Stat(s.gonePath); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("%s still exists (%v)", s.gonePath, err)
				}
			}
		})
	}
}

func TestNodePublishNeedsAttach(t *testing.T) {
	d := newTestDriver(t, func(c *Config) { c.EnableAttach = true })
	id := mustCreate(t, d, createReq("pvc-1", gi)).GetVolumeId()
	req := &csi.NodePublishVolumeRequest{VolumeId: id, TargetPath: filepath.Join(t.TempDir(), "t"), VolumeCapability: mountCap(rwo)}
	_, err := d.NodePublishVolume(t.Context(), req)
	wantCode(t, err, codes.FailedPrecondition)
	if _, err := d.ControllerPublishVolume(t.Context(), &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: testNode, VolumeCapability: mountCap(rwo)}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.NodePublishVolume(t.Context(), req); err != nil {
		t.Fatalf("NodePublishVolume after ControllerPublishVolume: %v", err)
	}
}

// unmountableBackend fails every Publish as an unprivileged dir backend
// would.
type unmountableBackend struct{ backend.Memory }

func (unmountableBackend) Publish(_ *state.Volume, target string, _ bool) error {
	return fmt.Errorf("bind mount x on %s: %w", target, backend.ErrMountNotPermitted)
}

func TestNodePublishWithoutMountPrivilege(t *testing.T) {
	d := newTestDriver(t, nil, WithBackend(unmountableBackend{}))
	id := mustCreate(t, d, createReq("pvc-1", gi)).GetVolumeId()
	_, err := d.NodePublishVolume(t.Context(), &csi.NodePublishVolumeRequest{VolumeId: id, TargetPath: filepath.Join(t.TempDir(), "t"), VolumeCapability: mountCap(rwo)})
	wantCode(t, err, codes.FailedPrecondition)
	if msg := status.Convert(err).Message(); !strings.Contains(msg, "CAP_SYS_ADMIN") {
		t.Errorf("message %q does not say why", msg)
	}
	if _, err := d.DeleteVolume(t.Context(), &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
		t.Errorf("a failed publish left the volume in use: %v", err)
	}
}

// TestNodePublishDir bind-mounts real volumes; it needs root or
// CAP_SYS_ADMIN and skips itself otherwise.
func TestNodePublishDir(t *testing.T) {
	if err := backend.CheckBindMount(t.TempDir()); err != nil {
		t.Skipf("cannot bind mount here: %v", err)
	}
	d := newTestDriver(t, dirBackend(t))
	id := mustCreate(t, d, createReq("mount", gi)).GetVolumeId()
	blockReq := createReq("block", 16<<20)
	blockReq.VolumeCapabilities = []*csi.VolumeCapability{blockCap(rwo)}
	blockID := mustCreate(t, d, blockReq).GetVolumeId()
	dir := t.TempDir()
	rw, ro, blk := filepath.Join(dir, "rw"), filepath.Join(dir, "ro"), filepath.Join(dir, "blk")
	publish := func(id, target string, c *csi.VolumeCapability, readOnly bool) {
		t.Helper()
		if _, err := d.NodePublishVolume(t.Context(), &csi.NodePublishVolumeRequest{VolumeId: id, TargetPath: target, VolumeCapability: c, Readonly: readOnly}); err != nil {
			t.Fatalf("NodePublishVolume(%s): %v", target, err)
		}
		t.Cleanup(func() { _ = syscall.Unmount(target, 0) }) // only matters if the test fails half-way
	}
	publish(id, rw, mountCap(rwo), false)
	publish(id, ro, mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY), false)
	publish(blockID, blk, blockCap(rwo), false)

	if err := os.WriteFile(filepath.Join(rw, "hello"), []byte("world"), 0o600); err != nil {
		t.Fatalf("write through the read-write mount: %v", err)
	}
	if data, err := os.ReadFile(filepath.Join(ro, "hello")); err != nil || string(data) != "world" {
		t.Errorf("read through the read-only mount: %q, %v", data, err)
	}
	if err := os.WriteFile(filepath.Join(ro, "nope"), nil, 0o600); !errors.Is(err, syscall.EROFS) {
		t.Errorf("write through the read-only mount: %v, want EROFS", err)
	}
	if fi, err := os.Stat(blk); err != nil || fi.Size() != 16<<20 {
		t.Errorf("block target: %v, %v; want a 16Mi file", fi, err)
	}

	for _, u := range []struct{ id, target string }{{id, rw}, {id, ro}, {blockID, blk}} {
		if _, err := d.NodeUnpublishVolume(t.Context(), &csi.NodeUnpublishVolumeRequest{VolumeId: u.id, TargetPath: u.target}); err != nil {
			t.Fatalf("NodeUnpublishVolume(%s): %v", u.target, err)
		}
		if _, err := os.Stat(u.target); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s still exists after unpublish (%v)", u.target, err)
		}
	}
	// The data stayed in the volume, and a clone carries it.
	clone := createReq("clone", gi)
	clone.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{
		Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: id},
	}}
	cloneID := mustCreate(t, d, clone).GetVolumeId()
	cloneTarget := filepath.Join(dir, "clone")
	publish(cloneID, cloneTarget, mountCap(rwo), false)
	if data, err := os.ReadFile(filepath.Join(cloneTarget, "hello")); err != nil || string(data) != "world" {
		t.Errorf("read the clone: %q, %v", data, err)
	}
	if _, err := d.NodeUnpublishVolume(t.Context(), &csi.NodeUnpublishVolumeRequest{VolumeId: cloneID, TargetPath: cloneTarget}); err != nil {
		t.Fatal(err)
	}
}

// mountVolumeToPublish returns the configuration of a dir backend (for a
// second driver on the same root), a driver on it with a mount volume (id)
// and a publish target that does not exist yet. It skips the test where
// bind mounts are not permitted.
func mountVolumeToPublish(t *testing.T) (root func(*Config), d *Driver, id, target string) {
	t.Helper()
	if err := backend.CheckBindMount(t.TempDir()); err != nil {
		t.Skipf("cannot bind mount here: %v", err)
	}
	root = dirBackend(t)
	d = newTestDriver(t, root)
	id = mustCreate(t, d, createReq("mount", gi)).GetVolumeId()
	return root, d, id, filepath.Join(t.TempDir(), "target")
}

// TestNodeUnpublishAfterCrash covers a driver killed after NodePublish
// bind-mounted the volume but before it saved the publication. The
// restarted driver does not know the target; the CO's NodeUnpublish must
// still unmount and remove it, or the mount leaks and the CO cannot clean
// up the target. It needs root or CAP_SYS_ADMIN and skips itself otherwise.
func TestNodeUnpublishAfterCrash(t *testing.T) {
	root, first, id, target := mountVolumeToPublish(t)
	first.mu.Lock()
	err := first.backend.Publish(first.st.Volumes[id], target, false) // the mount, then the crash
	first.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(target, 0) }) // only matters if the test fails
	_ = first.Close()

	second := newTestDriver(t, root)
	if _, err := second.NodeUnpublishVolume(t.Context(), &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
		t.Fatalf("NodeUnpublishVolume: %v", err)
	}
	if _, err := os.Stat(target); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the target is still there after NodeUnpublishVolume (%v): its mount leaked", err)
	}
	if _, err := second.DeleteVolume(t.Context(), &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
		t.Fatalf("DeleteVolume: %v", err)
	}
}

// TestNodePublishAfterRestart covers a node restart: its mounts are gone,
// but the state still records the publication, and the kubelet calls
// NodePublishVolume again for the same target. The driver must mount the
// volume again: answering OK from its record would give the pod an empty
// directory of the node's disk, and the data written there would then make
// NodeUnpublishVolume fail ("directory not empty") for ever. It needs root
// or CAP_SYS_ADMIN and skips itself otherwise.
func TestNodePublishAfterRestart(t *testing.T) {
	root, first, id, target := mountVolumeToPublish(t)
	req := &csi.NodePublishVolumeRequest{VolumeId: id, TargetPath: target, VolumeCapability: mountCap(rwo)}
	if _, err := first.NodePublishVolume(t.Context(), req); err != nil {
		t.Fatal(err)
	}
	_ = first.Close()
	// The restart: the mount goes, the target directory stays.
	if err := syscall.Unmount(target, 0); err != nil {
		t.Fatal(err)
	}
	second := newTestDriver(t, root)
	if _, err := second.NodePublishVolume(t.Context(), req); err != nil {
		t.Fatalf("NodePublishVolume after the restart: %v", err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(target, 0) }) // only matters if the test fails
	if err := os.WriteFile(filepath.Join(target, "data"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(second.backend.(*backend.Dir).Root(), "volumes", id, "data")); err != nil {
		t.Errorf("the file written at the target is not in the volume (%v): the target is a directory of the node's disk", err)
	}
	if _, err := second.NodeUnpublishVolume(t.Context(), &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
		t.Errorf("NodeUnpublishVolume: %v", err)
	}
	if _, err := os.Stat(target); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the target is still there after NodeUnpublishVolume (%v)", err)
	}
}
