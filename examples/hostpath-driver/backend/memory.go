package backend

import (
	"context"
	"errors"
	"io/fs"
	"os"

	"github.com/kube-storage/csi-provisioner/examples/hostpath-driver/state"
)

// Memory is a Backend without storage: volumes and snapshots have no data,
// state lives only in the driver's memory and is lost on exit, and Publish
// only creates the target path. It never blocks and never fails except
// when the target path cannot be created.
type Memory struct{}

var _ Backend = Memory{}

// NewMemory returns a Memory backend.
func NewMemory() Memory { return Memory{} }

// Load returns an empty state.
func (Memory) Load(context.Context) (*state.State, error) { return state.New(), nil }

// Save does nothing.
func (Memory) Save(*state.State) error { return nil }

// CreateVolume does nothing.
func (Memory) CreateVolume(*state.Volume, Source) error { return nil }

// DeleteVolume does nothing.
func (Memory) DeleteVolume(*state.Volume) error { return nil }

// CreateSnapshot does nothing.
func (Memory) CreateSnapshot(*state.Snapshot, *state.Volume) error { return nil }

// DeleteSnapshot does nothing.
func (Memory) DeleteSnapshot(*state.Snapshot) error { return nil }

// Check never fails: there is no storage to lose.
func (Memory) Check() error { return nil }

// Publish creates target (a directory, or a file for a block volume) and
// mounts nothing.
func (Memory) Publish(v *state.Volume, target string, _ bool) error {
	_, err := makeTarget(target, v.AccessType == state.Block)
	return err
}

// Published reports whether target exists: it mounts nothing.
func (Memory) Published(_ *state.Volume, target string) (bool, error) {
	_, err := os.Lstat(target)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	return err == nil, err
}

// Unpublish removes target.
func (Memory) Unpublish(_ *state.Volume, target string) error {
	return removeTarget(target)
}
