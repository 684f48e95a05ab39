// Package backend stores the data behind the hostpath example driver's
// volumes and snapshots, and persists the driver's state.
//
// Two implementations sit behind the one Backend interface:
//
//   - Dir keeps every volume as a directory (mount volumes) or a sparse file
//     (block volumes) under a root directory, snapshots as copies next to
//     them, and the driver's state in <root>/state.json, written atomically.
//     It publishes volumes with bind mounts, which needs root or
//     CAP_SYS_ADMIN.
//   - Memory keeps nothing at all: no data, no state file, no mounts. It
//     exists for benchmarks and for running csi-sanity without privileges.
//
// Backends are not safe for concurrent use, except Check. The driver calls
// the other methods with its single mutex held, which also orders Save
// calls; it calls Check (for Probe) without it.
package backend

import (
	"context"
	"errors"

	"github.com/kube-storage/csi-provisioner/examples/hostpath-driver/state"
)

// ErrMountNotPermitted is wrapped by Publish, Unpublish and CheckBindMount
// when this process may not mount: it is not root, lacks CAP_SYS_ADMIN, or
// does not run on Linux. Retrying does not help; the driver answers
// FAILED_PRECONDITION.
var ErrMountNotPermitted = errors.New("this process may not mount (bind mounts need Linux and root or CAP_SYS_ADMIN)")

// Backend stores volume data and the driver's state. Every method that
// changes something is idempotent: calling it again after a failure or a
// crash finishes the job or reports the same error.
type Backend interface {
	// Load returns the state that the last successful Save stored, or an
	// empty state on first start. It is called once, before any other
	// method, and may tidy up data that no saved state refers to (left by
	// a crash between allocating data and saving the state).
	Load(ctx context.Context) (*state.State, error)

	// Save makes s durable before it returns. On error the previously
	// saved state is still the one on disk, except for an error that
	// wraps state.ErrNotDurable: s is then on disk (a restart loads it)
	// but a power loss may still bring back the previous state.
	Save(s *state.State) error

	// CreateVolume allocates storage for v (ID, AccessType and
	// CapacityBytes are set) and fills it from src. On error nothing is
	// left behind.
	CreateVolume(v *state.Volume, src Source) error

	// DeleteVolume frees v's storage. Data that is already gone is not an
	// error.
	DeleteVolume(v *state.Volume) error

	// CreateSnapshot copies the data of from into snap. On error nothing
	// is left behind.
	CreateSnapshot(snap *state.Snapshot, from *state.Volume) error

	// DeleteSnapshot frees snap's storage. Data that is already gone is
	// not an error.
	DeleteSnapshot(snap *state.Snapshot) error

	// Publish makes v visible at target. It creates target: a directory
	// for a mount volume, an empty file for a block volume. The parent of
	// target must exist (an error wrapping fs.ErrNotExist otherwise). An
	// error wrapping ErrMountNotPermitted means the process may not mount.
	// On error target is removed again if Publish created it.
	Publish(v *state.Volume, target string, readOnly bool) error

	// Unpublish undoes Publish: it unmounts target if needed and removes
	// it. A target that is already gone is not an error.
	Unpublish(v *state.Volume, target string) error

	// Published reports whether target shows v as Publish left it. A
	// publication recorded before a node restart is not: the mounts are
	// gone, and target is an empty directory of the node's disk.
	Published(v *state.Volume, target string) (bool, error)

	// Check reports why the backend cannot store data now (for example
	// its storage was unmounted or removed), or nil. It changes nothing,
	// is cheap enough to answer every Probe, and is safe to call
	// concurrently with any method, so that a long copy does not hold
	// up Probe.
	Check() error
}

// Source is the content to fill a new volume from: at most one field is
// set; the zero Source means an empty volume.
type Source struct {
	Volume   *state.Volume
	Snapshot *state.Snapshot
}
