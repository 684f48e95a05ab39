package driver

import (
	"context"
	"errors"
	"maps"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
	"k8s.io/klog/v2"

	"github.com/kube-storage/csi-provisioner/examples/hostpath-driver/backend"
	"github.com/kube-storage/csi-provisioner/examples/hostpath-driver/state"
)

// Volume and snapshot IDs, which are also ListVolumes and ListSnapshots
// tokens (see paginate).
const (
	volumeIDPrefix   = "vol-"
	snapshotIDPrefix = "snap-"
)

var (
	volumeIDRE   = regexp.MustCompile(`^vol-[0-9a-f]{16}$`)
	snapshotIDRE = regexp.MustCompile(`^snap-[0-9a-f]{16}$`)
)

// ControllerGetCapabilities reports the controller RPCs this driver
// implements; PUBLISH_UNPUBLISH_VOLUME and SINGLE_NODE_MULTI_WRITER depend
// on the configuration.
func (d *Driver) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	rpcs := []csi.ControllerServiceCapability_RPC_Type{
		csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME,
		csi.ControllerServiceCapability_RPC_LIST_VOLUMES,
		csi.ControllerServiceCapability_RPC_GET_CAPACITY,
		csi.ControllerServiceCapability_RPC_CREATE_DELETE_SNAPSHOT,
		csi.ControllerServiceCapability_RPC_LIST_SNAPSHOTS,
		csi.ControllerServiceCapability_RPC_CLONE_VOLUME,
	}
	if d.cfg.EnableAttach {
		rpcs = append(rpcs, csi.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME)
	}
	if d.cfg.SingleNodeMultiWriter {
		rpcs = append(rpcs, csi.ControllerServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER)
	}
	caps := make([]*csi.ControllerServiceCapability, 0, len(rpcs))
	for _, t := range rpcs {
		caps = append(caps, &csi.ControllerServiceCapability{Type: &csi.ControllerServiceCapability_Rpc{
			Rpc: &csi.ControllerServiceCapability_RPC{Type: t},
		}})
	}
	return &csi.ControllerGetCapabilitiesResponse{Capabilities: caps}, nil
}

// CreateVolume creates a volume, or returns the existing volume of the
// same name when it is compatible with the request (ALREADY_EXISTS when it
// is not). It is idempotent by name. See Faults for injected failures,
// hangs and latency; a call that the caller abandons after the work still
// leaves the volume created, and a retry returns it.
func (d *Driver) CreateVolume(ctx context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	p := d.faults.draw(opCreate)
	if p.fail {
		return nil, p.failure()
	}
	resp, err := d.createVolume(ctx, req)
	if werr := p.wait(ctx, d.stop); werr != nil {
		return nil, werr
	}
	return resp, err
}

func (d *Driver) createVolume(ctx context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	logger := klog.FromContext(ctx)
	if err := d.checkCallSecrets("CreateVolume", d.cfg.RequireCreateSecrets, req.GetSecrets()); err != nil {
		return nil, err
	}
	if err := checkName("volume", req.GetName()); err != nil {
		return nil, err
	}
	accessType, err := d.checkCapabilities(req.GetVolumeCapabilities())
	if err != nil {
		return nil, err
	}
	required, limit := req.GetCapacityRange().GetRequiredBytes(), req.GetCapacityRange().GetLimitBytes()
	if required < 0 || limit < 0 {
		return nil, status.Error(codes.InvalidArgument, "capacity_range must not be negative")
	}
	if limit > 0 && required > limit {
		return nil, status.Errorf(codes.InvalidArgument, "capacity_range required_bytes %d is larger than limit_bytes %d", required, limit)
	}
	if len(req.GetMutableParameters()) > 0 {
		return nil, status.Error(codes.InvalidArgument, "mutable_parameters need the MODIFY_VOLUME capability, which this driver does not have")
	}
	if err := checkParameters("CreateVolume", req.GetParameters(), extraCreateMetadata); err != nil {
		return nil, err
	}
	src, err := contentSource(req.GetVolumeContentSource())
	if err != nil {
		return nil, err
	}
	if d.cfg.Faults.IgnoreContentSource {
		src = nil
	}

	if err := d.lock(); err != nil {
		return nil, err
	}
	defer d.mu.Unlock()
	if v := d.volumesByName[req.GetName()]; v != nil {
		if err := d.compatible(v, req, accessType, src); err != nil {
			return nil, err
		}
		logger.V(4).Info("Volume exists and is compatible, returning it", "name", v.Name, "volumeID", v.ID)
		return &csi.CreateVolumeResponse{Volume: d.csiVolume(v)}, nil
	}
	if !d.accessible(req.GetAccessibilityRequirements()) {
		return nil, status.Errorf(codes.ResourceExhausted, "cannot provision in the requisite topology: this driver only serves node %q", d.cfg.NodeID)
	}
	content, srcSize, err := d.resolveSourceLocked(src, accessType)
	if err != nil {
		return nil, err
	}
	size, err := d.volumeSize(required, limit, srcSize)
	if err != nil {
		return nil, err
	}
	if available := d.availableBytesLocked(); size > available {
		return nil, status.Errorf(codes.ResourceExhausted, "not enough capacity: %d bytes requested, %d of %d bytes available", size, available, d.cfg.CapacityBytes)
	}
	v := &state.Volume{
		ID:            d.newVolumeIDLocked(),
		Name:          req.GetName(),
		CapacityBytes: size,
		AccessType:    accessType,
		Parameters:    maps.Clone(req.GetParameters()),
		Source:        src,
		SecretKeys:    slices.Sorted(maps.Keys(req.GetSecrets())),
		CreatedAt:     time.Now().UTC(),
	}
	if err := d.backend.CreateVolume(v, content); err != nil {
		return nil, status.Errorf(codes.Internal, "create volume %q: %v", v.Name, err)
	}
	d.addVolumeLocked(v)
	if err := d.commitLocked(func() {
		d.removeVolumeLocked(v)
		_ = d.backend.DeleteVolume(v)
	}); err != nil {
		return nil, err
	}
	logger.V(2).Info("Created volume", "name", v.Name, "volumeID", v.ID, "capacityBytes", v.CapacityBytes, "accessType", v.AccessType, "source", v.Source)
	return &csi.CreateVolumeResponse{Volume: d.csiVolume(v)}, nil
}

// contentSource converts a CreateVolume content source; nil means none.
func contentSource(cs *csi.VolumeContentSource) (*state.Source, error) {
	switch {
	case cs == nil:
		return nil, nil
	case cs.GetSnapshot() != nil:
		if cs.GetSnapshot().GetSnapshotId() == "" {
			return nil, status.Error(codes.InvalidArgument, "volume_content_source snapshot has no snapshot_id")
		}
		return &state.Source{SnapshotID: cs.GetSnapshot().GetSnapshotId()}, nil
	case cs.GetVolume() != nil:
		if cs.GetVolume().GetVolumeId() == "" {
			return nil, status.Error(codes.InvalidArgument, "volume_content_source volume has no volume_id")
		}
		return &state.Source{VolumeID: cs.GetVolume().GetVolumeId()}, nil
	default:
		return nil, status.Error(codes.InvalidArgument, "volume_content_source has an unsupported type")
	}
}

// resolveSourceLocked finds the volume or snapshot that src names
// (NOT_FOUND if it does not exist) and checks that its access type
// matches (INVALID_ARGUMENT if not). It returns the backend's Source and
// the size of the content.
func (d *Driver) resolveSourceLocked(src *state.Source, accessType state.AccessType) (backend.Source, int64, error) {
	switch {
	case src == nil:
		return backend.Source{}, 0, nil
	case src.SnapshotID != "":
		snap := d.st.Snapshots[src.SnapshotID]
		if snap == nil {
			return backend.Source{}, 0, status.Errorf(codes.NotFound, "source snapshot %q not found", src.SnapshotID)
		}
		if snap.AccessType != accessType {
			return backend.Source{}, 0, status.Errorf(codes.InvalidArgument, "source snapshot %q is a %s snapshot; cannot restore it to a %s volume", snap.ID, snap.AccessType, accessType)
		}
		return backend.Source{Snapshot: snap}, snap.SizeBytes, nil
	default:
		v := d.st.Volumes[src.VolumeID]
		if v == nil {
			return backend.Source{}, 0, status.Errorf(codes.NotFound, "source volume %q not found", src.VolumeID)
		}
		if v.AccessType != accessType {
			return backend.Source{}, 0, status.Errorf(codes.InvalidArgument, "source volume %q is a %s volume; cannot clone it to a %s volume", v.ID, v.AccessType, accessType)
		}
		return backend.Source{Volume: v}, v.CapacityBytes, nil
	}
}

// volumeSize picks the size of a new volume: required_bytes, or
// DefaultVolumeSize capped by limit_bytes and the maximum volume size
// when required_bytes is 0; never smaller than the content source.
func (d *Driver) volumeSize(required, limit, srcSize int64) (int64, error) {
	size := required
	if size == 0 {
		size = min(DefaultVolumeSize, d.cfg.MaxVolumeSize)
		if limit > 0 {
			size = min(size, limit)
		}
	}
	if size < srcSize {
		size = srcSize
		if limit > 0 && size > limit {
			return 0, status.Errorf(codes.OutOfRange, "the content source has %d bytes, more than limit_bytes %d", srcSize, limit)
		}
	}
	if size > d.cfg.MaxVolumeSize {
		return 0, status.Errorf(codes.OutOfRange, "%d bytes requested, more than the maximum volume size of %d bytes", size, d.cfg.MaxVolumeSize)
	}
	return size, nil
}

// compatible checks that the existing volume v satisfies a repeated
// CreateVolume; ALREADY_EXISTS says why not.
func (d *Driver) compatible(v *state.Volume, req *csi.CreateVolumeRequest, accessType state.AccessType, src *state.Source) error {
	required, limit := req.GetCapacityRange().GetRequiredBytes(), req.GetCapacityRange().GetLimitBytes()
	exists := func(format string, args ...any) error {
		return status.Errorf(codes.AlreadyExists, "volume %q exists (%s) but "+format, append([]any{v.Name, v.ID}, args...)...)
	}
	switch {
	case required > 0 && v.CapacityBytes < required:
		return exists("has %d bytes, less than the %d required", v.CapacityBytes, required)
	case limit > 0 && v.CapacityBytes > limit:
		return exists("has %d bytes, more than the limit of %d", v.CapacityBytes, limit)
	case v.AccessType != accessType:
		return exists("is a %s volume, not %s", v.AccessType, accessType)
	case !maps.Equal(v.Parameters, req.GetParameters()):
		return exists("was created with different parameters")
	case !sameSource(v.Source, src):
		return exists("was created from a different content source")
	case !d.accessible(req.GetAccessibilityRequirements()):
		return exists("is on node %q, outside the requisite topology", d.cfg.NodeID)
	}
	return nil
}

func sameSource(a, b *state.Source) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

// csiVolume converts v for a CreateVolume or ListVolumes answer.
func (d *Driver) csiVolume(v *state.Volume) *csi.Volume {
	out := &csi.Volume{
		VolumeId:      v.ID,
		CapacityBytes: v.CapacityBytes,
		VolumeContext: maps.Clone(v.Parameters),
	}
	switch {
	case v.Source == nil:
	case v.Source.SnapshotID != "":
		out.ContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
			Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: v.Source.SnapshotID},
		}}
	default:
		out.ContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{
			Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: v.Source.VolumeID},
		}}
	}
	if d.cfg.EnableTopology {
		out.AccessibleTopology = []*csi.Topology{d.nodeTopology()}
	}
	return out
}

func (d *Driver) usedBytesLocked() int64 { return d.usedBytes }

// availableBytesLocked is the capacity not yet handed out, never negative:
// volumes may use more than the capacity after a restart with a smaller
// --capacity, and CSI forbids a negative available_capacity (the API
// server refuses a CSIStorageCapacity with one).
func (d *Driver) availableBytesLocked() int64 {
	return max(d.cfg.CapacityBytes-d.usedBytesLocked(), 0)
}

// addVolumeLocked records v in the state, the name index and the used bytes.
func (d *Driver) addVolumeLocked(v *state.Volume) {
	d.st.Volumes[v.ID] = v
	d.volumesByName[v.Name] = v
	d.usedBytes += v.CapacityBytes
}

// removeVolumeLocked undoes addVolumeLocked.
func (d *Driver) removeVolumeLocked(v *state.Volume) {
	delete(d.st.Volumes, v.ID)
	delete(d.volumesByName, v.Name)
	d.usedBytes -= v.CapacityBytes
}

func (d *Driver) newVolumeIDLocked() string {
	for {
		if id := newID(volumeIDPrefix); d.st.Volumes[id] == nil {
			return id
		}
	}
}

// lock takes d.mu for a call that reads or changes the state. When an
// earlier commitLocked left the state on disk but not durable, it saves
// the state again first, so that no call answers from a state that a power
// loss could still undo; if that save fails, lock releases d.mu and
// returns UNAVAILABLE, which a CO retries.
func (d *Driver) lock() error {
	d.mu.Lock()
	if !d.unsynced {
		return nil
	}
	if err := d.backend.Save(d.st); err != nil {
		d.mu.Unlock()
		return status.Errorf(codes.Unavailable, "save the state of an earlier call again: %v", err)
	}
	d.unsynced = false
	return nil
}

// commitLocked saves the state after a change. When the save fails and the
// previous state is still on disk, it calls undo and returns INTERNAL:
// the call did nothing. When the new state is on disk but not known to be
// durable (state.ErrNotDurable, a failed fsync of its directory), undoing
// would be wrong, since a restart loads the new state: the change is kept,
// lock saves again before the next call answers, and the call answers
// UNAVAILABLE, so that the CO retries it and finds the change done.
func (d *Driver) commitLocked(undo func()) error {
	err := d.backend.Save(d.st)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, state.ErrNotDurable):
		d.unsynced = true
		return status.Errorf(codes.Unavailable, "save state: %v; the change is kept, retry the call", err)
	default:
		undo()
		return status.Errorf(codes.Internal, "save state: %v", err)
	}
}

// DeleteVolume deletes a volume. It is idempotent: an unknown volume ID is
// success. A volume that is ControllerPublished or NodePublished is not
// deleted (FAILED_PRECONDITION). See Faults for injected failures, hangs
// and latency; a call that the caller abandons after the work still
// leaves the volume deleted.
func (d *Driver) DeleteVolume(ctx context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	p := d.faults.draw(opDelete)
	if p.fail {
		return nil, p.failure()
	}
	err := d.deleteVolume(ctx, req)
	if werr := p.wait(ctx, d.stop); werr != nil {
		return nil, werr
	}
	if err != nil {
		return nil, err
	}
	return &csi.DeleteVolumeResponse{}, nil
}

func (d *Driver) deleteVolume(ctx context.Context, req *csi.DeleteVolumeRequest) error {
	logger := klog.FromContext(ctx)
	if err := d.checkCallSecrets("DeleteVolume", d.cfg.RequireDeleteSecrets, req.GetSecrets()); err != nil {
		return err
	}
	if req.GetVolumeId() == "" {
		return status.Error(codes.InvalidArgument, "volume_id is required")
	}
	if err := d.lock(); err != nil {
		return err
	}
	defer d.mu.Unlock()
	v := d.st.Volumes[req.GetVolumeId()]
	if v == nil {
		logger.V(4).Info("Volume does not exist, nothing to delete", "volumeID", req.GetVolumeId())
		return nil
	}
	if v.Attachment != nil {
		return status.Errorf(codes.FailedPrecondition, "volume %s is still ControllerPublished to node %q", v.ID, v.Attachment.NodeID)
	}
	if targets := d.targetsLocked(v.ID); len(targets) > 0 {
		return status.Errorf(codes.FailedPrecondition, "volume %s is still published at %v", v.ID, targets)
	}
	// Forget the volume first, then free its data: a crash in between
	// leaves data that no state refers to, which the dir backend removes
	// on the next start. The other order could resurrect a deleted volume.
	// The data stays, too, when the deletion is not durable yet.
	d.removeVolumeLocked(v)
	if err := d.commitLocked(func() { d.addVolumeLocked(v) }); err != nil {
		return err
	}
	if err := d.backend.DeleteVolume(v); err != nil {
		logger.Error(err, "Volume deleted but its data was not freed; the dir backend removes it on the next start", "volumeID", v.ID)
	}
	logger.V(2).Info("Deleted volume", "name", v.Name, "volumeID", v.ID)
	return nil
}

// targetsLocked lists the target paths where volume id is published.
func (d *Driver) targetsLocked(id string) []string {
	var targets []string
	for _, p := range d.st.Publications {
		if p.VolumeID == id {
			targets = append(targets, p.TargetPath)
		}
	}
	sort.Strings(targets)
	return targets
}

// ValidateVolumeCapabilities confirms the capabilities (and parameters)
// that volume supports, or says in Message why not.
func (d *Driver) ValidateVolumeCapabilities(_ context.Context, req *csi.ValidateVolumeCapabilitiesRequest) (*csi.ValidateVolumeCapabilitiesResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_id is required")
	}
	if len(req.GetVolumeCapabilities()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "volume_capabilities are required")
	}
	if err := d.lock(); err != nil {
		return nil, err
	}
	defer d.mu.Unlock()
	v := d.st.Volumes[req.GetVolumeId()]
	if v == nil {
		return nil, status.Errorf(codes.NotFound, "volume %q not found", req.GetVolumeId())
	}
	for _, c := range req.GetVolumeCapabilities() {
		at, err := d.checkCapability(c)
		if err != nil {
			return &csi.ValidateVolumeCapabilitiesResponse{Message: status.Convert(err).Message()}, nil
		}
		if at != v.AccessType {
			return &csi.ValidateVolumeCapabilitiesResponse{Message: "volume " + v.ID + " is a " + string(v.AccessType) + " volume, not " + string(at)}, nil
		}
	}
	if len(req.GetParameters()) > 0 && !maps.Equal(req.GetParameters(), v.Parameters) {
		return &csi.ValidateVolumeCapabilitiesResponse{Message: "volume " + v.ID + " was created with different parameters"}, nil
	}
	return &csi.ValidateVolumeCapabilitiesResponse{Confirmed: &csi.ValidateVolumeCapabilitiesResponse_Confirmed{
		VolumeContext:      req.GetVolumeContext(),
		VolumeCapabilities: req.GetVolumeCapabilities(),
		Parameters:         req.GetParameters(),
	}}, nil
}

// ListVolumes lists volumes in volume ID order, max_entries at a time
// (all when 0). next_token is the last ID returned; a token that is not a
// volume ID is ABORTED. Volumes created or deleted between pages do not
// make a token invalid: the next page starts after the token's ID.
func (d *Driver) ListVolumes(_ context.Context, req *csi.ListVolumesRequest) (*csi.ListVolumesResponse, error) {
	if err := d.lock(); err != nil {
		return nil, err
	}
	defer d.mu.Unlock()
	ids, next, err := paginate(slices.Collect(maps.Keys(d.st.Volumes)), req.GetStartingToken(), req.GetMaxEntries(), volumeIDRE)
	if err != nil {
		return nil, err
	}
	resp := &csi.ListVolumesResponse{NextToken: next, Entries: make([]*csi.ListVolumesResponse_Entry, 0, len(ids))}
	for _, id := range ids {
		resp.Entries = append(resp.Entries, &csi.ListVolumesResponse_Entry{Volume: d.csiVolume(d.st.Volumes[id])})
	}
	return resp, nil
}

// paginate sorts ids and returns the page after token (the last ID of the
// previous page, "" for the first page) with at most max entries (all
// when 0), and the token of the next page ("" after the last page).
func paginate(ids []string, token string, maxEntries int32, valid *regexp.Regexp) (page []string, next string, err error) {
	if maxEntries < 0 {
		return nil, "", status.Errorf(codes.InvalidArgument, "max_entries %d is negative", maxEntries)
	}
	if token != "" && !valid.MatchString(token) {
		return nil, "", status.Errorf(codes.Aborted, "starting_token %q is not a token this driver issued", token)
	}
	sort.Strings(ids)
	start := sort.Search(len(ids), func(i int) bool { return ids[i] > token })
	end := len(ids)
	if maxEntries > 0 && start+int(maxEntries) < end {
		end = start + int(maxEntries)
		next = ids[end-1]
	}
	return ids[start:end], next, nil
}

// reservedPrefix starts the StorageClass parameter keys that are meant for
// the provisioner sidecar (secret references, fstype); a sidecar never
// passes them on to a driver.
const reservedPrefix = "csi.storage.k8s.io/"

// extraCreateMetadata are the keys of that namespace a sidecar started with
// --extra-create-metadata adds to CreateVolume's parameters: the claim's
// name and namespace and the PV's name. They are the driver's to read (this
// one returns them in the volume context, as every parameter), and only in
// CreateVolume.
var extraCreateMetadata = map[string]bool{
	reservedPrefix + "pvc/name":      true,
	reservedPrefix + "pvc/namespace": true,
	reservedPrefix + "pv/name":       true,
}

// checkParameters refuses parameters that a sidecar should have kept to
// itself: a driver that accepted them would depend on a sidecar bug. allowed
// are reserved keys the call may carry.
func checkParameters(call string, params map[string]string, allowed map[string]bool) error {
	for k := range params {
		if strings.HasPrefix(k, reservedPrefix) && !allowed[k] {
			return status.Errorf(codes.InvalidArgument, "%s: parameter %q is in the %s namespace, which is the sidecar's, not the driver's", call, k, reservedPrefix)
		}
	}
	return nil
}

// GetCapacity reports the bytes not yet handed out, and the largest volume
// that could be created now. It is 0 for a topology other than this node
// and for capabilities this driver does not support. The parameters do
// not change it, and keys under csi.storage.k8s.io/ are not refused here:
// upstream external-provisioner sends the class's parameters as they are
// (fstype and secret names included) for capacity tracking, and
// CreateVolume's parameters with --extra-create-metadata's keys for its
// node deployment's check; refusing them would publish no capacity.
func (d *Driver) GetCapacity(_ context.Context, req *csi.GetCapacityRequest) (*csi.GetCapacityResponse, error) {
	zero := &csi.GetCapacityResponse{AvailableCapacity: 0, MaximumVolumeSize: wrapperspb.Int64(0), MinimumVolumeSize: wrapperspb.Int64(0)}
	if d.cfg.EnableTopology && req.GetAccessibleTopology() != nil && !d.isNodeTopology(req.GetAccessibleTopology()) {
		return zero, nil
	}
	if len(req.GetVolumeCapabilities()) > 0 {
		if _, err := d.checkCapabilities(req.GetVolumeCapabilities()); err != nil {
			return zero, nil
		}
	}
	if err := d.lock(); err != nil {
		return nil, err
	}
	available := d.availableBytesLocked()
	d.mu.Unlock()
	return &csi.GetCapacityResponse{
		AvailableCapacity: available,
		MaximumVolumeSize: wrapperspb.Int64(min(d.cfg.MaxVolumeSize, available)),
		MinimumVolumeSize: wrapperspb.Int64(0),
	}, nil
}

// ControllerPublishVolume records that volume is attached to this node.
// It is idempotent; publishing again with a different readonly flag is
// ALREADY_EXISTS, an unknown volume or node NOT_FOUND. UNIMPLEMENTED
// unless attach is enabled.
func (d *Driver) ControllerPublishVolume(ctx context.Context, req *csi.ControllerPublishVolumeRequest) (*csi.ControllerPublishVolumeResponse, error) {
	if !d.cfg.EnableAttach {
		return nil, status.Error(codes.Unimplemented, "ControllerPublishVolume is disabled (--enable-attach=false)")
	}
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_id is required")
	}
	if req.GetNodeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "node_id is required")
	}
	at, err := d.checkCapability(req.GetVolumeCapability())
	if err != nil {
		return nil, err
	}
	if err := d.lock(); err != nil {
		return nil, err
	}
	defer d.mu.Unlock()
	v := d.st.Volumes[req.GetVolumeId()]
	if v == nil {
		return nil, status.Errorf(codes.NotFound, "volume %q not found", req.GetVolumeId())
	}
	if req.GetNodeId() != d.cfg.NodeID {
		return nil, status.Errorf(codes.NotFound, "node %q not found: this driver only serves node %q", req.GetNodeId(), d.cfg.NodeID)
	}
	if at != v.AccessType {
		return nil, status.Errorf(codes.InvalidArgument, "volume %s is a %s volume, the capability asks for %s", v.ID, v.AccessType, at)
	}
	if a := v.Attachment; a != nil {
		if a.ReadOnly != req.GetReadonly() {
			return nil, status.Errorf(codes.AlreadyExists, "volume %s is already published to node %q with readonly=%t", v.ID, a.NodeID, a.ReadOnly)
		}
		return &csi.ControllerPublishVolumeResponse{}, nil
	}
	v.Attachment = &state.Attachment{NodeID: req.GetNodeId(), ReadOnly: req.GetReadonly()}
	if err := d.commitLocked(func() { v.Attachment = nil }); err != nil {
		return nil, err
	}
	klog.FromContext(ctx).V(2).Info("Attached volume", "volumeID", v.ID, "node", req.GetNodeId())
	return &csi.ControllerPublishVolumeResponse{}, nil
}

// ControllerUnpublishVolume records that volume is no longer attached.
// It is idempotent: an unknown volume, or a node it is not attached to,
// is success. UNIMPLEMENTED unless attach is enabled.
func (d *Driver) ControllerUnpublishVolume(ctx context.Context, req *csi.ControllerUnpublishVolumeRequest) (*csi.ControllerUnpublishVolumeResponse, error) {
	if !d.cfg.EnableAttach {
		return nil, status.Error(codes.Unimplemented, "ControllerUnpublishVolume is disabled (--enable-attach=false)")
	}
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_id is required")
	}
	if err := d.lock(); err != nil {
		return nil, err
	}
	defer d.mu.Unlock()
	v := d.st.Volumes[req.GetVolumeId()]
	if v == nil || v.Attachment == nil || (req.GetNodeId() != "" && req.GetNodeId() != v.Attachment.NodeID) {
		return &csi.ControllerUnpublishVolumeResponse{}, nil
	}
	a := v.Attachment
	v.Attachment = nil
	if err := d.commitLocked(func() { v.Attachment = a }); err != nil {
		return nil, err
	}
	klog.FromContext(ctx).V(2).Info("Detached volume", "volumeID", v.ID, "node", a.NodeID)
	return &csi.ControllerUnpublishVolumeResponse{}, nil
}
