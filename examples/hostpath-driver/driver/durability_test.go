package driver

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/kube-storage/csi-provisioner/examples/hostpath-driver/backend"
	"github.com/kube-storage/csi-provisioner/examples/hostpath-driver/state"
)

// diskBackend is a Memory backend that keeps a copy of what Save wrote
// (what a restart would load) and which volumes have data. With
// notDurable set, Save writes and then fails the way state.Save does when
// the fsync of the directory fails after the rename.
type diskBackend struct {
	backend.Memory
	notDurable bool
	saves      int
	disk       *state.State
	data       map[string]bool
}

var _ backend.Backend = (*diskBackend)(nil)

func (b *diskBackend) Save(s *state.State) error {
	raw, err := json.Marshal(s)
	if err != nil {
		return err
	}
	b.disk = state.New()
	if err := json.Unmarshal(raw, b.disk); err != nil {
		return err
	}
	b.saves++
	if b.notDurable {
		return fmt.Errorf("fsync directory: input/output error: %w", state.ErrNotDurable)
	}
	return nil
}

func (b *diskBackend) CreateVolume(v *state.Volume, _ backend.Source) error {
	b.data[v.ID] = true
	return nil
}

func (b *diskBackend) DeleteVolume(v *state.Volume) error {
	delete(b.data, v.ID)
	return nil
}

// checkDisk fails the test when the saved state names a volume without
// data: a restart would load a volume that cannot be published.
func (b *diskBackend) checkDisk(t *testing.T) {
	t.Helper()
	for id := range b.disk.Volumes {
		if !b.data[id] {
			t.Errorf("the saved state names volume %s, whose data was freed", id)
		}
	}
}

// TestSaveNotDurableKeepsChange covers a save whose new state reached the
// disk but may not be durable (state.ErrNotDurable). The change must be
// kept, not undone (a restart loads it), and the call must answer with a
// code the CO retries; the retry saves again before it acknowledges.
func TestSaveNotDurableKeepsChange(t *testing.T) {
	b := &diskBackend{data: map[string]bool{}}
	d := newTestDriver(t, nil, WithBackend(b))
	kept := mustCreate(t, d, createReq("kept", gi)).GetVolumeId()

	b.notDurable = true
	_, err := d.CreateVolume(t.Context(), createReq("new", gi))
	wantCode(t, err, codes.Unavailable)
	b.checkDisk(t)
	var onDisk string
	for id, v := range b.disk.Volumes {
		if v.Name == "new" {
			onDisk = id
		}
	}
	if onDisk == "" {
		t.Fatal("the saved state does not name the new volume")
	}
	// Nothing answers from a state that is not durable.
	_, err = d.ListVolumes(t.Context(), &csi.ListVolumesRequest{})
	wantCode(t, err, codes.Unavailable)

	b.notDurable = false
	saves := b.saves
	if got := mustCreate(t, d, createReq("new", gi)).GetVolumeId(); got != onDisk {
		t.Errorf("retried CreateVolume returned %s, want %s, the volume the saved state names", got, onDisk)
	}
	if b.saves != saves+1 {
		t.Errorf("the retried CreateVolume saved %d times, want 1: it must not acknowledge a state that is not durable", b.saves-saves)
	}

	b.notDurable = true
	_, err = d.DeleteVolume(t.Context(), &csi.DeleteVolumeRequest{VolumeId: kept})
	wantCode(t, err, codes.Unavailable)
	if !b.data[kept] {
		t.Error("DeleteVolume freed the data before the deletion was durable")
	}
	if b.disk.Volumes[kept] != nil {
		t.Error("the saved state still names the deleted volume")
	}
	b.notDurable = false
	saves = b.saves
	if _, err := d.DeleteVolume(t.Context(), &csi.DeleteVolumeRequest{VolumeId: kept}); err != nil {
		t.Fatalf("retried DeleteVolume: %v", err)
	}
	if b.saves != saves+1 {
		t.Errorf("the retried DeleteVolume saved %d times, want 1", b.saves-saves)
	}
	if ids := volumeIDs(t, d); len(ids) != 1 || ids[onDisk] != gi {
		t.Errorf("volumes %v, want only %s", ids, onDisk)
	}
	b.checkDisk(t)
}
