package backend

import (
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"testing"

	"github.com/kube-storage/csi-provisioner/examples/hostpath-driver/state"
)

// recordFsync makes fsync record the names of the files and directories it
// flushes until the test ends.
func recordFsync(t *testing.T) map[string]bool {
	t.Helper()
	synced := map[string]bool{}
	orig := fsync
	fsync = func(f *os.File) error {
		synced[filepath.Clean(f.Name())] = true
		return orig(f)
	}
	t.Cleanup(func() { fsync = orig })
	return synced
}

// TestDirCopiesAreDurable checks that a clone, a snapshot and a restore
// are on stable storage before the call returns: every copied file and
// directory and the directory entry of the copy are fsynced. The driver
// saves the state (and acknowledges the call) right after, so without
// this a power loss could leave an acknowledged clone or ready snapshot
// with empty or missing files.
func TestDirCopiesAreDurable(t *testing.T) {
	d := newDir(t)
	mountSrc := &state.Volume{ID: "vol-src", AccessType: state.Mount}
	blockSrc := &state.Volume{ID: "vol-blk", AccessType: state.Block, CapacityBytes: 1 << 20}
	for _, v := range []*state.Volume{mountSrc, blockSrc} {
		if err := d.CreateVolume(v, Source{}); err != nil {
			t.Fatal(err)
		}
	}
	srcDir := d.volumePath(mountSrc)
	writeSampleTree(t, srcDir)
	mountSnap := &state.Snapshot{ID: "snap-mount", AccessType: state.Mount}
	blockSnap := &state.Snapshot{ID: "snap-blk", AccessType: state.Block, SizeBytes: 1 << 20}

	tests := []struct {
		name string
		do   func() error
		path string
	}{
		{"mount snapshot", func() error { return d.CreateSnapshot(mountSnap, mountSrc) }, d.snapshotPath(mountSnap)},
		{"mount clone", func() error {
			return d.CreateVolume(&state.Volume{ID: "vol-clone", AccessType: state.Mount}, Source{Volume: mountSrc})
		}, filepath.Join(d.Root(), volumesDir, "vol-clone")},
		{"mount restore", func() error {
			return d.CreateVolume(&state.Volume{ID: "vol-restore", AccessType: state.Mount}, Source{Snapshot: mountSnap})
		}, filepath.Join(d.Root(), volumesDir, "vol-restore")},
		{"block snapshot", func() error { return d.CreateSnapshot(blockSnap, blockSrc) }, d.snapshotPath(blockSnap)},
		{"block restore", func() error {
			return d.CreateVolume(&state.Volume{ID: "vol-brestore", AccessType: state.Block, CapacityBytes: 1 << 20}, Source{Snapshot: blockSnap})
		}, filepath.Join(d.Root(), volumesDir, "vol-brestore.img")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synced := recordFsync(t)
			if err := tt.do(); err != nil {
				t.Fatal(err)
			}
			var missing []string
			want := []string{filepath.Dir(tt.path)}
			err := filepath.WalkDir(tt.path, func(path string, e fs.DirEntry, err error) error {
				if err != nil {
					return err
				}
				if e.IsDir() || e.Type().IsRegular() {
					want = append(want, path)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range want {
				if !synced[filepath.Clean(p)] {
					missing = append(missing, p)
				}
			}
			sort.Strings(missing)
			if len(missing) > 0 {
				t.Errorf("not fsynced before returning: %v", missing)
			}
		})
	}
}
