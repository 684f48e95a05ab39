package backend

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"k8s.io/klog/v2"

	"github.com/kube-storage/csi-provisioner/examples/hostpath-driver/state"
)

// Layout of a Dir root:
//
//	<root>/state.json            the driver's state (state.Save)
//	<root>/volumes/<id>          a mount volume: a directory
//	<root>/volumes/<id>.img      a block volume: a sparse file
//	<root>/snapshots/<id>[.img]  a snapshot: a copy of its source volume
const (
	stateFile    = "state.json"
	volumesDir   = "volumes"
	snapshotsDir = "snapshots"
	blockSuffix  = ".img"
)

// Dir is a Backend that keeps volumes and snapshots under a root directory
// and persists the driver's state in <root>/state.json.
//
// Mount volumes are directories created with mode 0777, like upstream
// csi-driver-host-path, so that workloads running as any user can write
// to them (this driver does not implement fsGroup); the root itself is
// 0750. Copies (clones, snapshots, restores) keep file modes and sparse
// holes but not ownership, and skip device files, sockets and pipes.
type Dir struct {
	root string
}

var _ Backend = (*Dir)(nil)

// NewDir returns a Dir backend rooted at root, creating the directory
// layout if it does not exist. root must be an absolute path.
func NewDir(root string) (*Dir, error) {
	if !filepath.IsAbs(root) {
		return nil, fmt.Errorf("dir backend root %q is not an absolute path", root)
	}
	d := &Dir{root: root}
	for _, dir := range d.layout() {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return nil, fmt.Errorf("create dir backend layout: %w", err)
		}
	}
	return d, nil
}

// layout returns the directories NewDir creates.
func (d *Dir) layout() []string {
	return []string{d.root, filepath.Join(d.root, volumesDir), filepath.Join(d.root, snapshotsDir)}
}

// Root returns the root directory.
func (d *Dir) Root() string { return d.root }

// StatePath returns the path of the state file.
func (d *Dir) StatePath() string { return filepath.Join(d.root, stateFile) }

// Load reads <root>/state.json and then removes volume and snapshot data
// that the state does not mention: data allocated by a CreateVolume or
// CreateSnapshot whose state was never saved (the call was not
// acknowledged), or left by a DeleteVolume that saved its state but did
// not get to remove the data. Every removal is logged.
func (d *Dir) Load(ctx context.Context) (*state.State, error) {
	logger := klog.FromContext(ctx)
	if err := state.CleanTemp(d.StatePath()); err != nil {
		return nil, err
	}
	s, err := state.Load(d.StatePath())
	if err != nil {
		return nil, err
	}
	keepVolumes := map[string]bool{}
	for _, v := range s.Volumes {
		keepVolumes[filepath.Base(d.volumePath(v))] = true
	}
	keepSnapshots := map[string]bool{}
	for _, snap := range s.Snapshots {
		keepSnapshots[filepath.Base(d.snapshotPath(snap))] = true
	}
	for _, orphans := range []struct {
		dir    string
		prefix string
		keep   map[string]bool
	}{
		{filepath.Join(d.root, volumesDir), "vol-", keepVolumes},
		{filepath.Join(d.root, snapshotsDir), "snap-", keepSnapshots},
	} {
		entries, err := os.ReadDir(orphans.dir)
		if err != nil {
			return nil, fmt.Errorf("list %s: %w", orphans.dir, err)
		}
		for _, e := range entries {
			if orphans.keep[e.Name()] || !strings.HasPrefix(e.Name(), orphans.prefix) {
				continue
			}
			path := filepath.Join(orphans.dir, e.Name())
			logger.Info("Removing data that no saved state refers to", "path", path)
			if err := os.RemoveAll(path); err != nil {
				// Data that cannot go now (a mount inside it, an
				// immutable file) must not keep the driver from serving
				// the volumes it has: the next start tries again.
				logger.Error(err, "Could not remove data that no saved state refers to; the next start tries again", "path", path)
			}
		}
	}
	return s, nil
}

// Save writes the state to <root>/state.json atomically (see state.Save).
func (d *Dir) Save(s *state.State) error { return state.Save(d.StatePath(), s) }

// CreateVolume creates the volume's directory or sparse file, filled from
// src. A block volume is grown (sparsely) to v.CapacityBytes when its
// source is smaller.
func (d *Dir) CreateVolume(v *state.Volume, src Source) (err error) {
	path := d.volumePath(v)
	defer func() {
		if err != nil {
			_ = os.RemoveAll(path)
		}
	}()
	var from string
	switch {
	case src.Volume != nil:
		from = d.volumePath(src.Volume)
	case src.Snapshot != nil:
		from = d.snapshotPath(src.Snapshot)
	}
	if v.AccessType == state.Block {
		if from != "" {
			if err := copyFile(from, path); err != nil {
				return fmt.Errorf("fill volume %s: %w", v.ID, err)
			}
		}
		return makeSparseFile(path, v.CapacityBytes)
	}
	if from != "" {
		if err := copyTree(from, path); err != nil {
			return fmt.Errorf("fill volume %s: %w", v.ID, err)
		}
	} else if err := os.Mkdir(path, 0o777); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("create volume %s: %w", v.ID, err)
	}
	// Mkdir is subject to the umask; the volume must stay writable for
	// workloads whatever the driver's umask is.
	if err := os.Chmod(path, 0o777); err != nil {
		return fmt.Errorf("create volume %s: %w", v.ID, err)
	}
	return syncDir(filepath.Dir(path))
}

// DeleteVolume removes the volume's directory or file.
func (d *Dir) DeleteVolume(v *state.Volume) error {
	if err := os.RemoveAll(d.volumePath(v)); err != nil {
		return fmt.Errorf("delete volume %s: %w", v.ID, err)
	}
	return nil
}

// CreateSnapshot copies the volume's directory or file.
func (d *Dir) CreateSnapshot(snap *state.Snapshot, from *state.Volume) (err error) {
	path := d.snapshotPath(snap)
	defer func() {
		if err != nil {
			_ = os.RemoveAll(path)
		}
	}()
	if from.AccessType == state.Block {
		err = copyFile(d.volumePath(from), path)
	} else {
		err = copyTree(d.volumePath(from), path)
	}
	if err != nil {
		return fmt.Errorf("snapshot volume %s: %w", from.ID, err)
	}
	return syncDir(filepath.Dir(path))
}

// DeleteSnapshot removes the snapshot's copy.
func (d *Dir) DeleteSnapshot(snap *state.Snapshot) error {
	if err := os.RemoveAll(d.snapshotPath(snap)); err != nil {
		return fmt.Errorf("delete snapshot %s: %w", snap.ID, err)
	}
	return nil
}

// Publish bind-mounts the volume's directory (or file) onto target,
// read-only when readOnly is set.
func (d *Dir) Publish(v *state.Volume, target string, readOnly bool) error {
	created, err := makeTarget(target, v.AccessType == state.Block)
	if err != nil {
		return err
	}
	if err := bindMount(d.volumePath(v), target, readOnly); err != nil {
		if created {
			_ = removeTarget(target)
		}
		return err
	}
	return nil
}

// Published reports whether target is v's data bind-mounted: the same
// file (device and inode) as v's directory, or block file.
func (d *Dir) Published(v *state.Volume, target string) (bool, error) {
	t, err := os.Stat(target)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	data, err := os.Stat(d.volumePath(v))
	if err != nil {
		return false, err
	}
	return os.SameFile(t, data), nil
}

// Unpublish unmounts target and removes it. It never removes anything
// through a mount: if the unmount fails, target stays.
func (d *Dir) Unpublish(_ *state.Volume, target string) error {
	if err := unmount(target); err != nil {
		return err
	}
	return removeTarget(target)
}

// Check reports a layout directory that is missing or is not a
// directory: the root's storage was unmounted (an empty mount point is
// left) or removed, and every call would fail. NewDir created them all.
func (d *Dir) Check() error {
	for _, dir := range d.layout() {
		fi, err := os.Stat(dir)
		if err != nil {
			return fmt.Errorf("dir backend storage is gone: %w", err)
		}
		if !fi.IsDir() {
			return fmt.Errorf("dir backend storage is gone: %s is not a directory", dir)
		}
	}
	return nil
}

func (d *Dir) volumePath(v *state.Volume) string {
	name := v.ID
	if v.AccessType == state.Block {
		name += blockSuffix
	}
	return filepath.Join(d.root, volumesDir, name)
}

func (d *Dir) snapshotPath(s *state.Snapshot) string {
	name := s.ID
	if s.AccessType == state.Block {
		name += blockSuffix
	}
	return filepath.Join(d.root, snapshotsDir, name)
}

// makeTarget creates a publish target: a directory, or an empty file for
// a block volume. An existing target of the right kind is reused; created
// reports whether this call made it.
func makeTarget(target string, block bool) (created bool, err error) {
	fi, err := os.Stat(target)
	switch {
	case err == nil:
		if fi.IsDir() == block {
			return false, fmt.Errorf("target path %s exists and is not a %s", target, map[bool]string{true: "file", false: "directory"}[block])
		}
		return false, nil
	case !errors.Is(err, fs.ErrNotExist):
		return false, fmt.Errorf("check target path: %w", err)
	}
	if block {
		f, err := os.OpenFile(target, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o640)
		if err != nil {
			return false, fmt.Errorf("create target file: %w", err)
		}
		if err := f.Close(); err != nil {
			return false, fmt.Errorf("create target file: %w", err)
		}
		return true, nil
	}
	if err := os.Mkdir(target, 0o750); err != nil {
		return false, fmt.Errorf("create target directory: %w", err)
	}
	return true, nil
}

// removeTarget removes a target that is no longer mounted. It uses
// os.Remove, never RemoveAll: a directory that still has content is an
// error, not something to wipe.
func removeTarget(target string) error {
	if err := os.Remove(target); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove target path: %w", err)
	}
	return nil
}
