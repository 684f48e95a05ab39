package backend

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/kube-storage/csi-provisioner/examples/hostpath-driver/state"
)

// FuzzDirLoad loads a state.json of any content over a root holding the
// data of two volumes and a snapshot. Load must not panic; on error it must
// have removed nothing; on success every entry must be a real record under
// its own ID, and the data of every volume and snapshot the state keeps
// must still be there (a corrupt entry must not get another's data removed
// as an orphan).
func FuzzDirLoad(f *testing.F) {
	for _, seed := range []string{
		`{"version":1}`,
		`{"version":1,"volumes":{"vol-a":{"id":"vol-a","name":"a","accessType":"mount"},"vol-b":{"id":"vol-b","name":"b","accessType":"block"}},"snapshots":{"snap-c":{"id":"snap-c","sourceVolumeID":"vol-a","accessType":"mount"}}}`,
		`{"version":1,"volumes":{"vol-a":{"id":"vol-a","name":"a"}},"publications":{"/t":{"targetPath":"/t","volumeID":"vol-a"}}}`,
		`{"version":2}`,
		`{"version":1,"volu`,
		``,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		d, err := NewDir(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		existing := []string{
			filepath.Join(d.root, volumesDir, "vol-a"),
			filepath.Join(d.root, volumesDir, "vol-b"+blockSuffix),
			filepath.Join(d.root, snapshotsDir, "snap-c"),
		}
		for _, p := range existing {
			if filepath.Ext(p) == blockSuffix {
				err = os.WriteFile(p, nil, 0o600)
			} else {
				err = os.Mkdir(p, 0o750)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(d.StatePath(), data, 0o600); err != nil {
			t.Fatal(err)
		}

		s, err := d.Load(t.Context())
		if err != nil {
			for _, p := range existing {
				if _, statErr := os.Stat(p); statErr != nil {
					t.Errorf("Load failed (%v) but removed %s", err, p)
				}
			}
			return
		}
		existed := func(p string) bool { return slices.Contains(existing, p) }
		for id, v := range s.Volumes {
			if v == nil || v.ID != id {
				t.Fatalf("volume %q loaded as %+v", id, v)
			}
			if p := d.volumePath(v); existed(p) {
				if _, err := os.Stat(p); err != nil {
					t.Errorf("volume %q kept in the state lost its data: %v", id, err)
				}
			}
		}
		for id, snap := range s.Snapshots {
			if snap == nil || snap.ID != id {
				t.Fatalf("snapshot %q loaded as %+v", id, snap)
			}
			if p := d.snapshotPath(snap); existed(p) {
				if _, err := os.Stat(p); err != nil {
					t.Errorf("snapshot %q kept in the state lost its data: %v", id, err)
				}
			}
		}
		for target, p := range s.Publications {
			if p == nil || p.TargetPath != target {
				t.Fatalf("publication %q loaded as %+v", target, p)
			}
		}
		if s.Version != state.FormatVersion {
			t.Errorf("loaded version %d", s.Version)
		}
	})
}
