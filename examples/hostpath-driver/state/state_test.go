package state

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func sample() *State {
	s := New()
	created := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	s.Volumes["vol-1"] = &Volume{
		ID: "vol-1", Name: "pvc-1", CapacityBytes: 1 << 30, AccessType: Mount,
		Parameters: map[string]string{"type": "fast"}, SecretKeys: []string{"a", "b"},
		Attachment: &Attachment{NodeID: "node-1"}, CreatedAt: created,
	}
	s.Volumes["vol-2"] = &Volume{ID: "vol-2", Name: "pvc-2", CapacityBytes: 5, AccessType: Block, Source: &Source{SnapshotID: "snap-1"}, CreatedAt: created}
	s.Snapshots["snap-1"] = &Snapshot{ID: "snap-1", Name: "s", SourceVolumeID: "vol-1", SizeBytes: 1 << 30, AccessType: Mount, CreatedAt: created}
	s.Publications["/t"] = &Publication{TargetPath: "/t", VolumeID: "vol-1", ReadOnly: true, AccessMode: "SINGLE_NODE_WRITER"}
	return s
}

func TestSaveLoad(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.json")
	want := sample()
	if err := Save(path, want); err != nil {
		t.Fatal(err)
	}
	got, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Load after Save:\n got %+v\nwant %+v", got, want)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("state file mode %v (%v), want 0600", fi.Mode(), err)
	}
	entries, err := os.ReadDir(filepath.Dir(path))
	if err != nil || len(entries) != 1 {
		t.Errorf("directory holds %v (%v), want only state.json: no temporary files left", entries, err)
	}
}

func TestLoad(t *testing.T) {
	tests := []struct {
		name    string
		content *string // nil: no file
		wantErr string
		wantLen int
	}{
		{name: "missing file is a first start"},
		{name: "empty maps", content: ptr(`{"version":1}`)},
		{name: "one volume", content: ptr(`{"version":1,"volumes":{"v":{"id":"v","name":"n"}}}`), wantLen: 1},
		{name: "other version", content: ptr(`{"version":2}`), wantErr: "format version 2"},
		{name: "torn file", content: ptr(`{"version":1,"volu`), wantErr: "parse state"},
		{name: "null volume", content: ptr(`{"version":1,"volumes":{"v":null}}`), wantErr: `volume "v"`},
		{name: "volume under another key", content: ptr(`{"version":1,"volumes":{"v":{"id":"w"}}}`), wantErr: `volume "v"`},
		{name: "volume id not a file name", content: ptr(`{"version":1,"volumes":{"../v":{"id":"../v"}}}`), wantErr: `volume "../v"`},
		{name: "empty volume id", content: ptr(`{"version":1,"volumes":{"":{"id":""}}}`), wantErr: `volume ""`},
		{name: "null snapshot", content: ptr(`{"version":1,"snapshots":{"s":null}}`), wantErr: `snapshot "s"`},
		{name: "snapshot under another key", content: ptr(`{"version":1,"snapshots":{"s":{"id":"t"}}}`), wantErr: `snapshot "s"`},
		{name: "null publication", content: ptr(`{"version":1,"publications":{"/t":null}}`), wantErr: `publication "/t"`},
		{name: "publication under another path", content: ptr(`{"version":1,"publications":{"/t":{"targetPath":"/u"}}}`), wantErr: `publication "/t"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "state.json")
			if tt.content != nil {
				if err := os.WriteFile(path, []byte(*tt.content), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			s, err := Load(path)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Load: %v, want an error with %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if s.Volumes == nil || s.Snapshots == nil || s.Publications == nil {
				t.Error("Load returned nil maps")
			}
			if len(s.Volumes) != tt.wantLen {
				t.Errorf("%d volumes, want %d", len(s.Volumes), tt.wantLen)
			}
		})
	}
}

func TestCleanTemp(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.json")
	if err := Save(path, sample()); err != nil {
		t.Fatal(err)
	}
	// What a crash between CreateTemp and Rename leaves behind.
	for _, name := range []string{"state.json.tmp-123", "state.json.tmp-456"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("{"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "unrelated"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := CleanTemp(path); err != nil {
		t.Fatal(err)
	}
	var names []string
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if strings.Join(names, ",") != "state.json,unrelated" {
		t.Errorf("after CleanTemp: %v, want state.json and unrelated", names)
	}
	if _, err := Load(path); err != nil {
		t.Errorf("state unreadable after CleanTemp: %v", err)
	}
}

func ptr(s string) *string { return &s }

// TestSaveDirectoryFsyncFails covers a failed fsync of the directory after
// the rename: the new state is then what a restart loads, so Save must not
// report it as "previous state kept" (the driver would undo a change that
// is on disk, e.g. free the data of a volume the state names) but wrap
// ErrNotDurable.
func TestSaveDirectoryFsyncFails(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.json")
	if err := Save(path, New()); err != nil {
		t.Fatal(err)
	}
	failed := errors.New("EIO")
	tests := []struct {
		name        string
		failDir     bool // the directory's fsync fails, else the temporary file's
		wantDurable bool // the error wraps ErrNotDurable
		wantVolumes int  // what Load then reads
	}{
		{name: "file fsync fails: the old state stays", failDir: false, wantVolumes: 0},
		{name: "directory fsync fails: the new state is in place", failDir: true, wantDurable: true, wantVolumes: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := Save(path, New()); err != nil {
				t.Fatal(err)
			}
			fsync = func(f *os.File) error {
				if fi, err := f.Stat(); err == nil && fi.IsDir() == tt.failDir {
					return failed
				}
				return f.Sync()
			}
			t.Cleanup(func() { fsync = (*os.File).Sync })
			err := Save(path, sample())
			if !errors.Is(err, failed) {
				t.Fatalf("Save: %v, want the fsync error", err)
			}
			if got := errors.Is(err, ErrNotDurable); got != tt.wantDurable {
				t.Errorf("Save: %v; wraps ErrNotDurable = %t, want %t", err, got, tt.wantDurable)
			}
			s, err := Load(path)
			if err != nil {
				t.Fatal(err)
			}
			if len(s.Volumes) != tt.wantVolumes {
				t.Errorf("Load after the failed Save: %d volumes, want %d", len(s.Volumes), tt.wantVolumes)
			}
		})
	}
}
