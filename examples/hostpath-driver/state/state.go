// Package state holds what the hostpath example driver remembers about its
// volumes, snapshots and publications, and writes it to disk so that an
// acknowledged change survives a crash.
//
// The types are plain data. They carry no locks: the driver guards a State
// with its own mutex, and Save and Load are called with that mutex held.
package state

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// ErrNotDurable is wrapped by the error of Save and WriteFileAtomic when
// the new file is in place but the fsync of its directory failed. Readers,
// and the process after a restart, see the new content; a power loss may
// bring back the old one. The caller must therefore treat the write as
// done (not undo the change it saved) and must not acknowledge that
// change until a later write succeeds.
var ErrNotDurable = errors.New("the new file is in place but not known to be durable")

// fsync flushes f (a file or a directory) to stable storage. Tests
// replace it to make a flush fail.
var fsync = (*os.File).Sync

// FormatVersion is the version of the JSON document that Save writes.
// Load refuses any other version rather than guess.
const FormatVersion = 1

// AccessType is how a volume is presented to a workload.
type AccessType string

const (
	// Mount volumes are directories, bind-mounted onto a target directory.
	Mount AccessType = "mount"
	// Block volumes are sparse files, bind-mounted onto a target file.
	Block AccessType = "block"
)

// Volume is one provisioned volume.
type Volume struct {
	ID            string            `json:"id"`
	Name          string            `json:"name"`
	CapacityBytes int64             `json:"capacityBytes"`
	AccessType    AccessType        `json:"accessType"`
	Parameters    map[string]string `json:"parameters,omitempty"`
	// Source is the content source the volume was created from, nil for an
	// empty volume.
	Source *Source `json:"source,omitempty"`
	// SecretKeys are the sorted names (never the values) of the secrets
	// that CreateVolume received. Tests read them to check that the
	// provisioner passed the secrets a StorageClass asked for.
	SecretKeys []string `json:"secretKeys,omitempty"`
	// Attachment is set while the volume is ControllerPublished.
	Attachment *Attachment `json:"attachment,omitempty"`
	CreatedAt  time.Time   `json:"createdAt"`
}

// Source names the volume or the snapshot that a volume was filled from.
// Exactly one field is set.
type Source struct {
	VolumeID   string `json:"volumeID,omitempty"`
	SnapshotID string `json:"snapshotID,omitempty"`
}

// Attachment records a ControllerPublishVolume.
type Attachment struct {
	NodeID   string `json:"nodeID"`
	ReadOnly bool   `json:"readOnly,omitempty"`
}

// Snapshot is a point-in-time copy of a volume. It does not depend on its
// source volume: the source may be deleted while the snapshot lives on.
type Snapshot struct {
	ID             string            `json:"id"`
	Name           string            `json:"name"`
	SourceVolumeID string            `json:"sourceVolumeID"`
	SizeBytes      int64             `json:"sizeBytes"`
	AccessType     AccessType        `json:"accessType"`
	Parameters     map[string]string `json:"parameters,omitempty"`
	CreatedAt      time.Time         `json:"createdAt"`
}

// Publication records a NodePublishVolume at one target path.
type Publication struct {
	TargetPath string `json:"targetPath"`
	VolumeID   string `json:"volumeID"`
	ReadOnly   bool   `json:"readOnly,omitempty"`
	// AccessMode is the CSI access mode name, e.g. SINGLE_NODE_WRITER.
	AccessMode string `json:"accessMode"`
}

// State is everything the driver remembers. The maps are keyed by volume
// ID, snapshot ID and target path.
type State struct {
	Version      int                     `json:"version"`
	Volumes      map[string]*Volume      `json:"volumes"`
	Snapshots    map[string]*Snapshot    `json:"snapshots"`
	Publications map[string]*Publication `json:"publications"`
}

// New returns an empty State.
func New() *State {
	return &State{
		Version:      FormatVersion,
		Volumes:      map[string]*Volume{},
		Snapshots:    map[string]*Snapshot{},
		Publications: map[string]*Publication{},
	}
}

// Load reads the State that Save wrote to path. A missing file is not an
// error: it returns an empty State, as on the driver's first start.
func Load(path string) (*State, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return New(), nil
	}
	if err != nil {
		return nil, fmt.Errorf("read state: %w", err)
	}
	s := New()
	if err := json.Unmarshal(data, s); err != nil {
		return nil, fmt.Errorf("parse state %s: %w", path, err)
	}
	if s.Version != FormatVersion {
		return nil, fmt.Errorf("state %s has format version %d, this driver reads version %d", path, s.Version, FormatVersion)
	}
	// A document written by hand may lack a map; never hand out nil maps.
	if s.Volumes == nil {
		s.Volumes = map[string]*Volume{}
	}
	if s.Snapshots == nil {
		s.Snapshots = map[string]*Snapshot{}
	}
	if s.Publications == nil {
		s.Publications = map[string]*Publication{}
	}
	if err := s.check(); err != nil {
		return nil, fmt.Errorf("state %s: %w", path, err)
	}
	return s, nil
}

// check refuses entries that Save never writes: a null entry, or one filed
// under a key other than its own ID (target path). The driver files its
// data under the ID and finds records by key; a mismatch would point two
// records at one volume's data, or let the data of the volume under the key
// be removed as an orphan at start-up. An ID must be one path element: it
// names the volume's data under the root.
func (s *State) check() error {
	for key, v := range s.Volumes {
		if v == nil || v.ID != key || !pathElement(v.ID) {
			return fmt.Errorf("volume %q: the entry must be a volume whose id is its key and a file name", key)
		}
	}
	for key, snap := range s.Snapshots {
		if snap == nil || snap.ID != key || !pathElement(snap.ID) {
			return fmt.Errorf("snapshot %q: the entry must be a snapshot whose id is its key and a file name", key)
		}
	}
	for key, p := range s.Publications {
		if p == nil || p.TargetPath != key {
			return fmt.Errorf("publication %q: the entry must be a publication whose targetPath is its key", key)
		}
	}
	return nil
}

// pathElement reports whether id is usable as one file name.
func pathElement(id string) bool {
	return id != "" && id != "." && id != ".." && !strings.ContainsAny(id, "/\x00")
}

// Save writes s to path atomically and durably: when Save returns nil, a
// crash or SIGKILL at any later moment leaves either this State or a newer
// one on disk, never a torn file and never an older one.
//
// It writes a temporary file in the same directory, fsyncs it, renames it
// over path and fsyncs the directory so that the rename itself is on disk.
// On error the previous file is left in place (a stray temporary file may
// remain; Load ignores it and CleanTemp removes it), except after a failed
// fsync of the directory: the new file is then in place and the error
// wraps ErrNotDurable.
func Save(path string, s *State) error {
	s.Version = FormatVersion
	data, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return fmt.Errorf("encode state: %w", err)
	}
	return WriteFileAtomic(path, data, 0o600)
}

// tempPattern names the temporary files of WriteFileAtomic.
const tempPattern = ".tmp-*"

// WriteFileAtomic replaces path with data so that readers and crashes see
// either the old or the new content, never a mix. See Save.
func WriteFileAtomic(path string, data []byte, perm fs.FileMode) (err error) {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	tmp, err := os.CreateTemp(dir, base+tempPattern)
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			_ = tmp.Close()
			_ = os.Remove(tmp.Name())
		}
	}()
	if _, err = tmp.Write(data); err != nil {
		return fmt.Errorf("write %s: %w", tmp.Name(), err)
	}
	if err = tmp.Chmod(perm); err != nil {
		return fmt.Errorf("chmod %s: %w", tmp.Name(), err)
	}
	if err = fsync(tmp); err != nil {
		return fmt.Errorf("fsync %s: %w", tmp.Name(), err)
	}
	if err = tmp.Close(); err != nil {
		return fmt.Errorf("close %s: %w", tmp.Name(), err)
	}
	if err = os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("rename %s: %w", tmp.Name(), err)
	}
	// From here on path holds the new content, whatever fails: the caller
	// must know that this is what a restart will load.
	if serr := syncDir(dir); serr != nil {
		return fmt.Errorf("write %s: %w: %w", path, ErrNotDurable, serr)
	}
	return nil
}

// CleanTemp removes the temporary files that an interrupted
// WriteFileAtomic(path, ...) may have left behind.
func CleanTemp(path string) error {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("list temporary files of %s: %w", path, err)
	}
	prefix := base + strings.TrimSuffix(tempPattern, "*")
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), prefix) {
			continue
		}
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("remove temporary file: %w", err)
		}
	}
	return nil
}

// syncDir fsyncs a directory so that a rename or unlink in it is durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("open directory %s: %w", dir, err)
	}
	defer d.Close()
	if err := fsync(d); err != nil {
		return fmt.Errorf("fsync directory %s: %w", dir, err)
	}
	return nil
}
