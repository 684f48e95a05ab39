package driver

import (
	"context"
	"errors"
	"io/fs"
	"os"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"github.com/kube-storage/csi-provisioner/examples/hostpath-driver/backend"
	"github.com/kube-storage/csi-provisioner/examples/hostpath-driver/state"
)

// NodeGetInfo reports the node ID and, with topology, the node's topology.
func (d *Driver) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	resp := &csi.NodeGetInfoResponse{NodeId: d.cfg.NodeID}
	if d.cfg.EnableTopology {
		resp.AccessibleTopology = d.nodeTopology()
	}
	return resp, nil
}

// NodeGetCapabilities reports SINGLE_NODE_MULTI_WRITER when enabled. The
// driver has no staging step, volume stats or expansion.
func (d *Driver) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	resp := &csi.NodeGetCapabilitiesResponse{}
	if d.cfg.SingleNodeMultiWriter {
		resp.Capabilities = append(resp.Capabilities, &csi.NodeServiceCapability{Type: &csi.NodeServiceCapability_Rpc{
			Rpc: &csi.NodeServiceCapability_RPC{Type: csi.NodeServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER},
		}})
	}
	return resp, nil
}

// NodePublishVolume makes a volume available at target_path: the dir
// backend bind-mounts it (a directory, or a file for a block volume), the
// memory backend only creates the path. It is idempotent for the same
// target and flags; other flags at the same target are ALREADY_EXISTS. A
// SINGLE_NODE_SINGLE_WRITER volume published elsewhere is
// FAILED_PRECONDITION, as is a process that may not mount and, with
// attach enabled, a volume not ControllerPublished to this node.
func (d *Driver) NodePublishVolume(ctx context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_id is required")
	}
	if req.GetTargetPath() == "" {
		return nil, status.Error(codes.InvalidArgument, "target_path is required")
	}
	at, err := d.checkCapability(req.GetVolumeCapability())
	if err != nil {
		return nil, err
	}
	mode := req.GetVolumeCapability().GetAccessMode().GetMode()
	readOnly := req.GetReadonly() || readOnlyMode(mode)
	target := req.GetTargetPath()

	if err := d.lock(); err != nil {
		return nil, err
	}
	defer d.mu.Unlock()
	v := d.st.Volumes[req.GetVolumeId()]
	if v == nil {
		return nil, status.Errorf(codes.NotFound, "volume %q not found", req.GetVolumeId())
	}
	if at != v.AccessType {
		return nil, status.Errorf(codes.InvalidArgument, "volume %s is a %s volume, the capability asks for %s", v.ID, v.AccessType, at)
	}
	if d.cfg.EnableAttach && (v.Attachment == nil || v.Attachment.NodeID != d.cfg.NodeID) {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s is not ControllerPublished to node %q", v.ID, d.cfg.NodeID)
	}
	if p := d.st.Publications[target]; p != nil {
		if p.VolumeID != v.ID || p.ReadOnly != readOnly || p.AccessMode != mode.String() {
			return nil, status.Errorf(codes.AlreadyExists, "target %s already holds volume %s (readonly=%t, %s)", target, p.VolumeID, p.ReadOnly, p.AccessMode)
		}
		published, err := d.backend.Published(v, target)
		if err != nil {
			return nil, status.Errorf(codes.Internal, "check target %s of volume %s: %v", target, v.ID, err)
		}
		if !published {
			// Recorded, but the node restarted since and its mounts are
			// gone: answering OK would give the pod an empty directory of
			// the node's disk instead of its volume.
			if err := d.backend.Publish(v, target, readOnly); err != nil {
				return nil, publishError(v.ID, target, err)
			}
			klog.FromContext(ctx).Info("Published volume again: its target had lost it (the node restarted?)", "volumeID", v.ID, "target", target)
		}
		return &csi.NodePublishVolumeResponse{}, nil
	}
	for _, p := range d.st.Publications {
		if p.VolumeID != v.ID {
			continue
		}
		if mode == csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER ||
			p.AccessMode == csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER.String() {
			return nil, status.Errorf(codes.FailedPrecondition, "volume %s is published at %s and SINGLE_NODE_SINGLE_WRITER allows only one target", v.ID, p.TargetPath)
		}
	}
	if err := d.backend.Publish(v, target, readOnly); err != nil {
		return nil, publishError(v.ID, target, err)
	}
	d.st.Publications[target] = &state.Publication{TargetPath: target, VolumeID: v.ID, ReadOnly: readOnly, AccessMode: mode.String()}
	if err := d.commitLocked(func() {
		delete(d.st.Publications, target)
		_ = d.backend.Unpublish(v, target)
	}); err != nil {
		return nil, err
	}
	klog.FromContext(ctx).V(2).Info("Published volume", "volumeID", v.ID, "target", target, "readOnly", readOnly)
	return &csi.NodePublishVolumeResponse{}, nil
}

// publishError is the gRPC error of a failed Publish of volume id at
// target.
func publishError(id, target string, err error) error {
	switch {
	case errors.Is(err, backend.ErrMountNotPermitted):
		return status.Errorf(codes.FailedPrecondition, "publish volume %s: %v", id, err)
	case errors.Is(err, fs.ErrNotExist):
		return status.Errorf(codes.FailedPrecondition, "publish volume %s: the parent directory of %s must exist: %v", id, target, err)
	default:
		return status.Errorf(codes.Internal, "publish volume %s: %v", id, err)
	}
}

// NodeUnpublishVolume undoes NodePublishVolume and removes target_path.
// It is idempotent: a target that does not exist is success. A target
// the state does not record is still unmounted and removed: a driver
// killed between the mount and saving the publication left it mounted.
func (d *Driver) NodeUnpublishVolume(ctx context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_id is required")
	}
	if req.GetTargetPath() == "" {
		return nil, status.Error(codes.InvalidArgument, "target_path is required")
	}
	target := req.GetTargetPath()
	if err := d.lock(); err != nil {
		return nil, err
	}
	defer d.mu.Unlock()
	p := d.st.Publications[target]
	if p == nil {
		if _, err := os.Lstat(target); errors.Is(err, fs.ErrNotExist) {
			return &csi.NodeUnpublishVolumeResponse{}, nil
		}
		// Not recorded, but NodePublish may have mounted it and then
		// died before it saved the publication: unmount and remove the
		// target all the same.
		if err := d.backend.Unpublish(&state.Volume{ID: req.GetVolumeId()}, target); err != nil {
			return nil, unpublishError(req.GetVolumeId(), target, err)
		}
		return &csi.NodeUnpublishVolumeResponse{}, nil
	}
	if p.VolumeID != req.GetVolumeId() {
		return nil, status.Errorf(codes.FailedPrecondition, "target %s holds volume %s, not %s", target, p.VolumeID, req.GetVolumeId())
	}
	// The volume record may be gone only if state was edited by hand;
	// Unpublish then still unmounts and removes the target.
	v := d.st.Volumes[p.VolumeID]
	if v == nil {
		v = &state.Volume{ID: p.VolumeID}
	}
	if err := d.backend.Unpublish(v, target); err != nil {
		return nil, unpublishError(p.VolumeID, target, err)
	}
	delete(d.st.Publications, target)
	if err := d.commitLocked(func() {
		// The target is unmounted and gone; keeping the record makes a
		// retry unpublish (idempotently) and save again.
		d.st.Publications[target] = p
	}); err != nil {
		return nil, err
	}
	klog.FromContext(ctx).V(2).Info("Unpublished volume", "volumeID", p.VolumeID, "target", target)
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

// unpublishError converts an error of Backend.Unpublish.
func unpublishError(volumeID, target string, err error) error {
	code := codes.Internal
	if errors.Is(err, backend.ErrMountNotPermitted) {
		code = codes.FailedPrecondition
	}
	return status.Errorf(code, "unpublish volume %s from %s: %v", volumeID, target, err)
}
