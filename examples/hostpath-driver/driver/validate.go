package driver

import (
	"maps"
	"slices"
	"unicode"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kube-storage/csi-provisioner/examples/hostpath-driver/state"
)

// checkName rejects an empty name or one with control characters, which
// CSI forbids in CreateVolume and CreateSnapshot names.
func checkName(what, name string) error {
	if name == "" {
		return status.Errorf(codes.InvalidArgument, "%s name is required", what)
	}
	for _, r := range name {
		if unicode.IsControl(r) {
			return status.Errorf(codes.InvalidArgument, "%s name %q contains a control character", what, name)
		}
	}
	return nil
}

// checkCapabilities validates the capabilities of a CreateVolume and
// returns the access type they ask for. Errors are INVALID_ARGUMENT.
func (d *Driver) checkCapabilities(caps []*csi.VolumeCapability) (state.AccessType, error) {
	if len(caps) == 0 {
		return "", status.Error(codes.InvalidArgument, "volume_capabilities are required")
	}
	var accessType state.AccessType
	for _, c := range caps {
		at, err := d.checkCapability(c)
		if err != nil {
			return "", err
		}
		if accessType != "" && at != accessType {
			return "", status.Error(codes.InvalidArgument, "volume_capabilities ask for both block and mount access; a volume is one or the other")
		}
		accessType = at
	}
	return accessType, nil
}

// checkCapability validates one capability and returns its access type.
// Errors are INVALID_ARGUMENT.
func (d *Driver) checkCapability(c *csi.VolumeCapability) (state.AccessType, error) {
	if c == nil {
		return "", status.Error(codes.InvalidArgument, "volume capability is required")
	}
	var at state.AccessType
	switch {
	case c.GetBlock() != nil:
		at = state.Block
	case c.GetMount() != nil:
		at = state.Mount
	default:
		return "", status.Error(codes.InvalidArgument, "volume capability has neither block nor mount access type")
	}
	if c.GetAccessMode() == nil {
		return "", status.Error(codes.InvalidArgument, "volume capability has no access mode")
	}
	if err := d.checkAccessMode(c.GetAccessMode().GetMode()); err != nil {
		return "", err
	}
	return at, nil
}

// checkAccessMode accepts the modes a node-local volume can honour.
func (d *Driver) checkAccessMode(mode csi.VolumeCapability_AccessMode_Mode) error {
	switch mode {
	case csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER,
		csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY,
		csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY:
		return nil
	case csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER,
		csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER:
		if d.cfg.SingleNodeMultiWriter {
			return nil
		}
		return status.Errorf(codes.InvalidArgument, "access mode %s needs the SINGLE_NODE_MULTI_WRITER capability, which this driver does not advertise (--single-node-multi-writer)", mode)
	case csi.VolumeCapability_AccessMode_MULTI_NODE_SINGLE_WRITER,
		csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER:
		return status.Errorf(codes.InvalidArgument, "access mode %s is not supported by a node-local driver", mode)
	default:
		return status.Errorf(codes.InvalidArgument, "access mode %s is unknown", mode)
	}
}

// readOnlyMode reports whether mode only allows reading.
func readOnlyMode(mode csi.VolumeCapability_AccessMode_Mode) bool {
	return mode == csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY ||
		mode == csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY
}

// checkSecrets fails with UNAUTHENTICATED unless got holds every
// key/value pair of want. The message names the key, never a value.
func checkSecrets(call string, want, got map[string]string) error {
	for _, k := range slices.Sorted(maps.Keys(want)) {
		v, ok := got[k]
		if !ok {
			return status.Errorf(codes.Unauthenticated, "%s: secret %q is required", call, k)
		}
		if v != want[k] {
			return status.Errorf(codes.Unauthenticated, "%s: secret %q has the wrong value", call, k)
		}
	}
	return nil
}

// checkCallSecrets is checkSecrets, except that with the EchoSecrets fault
// the message also quotes the secrets the call was sent.
func (d *Driver) checkCallSecrets(call string, want, got map[string]string) error {
	err := checkSecrets(call, want, got)
	if err == nil || !d.cfg.Faults.EchoSecrets {
		return err
	}
	return status.Errorf(status.Code(err), "%s; secrets sent: %v", status.Convert(err).Message(), got)
}

// nodeTopology is the topology of the one node this driver serves.
func (d *Driver) nodeTopology() *csi.Topology {
	return &csi.Topology{Segments: map[string]string{TopologyKey: d.cfg.NodeID}}
}

// accessible reports whether a volume on this node satisfies req: true
// when topology is off, req is nil or has no requisite topologies, or one
// of them is exactly this node's topology. Preferred topologies are only
// a preference and never exclude this node.
func (d *Driver) accessible(req *csi.TopologyRequirement) bool {
	if !d.cfg.EnableTopology || len(req.GetRequisite()) == 0 {
		return true
	}
	for _, t := range req.GetRequisite() {
		if d.isNodeTopology(t) {
			return true
		}
	}
	return false
}

// isNodeTopology reports whether t is exactly this node's topology.
func (d *Driver) isNodeTopology(t *csi.Topology) bool {
	return maps.Equal(t.GetSegments(), d.nodeTopology().GetSegments())
}
