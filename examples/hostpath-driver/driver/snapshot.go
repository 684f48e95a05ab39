package driver

import (
	"context"
	"maps"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
	"k8s.io/klog/v2"

	"github.com/kube-storage/csi-provisioner/examples/hostpath-driver/state"
)

// CreateSnapshot copies a volume into a snapshot that is ready to use at
// once. It is idempotent by name: the same name and source volume return
// the existing snapshot, another source volume is ALREADY_EXISTS.
func (d *Driver) CreateSnapshot(ctx context.Context, req *csi.CreateSnapshotRequest) (*csi.CreateSnapshotResponse, error) {
	if err := checkName("snapshot", req.GetName()); err != nil {
		return nil, err
	}
	if req.GetSourceVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "source_volume_id is required")
	}
	if err := d.lock(); err != nil {
		return nil, err
	}
	defer d.mu.Unlock()
	if s := d.snapshotsByName[req.GetName()]; s != nil {
		if s.SourceVolumeID != req.GetSourceVolumeId() {
			return nil, status.Errorf(codes.AlreadyExists, "snapshot %q exists (%s) with source volume %s, not %s", s.Name, s.ID, s.SourceVolumeID, req.GetSourceVolumeId())
		}
		return &csi.CreateSnapshotResponse{Snapshot: csiSnapshot(s)}, nil
	}
	v := d.st.Volumes[req.GetSourceVolumeId()]
	if v == nil {
		return nil, status.Errorf(codes.NotFound, "source volume %q not found", req.GetSourceVolumeId())
	}
	s := &state.Snapshot{
		ID:             d.newSnapshotIDLocked(),
		Name:           req.GetName(),
		SourceVolumeID: v.ID,
		SizeBytes:      v.CapacityBytes,
		AccessType:     v.AccessType,
		Parameters:     maps.Clone(req.GetParameters()),
		CreatedAt:      time.Now().UTC(),
	}
	if err := d.backend.CreateSnapshot(s, v); err != nil {
		return nil, status.Errorf(codes.Internal, "create snapshot %q: %v", s.Name, err)
	}
	d.st.Snapshots[s.ID] = s
	d.snapshotsByName[s.Name] = s
	if err := d.commitLocked(func() {
		delete(d.st.Snapshots, s.ID)
		delete(d.snapshotsByName, s.Name)
		_ = d.backend.DeleteSnapshot(s)
	}); err != nil {
		return nil, err
	}
	klog.FromContext(ctx).V(2).Info("Created snapshot", "name", s.Name, "snapshotID", s.ID, "volumeID", v.ID)
	return &csi.CreateSnapshotResponse{Snapshot: csiSnapshot(s)}, nil
}

// DeleteSnapshot deletes a snapshot. It is idempotent: an unknown
// snapshot ID is success. Volumes restored from the snapshot are
// independent copies and stay.
func (d *Driver) DeleteSnapshot(ctx context.Context, req *csi.DeleteSnapshotRequest) (*csi.DeleteSnapshotResponse, error) {
	if req.GetSnapshotId() == "" {
		return nil, status.Error(codes.InvalidArgument, "snapshot_id is required")
	}
	if err := d.lock(); err != nil {
		return nil, err
	}
	defer d.mu.Unlock()
	s := d.st.Snapshots[req.GetSnapshotId()]
	if s == nil {
		return &csi.DeleteSnapshotResponse{}, nil
	}
	delete(d.st.Snapshots, s.ID)
	delete(d.snapshotsByName, s.Name)
	if err := d.commitLocked(func() {
		d.st.Snapshots[s.ID] = s
		d.snapshotsByName[s.Name] = s
	}); err != nil {
		return nil, err
	}
	if err := d.backend.DeleteSnapshot(s); err != nil {
		klog.FromContext(ctx).Error(err, "Snapshot deleted but its data was not freed; the dir backend removes it on the next start", "snapshotID", s.ID)
	}
	klog.FromContext(ctx).V(2).Info("Deleted snapshot", "name", s.Name, "snapshotID", s.ID)
	return &csi.DeleteSnapshotResponse{}, nil
}

// ListSnapshots lists snapshots in ID order, filtered by snapshot_id and
// source_volume_id, with the same pagination as ListVolumes.
func (d *Driver) ListSnapshots(_ context.Context, req *csi.ListSnapshotsRequest) (*csi.ListSnapshotsResponse, error) {
	if err := d.lock(); err != nil {
		return nil, err
	}
	defer d.mu.Unlock()
	var ids []string
	for id, s := range d.st.Snapshots {
		if req.GetSnapshotId() != "" && id != req.GetSnapshotId() {
			continue
		}
		if req.GetSourceVolumeId() != "" && s.SourceVolumeID != req.GetSourceVolumeId() {
			continue
		}
		ids = append(ids, id)
	}
	page, next, err := paginate(ids, req.GetStartingToken(), req.GetMaxEntries(), snapshotIDRE)
	if err != nil {
		return nil, err
	}
	resp := &csi.ListSnapshotsResponse{NextToken: next, Entries: make([]*csi.ListSnapshotsResponse_Entry, 0, len(page))}
	for _, id := range page {
		resp.Entries = append(resp.Entries, &csi.ListSnapshotsResponse_Entry{Snapshot: csiSnapshot(d.st.Snapshots[id])})
	}
	return resp, nil
}

func csiSnapshot(s *state.Snapshot) *csi.Snapshot {
	return &csi.Snapshot{
		SnapshotId:     s.ID,
		SourceVolumeId: s.SourceVolumeID,
		SizeBytes:      s.SizeBytes,
		CreationTime:   timestamppb.New(s.CreatedAt),
		ReadyToUse:     true,
	}
}

func (d *Driver) newSnapshotIDLocked() string {
	for {
		if id := newID(snapshotIDPrefix); d.st.Snapshots[id] == nil {
			return id
		}
	}
}
