package backend

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/kube-storage/csi-provisioner/examples/hostpath-driver/state"
)

func newDir(t *testing.T) *Dir {
	t.Helper()
	d, err := NewDir(filepath.Join(t.TempDir(), "root"))
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestNewDirNeedsAbsoluteRoot(t *testing.T) {
	if _, err := NewDir("relative/root"); err == nil {
		t.Error("NewDir accepted a relative root")
	}
}

func TestDirLoadRemovesOrphans(t *testing.T) {
	d := newDir(t)
	s := state.New()
	s.Volumes["vol-kept"] = &state.Volume{ID: "vol-kept", AccessType: state.Mount}
	s.Volumes["vol-kept-block"] = &state.Volume{ID: "vol-kept-block", AccessType: state.Block, CapacityBytes: 1 << 20}
	s.Snapshots["snap-kept"] = &state.Snapshot{ID: "snap-kept", AccessType: state.Mount}
	for _, v := range s.Volumes {
		if err := d.CreateVolume(v, Source{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.CreateSnapshot(s.Snapshots["snap-kept"], s.Volumes["vol-kept"]); err != nil {
		t.Fatal(err)
	}
	if err := d.Save(s); err != nil {
		t.Fatal(err)
	}
	// Data of calls that never saved their state, and a directory that is
	// not the driver's.
	orphans := []*state.Volume{{ID: "vol-orphan", AccessType: state.Mount}, {ID: "vol-orphan-block", AccessType: state.Block, CapacityBytes: 1}}
	for _, v := range orphans {
		if err := d.CreateVolume(v, Source{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.CreateSnapshot(&state.Snapshot{ID: "snap-orphan", AccessType: state.Mount}, s.Volumes["vol-kept"]); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(d.Root(), "volumes", "lost+found"), 0o700); err != nil {
		t.Fatal(err)
	}

	loaded, err := d.Load(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(loaded.Volumes) != 2 || len(loaded.Snapshots) != 1 {
		t.Errorf("loaded %d volumes and %d snapshots, want 2 and 1", len(loaded.Volumes), len(loaded.Snapshots))
	}
	if got, want := list(t, d.Root(), "volumes"), []string{"lost+found", "vol-kept", "vol-kept-block.img"}; !slices.Equal(got, want) {
		t.Errorf("volumes/ holds %v, want %v", got, want)
	}
	if got, want := list(t, d.Root(), "snapshots"), []string{"snap-kept"}; !slices.Equal(got, want) {
		t.Errorf("snapshots/ holds %v, want %v", got, want)
	}
}

func list(t *testing.T, dirs ...string) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(dirs...))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

func TestDirMountVolumeCopies(t *testing.T) {
	d := newDir(t)
	src := &state.Volume{ID: "vol-src", AccessType: state.Mount}
	if err := d.CreateVolume(src, Source{}); err != nil {
		t.Fatal(err)
	}
	srcDir := d.volumePath(src)
	if fi, err := os.Stat(srcDir); err != nil || fi.Mode().Perm() != 0o777 {
		t.Fatalf("volume directory %v (%v), want mode 0777", fi, err)
	}
	writeSampleTree(t, srcDir)

	snap := &state.Snapshot{ID: "snap-1", AccessType: state.Mount}
	if err := d.CreateSnapshot(snap, src); err != nil {
		t.Fatal(err)
	}
	// Changes after the snapshot do not reach it.
	mustWrite(t, filepath.Join(srcDir, "a.txt"), "changed", 0o640)

	clone := &state.Volume{ID: "vol-clone", AccessType: state.Mount}
	if err := d.CreateVolume(clone, Source{Volume: src}); err != nil {
		t.Fatal(err)
	}
	restored := &state.Volume{ID: "vol-restored", AccessType: state.Mount}
	if err := d.CreateVolume(restored, Source{Snapshot: snap}); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		dir   string
		wantA string
	}{
		{"clone", d.volumePath(clone), "changed"},
		{"restored", d.volumePath(restored), "hello"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkFile(t, filepath.Join(tt.dir, "a.txt"), tt.wantA, 0o640)
			checkFile(t, filepath.Join(tt.dir, "sub", "deeper", "b.bin"), "binary", 0o600)
			if link, err := os.Readlink(filepath.Join(tt.dir, "link")); err != nil || link != "a.txt" {
				t.Errorf("symlink: %q, %v", link, err)
			}
			if fi, err := os.Stat(filepath.Join(tt.dir, "sub")); err != nil || fi.Mode().Perm() != 0o700 {
				t.Errorf("sub: %v, %v; want mode 0700", fi, err)
			}
		})
	}

	for _, v := range []*state.Volume{src, clone, restored, src} { // src twice: idempotent
		if err := d.DeleteVolume(v); err != nil {
			t.Errorf("DeleteVolume(%s): %v", v.ID, err)
		}
	}
	if err := d.DeleteSnapshot(snap); err != nil {
		t.Error(err)
	}
	if got := append(list(t, d.Root(), "volumes"), list(t, d.Root(), "snapshots")...); len(got) != 0 {
		t.Errorf("left after deleting everything: %v", got)
	}
}

func TestDirBlockVolumeCopies(t *testing.T) {
	const size = int64(1) << 30
	d := newDir(t)
	src := &state.Volume{ID: "vol-src", AccessType: state.Block, CapacityBytes: size}
	if err := d.CreateVolume(src, Source{}); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(d.volumePath(src), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, off := range []int64{0, 300 << 20, size - 4} {
		if _, err := f.WriteAt([]byte("data"), off); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}

	snap := &state.Snapshot{ID: "snap-1", AccessType: state.Block, SizeBytes: size}
	if err := d.CreateSnapshot(snap, src); err != nil {
		t.Fatal(err)
	}
	restored := &state.Volume{ID: "vol-restored", AccessType: state.Block, CapacityBytes: 2 * size}
	if err := d.CreateVolume(restored, Source{Snapshot: snap}); err != nil {
		t.Fatal(err)
	}
	clone := &state.Volume{ID: "vol-clone", AccessType: state.Block, CapacityBytes: size}
	if err := d.CreateVolume(clone, Source{Volume: src}); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name     string
		path     string
		wantSize int64
	}{
		{"source", d.volumePath(src), size},
		{"snapshot", d.snapshotPath(snap), size},
		{"restored and grown", d.volumePath(restored), 2 * size},
		{"clone", d.volumePath(clone), size},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f, err := os.Open(tt.path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			fi, err := f.Stat()
			if err != nil || fi.Size() != tt.wantSize {
				t.Fatalf("size %d (%v), want %d", fi.Size(), err, tt.wantSize)
			}
			for _, off := range []int64{0, 300 << 20, size - 4} {
				buf := make([]byte, 4)
				if _, err := f.ReadAt(buf, off); err != nil || !bytes.Equal(buf, []byte("data")) {
					t.Errorf("at %d: %q, %v; want \"data\"", off, buf, err)
				}
			}
			hole := make([]byte, 4)
			if _, err := f.ReadAt(hole, 100<<20); err != nil || !bytes.Equal(hole, make([]byte, 4)) {
				t.Errorf("a hole reads %q, %v; want zeros", hole, err)
			}
			checkSparse(t, tt.path, 1<<20)
		})
	}
}

func TestMemoryPublish(t *testing.T) {
	m := NewMemory()
	dir := t.TempDir()
	for _, tt := range []struct {
		name  string
		at    state.AccessType
		isDir bool
	}{{"mount", state.Mount, true}, {"block", state.Block, false}} {
		t.Run(tt.name, func(t *testing.T) {
			target := filepath.Join(dir, tt.name)
			v := &state.Volume{ID: "vol-1", AccessType: tt.at}
			for range 2 { // idempotent
				if err := m.Publish(v, target, false); err != nil {
					t.Fatal(err)
				}
			}
			if fi, err := os.Stat(target); err != nil || fi.IsDir() != tt.isDir {
				t.Fatalf("target %v (%v), want directory=%t", fi, err, tt.isDir)
			}
			for range 2 {
				if err := m.Unpublish(v, target); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := os.Stat(target); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("target still there after Unpublish (%v)", err)
			}
		})
	}
	t.Run("missing parent", func(t *testing.T) {
		err := m.Publish(&state.Volume{AccessType: state.Mount}, filepath.Join(dir, "no", "such"), false)
		if !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("Publish under a missing parent: %v, want fs.ErrNotExist", err)
		}
	})
	t.Run("wrong kind of target", func(t *testing.T) {
		if err := m.Publish(&state.Volume{AccessType: state.Block}, dir, false); err == nil {
			t.Error("Publish of a block volume onto a directory succeeded")
		}
	})
}

func TestCheckBindMount(t *testing.T) {
	err := CheckBindMount(t.TempDir())
	if err != nil && !errors.Is(err, ErrMountNotPermitted) {
		t.Fatalf("CheckBindMount: %v, want nil or ErrMountNotPermitted", err)
	}
	t.Logf("CheckBindMount: %v", err)
}

// writeSampleTree fills dir with what the copy tests copy: a.txt ("hello",
// 0640), sub/deeper/b.bin ("binary", 0600; directories 0700) and link, a
// symbolic link to a.txt.
func writeSampleTree(t *testing.T, dir string) {
	t.Helper()
	mustWrite(t, filepath.Join(dir, "a.txt"), "hello", 0o640)
	if err := os.MkdirAll(filepath.Join(dir, "sub", "deeper"), 0o700); err != nil {
		t.Fatal(err)
	}
	mustWrite(t, filepath.Join(dir, "sub", "deeper", "b.bin"), "binary", 0o600)
	if err := os.Symlink("a.txt", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
}

func mustWrite(t *testing.T, path, content string, mode fs.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}

func checkFile(t *testing.T, path, content string, mode fs.FileMode) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil || string(data) != content {
		t.Errorf("%s: %q, %v; want %q", path, data, err, content)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != mode {
		t.Errorf("%s: mode %v, %v; want %v", path, fi.Mode().Perm(), err, mode)
	}
}
