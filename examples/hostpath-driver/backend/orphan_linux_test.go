package backend

import (
	"maps"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"

	"github.com/kube-storage/csi-provisioner/examples/hostpath-driver/state"
)

// TestDirLoadKeepsUnremovableOrphan: data no saved state refers to that
// cannot be removed now (here a mount inside it: EBUSY; DeleteVolume leaves
// such data behind and answers OK) is left for a later start; the driver
// still starts with the volumes it has.
func TestDirLoadKeepsUnremovableOrphan(t *testing.T) {
	d := newDir(t)
	if err := CheckBindMount(t.TempDir()); err != nil {
		t.Skipf("needs bind mounts: %v", err)
	}
	s := state.New()
	s.Volumes["vol-kept"] = &state.Volume{ID: "vol-kept", AccessType: state.Mount}
	orphan := &state.Volume{ID: "vol-busy", AccessType: state.Mount}
	for _, v := range []*state.Volume{s.Volumes["vol-kept"], orphan} {
		if err := d.CreateVolume(v, Source{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.Save(s); err != nil {
		t.Fatal(err)
	}
	busy := filepath.Join(d.Root(), "volumes", "vol-busy", "busy")
	if err := os.Mkdir(busy, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount(t.TempDir(), busy, "", syscall.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(busy, syscall.MNT_DETACH) })

	loaded, err := d.Load(t.Context())
	if err != nil {
		t.Fatalf("Load with data that cannot be removed now: %v", err)
	}
	if _, ok := loaded.Volumes["vol-kept"]; !ok || len(loaded.Volumes) != 1 {
		t.Errorf("loaded volumes %v, want vol-kept only", slices.Collect(maps.Keys(loaded.Volumes)))
	}
}
