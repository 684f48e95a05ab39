package driver

import (
	"errors"
	"fmt"
	"maps"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kube-storage/csi-provisioner/examples/hostpath-driver/backend"
	"github.com/kube-storage/csi-provisioner/examples/hostpath-driver/state"
)

func TestCreateVolumeValidation(t *testing.T) {
	otherNode := &csi.Topology{Segments: map[string]string{TopologyKey: "node-2"}}
	thisNode := &csi.Topology{Segments: map[string]string{TopologyKey: testNode}}
	tests := []struct {
		name     string
		mutate   func(*Config)
		req      func(*csi.CreateVolumeRequest)
		wantCode codes.Code
		wantMsg  string // substring of the error message
		wantSize int64  // checked when wantCode is OK
	}{
		{name: "ok", wantSize: 2 * gi},
		{name: "empty name", req: func(r *csi.CreateVolumeRequest) { r.Name = "" }, wantCode: codes.InvalidArgument},
		{name: "control character in name", req: func(r *csi.CreateVolumeRequest) { r.Name = "a\x01b" }, wantCode: codes.InvalidArgument},
		{name: "no capabilities", req: func(r *csi.CreateVolumeRequest) { r.VolumeCapabilities = nil }, wantCode: codes.InvalidArgument},
		{name: "nil capability", req: func(r *csi.CreateVolumeRequest) { r.VolumeCapabilities = []*csi.VolumeCapability{nil} }, wantCode: codes.InvalidArgument},
		{name: "no access type", req: func(r *csi.CreateVolumeRequest) { r.VolumeCapabilities[0].AccessType = nil }, wantCode: codes.InvalidArgument},
		{name: "no access mode", req: func(r *csi.CreateVolumeRequest) { r.VolumeCapabilities[0].AccessMode = nil }, wantCode: codes.InvalidArgument},
		{
			name:     "block and mount",
			req:      func(r *csi.CreateVolumeRequest) { r.VolumeCapabilities = append(r.VolumeCapabilities, blockCap(rwo)) },
			wantCode: codes.InvalidArgument, wantMsg: "both block and mount",
		},
		{
			name: "required over limit",
			req: func(r *csi.CreateVolumeRequest) {
				r.CapacityRange = &csi.CapacityRange{RequiredBytes: 2 * gi, LimitBytes: gi}
			},
			wantCode: codes.InvalidArgument,
		},
		{
			name:     "negative",
			req:      func(r *csi.CreateVolumeRequest) { r.CapacityRange = &csi.CapacityRange{RequiredBytes: -1} },
			wantCode: codes.InvalidArgument,
		},
		{
			name:     "over max volume size",
			mutate:   func(c *Config) { c.MaxVolumeSize = gi },
			wantCode: codes.OutOfRange,
		},
		{
			name:     "over remaining capacity",
			mutate:   func(c *Config) { c.CapacityBytes = gi },
			wantCode: codes.ResourceExhausted, wantMsg: "not enough capacity",
		},
		{
			name: "multi node multi writer",
			req: func(r *csi.CreateVolumeRequest) {
				r.VolumeCapabilities[0].AccessMode.Mode = csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER
			},
			wantCode: codes.InvalidArgument, wantMsg: "access mode MULTI_NODE_MULTI_WRITER is not supported by a node-local driver",
		},
		{
			name: "multi node single writer",
			req: func(r *csi.CreateVolumeRequest) {
				r.VolumeCapabilities[0].AccessMode.Mode = csi.VolumeCapability_AccessMode_MULTI_NODE_SINGLE_WRITER
			},
			wantCode: codes.InvalidArgument, wantMsg: "access mode MULTI_NODE_SINGLE_WRITER is not supported by a node-local driver",
		},
		{
			name: "single node single writer without the capability",
			req: func(r *csi.CreateVolumeRequest) {
				r.VolumeCapabilities[0].AccessMode.Mode = csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER
			},
			wantCode: codes.InvalidArgument,
		},
		{
			name:   "single node single writer with the capability",
			mutate: func(c *Config) { c.SingleNodeMultiWriter = true },
			req: func(r *csi.CreateVolumeRequest) {
				r.VolumeCapabilities[0].AccessMode.Mode = csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER
			},
			wantSize: 2 * gi,
		},
		{
			name: "multi node reader only",
			req: func(r *csi.CreateVolumeRequest) {
				r.VolumeCapabilities[0].AccessMode.Mode = csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY
			},
			wantSize: 2 * gi,
		},
		{name: "required 0 is 1Gi", req: func(r *csi.CreateVolumeRequest) { r.CapacityRange = nil }, wantSize: gi},
		{
			name:     "required 0 capped by limit",
			req:      func(r *csi.CreateVolumeRequest) { r.CapacityRange = &csi.CapacityRange{LimitBytes: 100 << 20} },
			wantSize: 100 << 20,
		},
		{
			name:     "required 0 capped by max volume size",
			mutate:   func(c *Config) { c.MaxVolumeSize = 10 << 20 },
			req:      func(r *csi.CreateVolumeRequest) { r.CapacityRange = nil },
			wantSize: 10 << 20,
		},
		{
			name:     "mutable parameters",
			req:      func(r *csi.CreateVolumeRequest) { r.MutableParameters = map[string]string{"iops": "10"} },
			wantCode: codes.InvalidArgument,
		},
		{
			name: "missing source snapshot",
			req: func(r *csi.CreateVolumeRequest) {
				r.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
					Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: "snap-0000000000000000"},
				}}
			},
			wantCode: codes.NotFound,
		},
		{
			name: "missing source volume",
			req: func(r *csi.CreateVolumeRequest) {
				r.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{
					Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: "vol-0000000000000000"},
				}}
			},
			wantCode: codes.NotFound,
		},
		{
			name: "requisite topology without this node",
			req: func(r *csi.CreateVolumeRequest) {
				r.AccessibilityRequirements = &csi.TopologyRequirement{Requisite: []*csi.Topology{otherNode}, Preferred: []*csi.Topology{otherNode}}
			},
			wantCode: codes.ResourceExhausted,
		},
		{
			name: "requisite topology with this node",
			req: func(r *csi.CreateVolumeRequest) {
				r.AccessibilityRequirements = &csi.TopologyRequirement{Requisite: []*csi.Topology{otherNode, thisNode}}
			},
			wantSize: 2 * gi,
		},
		{
			name: "preferred topology only is a preference",
			req: func(r *csi.CreateVolumeRequest) {
				r.AccessibilityRequirements = &csi.TopologyRequirement{Preferred: []*csi.Topology{otherNode}}
			},
			wantSize: 2 * gi,
		},
		{
			name:   "requirements ignored without topology",
			mutate: func(c *Config) { c.EnableTopology = false },
			req: func(r *csi.CreateVolumeRequest) {
				r.AccessibilityRequirements = &csi.TopologyRequirement{Requisite: []*csi.Topology{otherNode}}
			},
			wantSize: 2 * gi,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := newTestDriver(t, tt.mutate)
			req := createReq("pvc-1", 2*gi)
			if tt.req != nil {
				tt.req(req)
			}
			resp, err := d.CreateVolume(t.Context(), req)
			wantCode(t, err, tt.wantCode)
			if tt.wantMsg != "" && !strings.Contains(status.Convert(err).Message(), tt.wantMsg) {
				t.Errorf("message %q does not contain %q", status.Convert(err).Message(), tt.wantMsg)
			}
			if tt.wantCode != codes.OK {
				if n := len(volumeIDs(t, d)); n != 0 {
					t.Errorf("a failed CreateVolume left %d volumes", n)
				}
				return
			}
			v := resp.GetVolume()
			if v.GetCapacityBytes() != tt.wantSize {
				t.Errorf("capacity %d, want %d", v.GetCapacityBytes(), tt.wantSize)
			}
			if d.cfg.EnableTopology {
				if len(v.GetAccessibleTopology()) != 1 || !maps.Equal(v.GetAccessibleTopology()[0].GetSegments(), thisNode.GetSegments()) {
					t.Errorf("accessible topology %v, want %v", v.GetAccessibleTopology(), thisNode)
				}
			} else if len(v.GetAccessibleTopology()) != 0 {
				t.Errorf("accessible topology %v without topology", v.GetAccessibleTopology())
			}
		})
	}
}

func TestCreateVolumeIdempotency(t *testing.T) {
	tests := []struct {
		name     string
		second   func(r *csi.CreateVolumeRequest, snapshotID string)
		wantCode codes.Code
	}{
		{name: "same request", second: func(*csi.CreateVolumeRequest, string) {}},
		{name: "smaller required", second: func(r *csi.CreateVolumeRequest, _ string) { r.CapacityRange.RequiredBytes = gi }},
		{name: "no capacity range", second: func(r *csi.CreateVolumeRequest, _ string) { r.CapacityRange = nil }},
		{name: "other secrets", second: func(r *csi.CreateVolumeRequest, _ string) { r.Secrets = map[string]string{"k": "v"} }},
		{name: "other reader mode", second: func(r *csi.CreateVolumeRequest, _ string) {
			r.VolumeCapabilities[0].AccessMode.Mode = csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY
		}},
		{name: "larger required", second: func(r *csi.CreateVolumeRequest, _ string) { r.CapacityRange.RequiredBytes = 3 * gi }, wantCode: codes.AlreadyExists},
		{name: "limit below size", second: func(r *csi.CreateVolumeRequest, _ string) { r.CapacityRange = &csi.CapacityRange{LimitBytes: gi} }, wantCode: codes.AlreadyExists},
		{name: "block instead of mount", second: func(r *csi.CreateVolumeRequest, _ string) {
			r.VolumeCapabilities = []*csi.VolumeCapability{blockCap(rwo)}
		}, wantCode: codes.AlreadyExists},
		{name: "other parameters", second: func(r *csi.CreateVolumeRequest, _ string) { r.Parameters = map[string]string{"type": "fast"} }, wantCode: codes.AlreadyExists},
		{name: "with a source", second: func(r *csi.CreateVolumeRequest, snapshotID string) {
			r.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
				Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snapshotID},
			}}
		}, wantCode: codes.AlreadyExists},
		{name: "requisite topology elsewhere", second: func(r *csi.CreateVolumeRequest, _ string) {
			r.AccessibilityRequirements = &csi.TopologyRequirement{Requisite: []*csi.Topology{{Segments: map[string]string{TopologyKey: "node-2"}}}}
		}, wantCode: codes.AlreadyExists},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := newTestDriver(t, nil)
			src := mustCreate(t, d, createReq("source", gi))
			snap, err := d.CreateSnapshot(t.Context(), &csi.CreateSnapshotRequest{Name: "snap", SourceVolumeId: src.GetVolumeId()})
			if err != nil {
				t.Fatal(err)
			}
			first := createReq("pvc-1", 2*gi)
			first.Parameters = map[string]string{"type": "slow"}
			v1 := mustCreate(t, d, first)

			second := createReq("pvc-1", 2*gi)
			second.Parameters = map[string]string{"type": "slow"}
			tt.second(second, snap.GetSnapshot().GetSnapshotId())
			resp, err := d.CreateVolume(t.Context(), second)
			wantCode(t, err, tt.wantCode)
			if err == nil && resp.GetVolume().GetVolumeId() != v1.GetVolumeId() {
				t.Errorf("second CreateVolume returned volume %s, want %s", resp.GetVolume().GetVolumeId(), v1.GetVolumeId())
			}
			if n := len(volumeIDs(t, d)); n != 2 {
				t.Errorf("%d volumes, want 2 (source and pvc-1)", n)
			}
		})
	}
}

func TestCreateVolumeFromSources(t *testing.T) {
	d := newTestDriver(t, nil)
	src := mustCreate(t, d, createReq("source", 2*gi))
	snap, err := d.CreateSnapshot(t.Context(), &csi.CreateSnapshotRequest{Name: "snap", SourceVolumeId: src.GetVolumeId()})
	if err != nil {
		t.Fatal(err)
	}
	fromSnap := &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
		Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snap.GetSnapshot().GetSnapshotId()},
	}}
	fromVol := &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{
		Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: src.GetVolumeId()},
	}}
	tests := []struct {
		name     string
		source   *csi.VolumeContentSource
		capRange *csi.CapacityRange
		block    bool
		wantCode codes.Code
		wantSize int64
	}{
		{name: "restore", source: fromSnap, capRange: &csi.CapacityRange{RequiredBytes: 3 * gi}, wantSize: 3 * gi},
		{name: "clone", source: fromVol, capRange: &csi.CapacityRange{RequiredBytes: 2 * gi}, wantSize: 2 * gi},
		{name: "clone without size takes the source size", source: fromVol, wantSize: 2 * gi},
		{name: "restore smaller required is grown to the source", source: fromSnap, capRange: &csi.CapacityRange{RequiredBytes: gi}, wantSize: 2 * gi},
		{name: "limit below the source", source: fromSnap, capRange: &csi.CapacityRange{RequiredBytes: gi, LimitBytes: gi}, wantCode: codes.OutOfRange},
		{name: "block from a mount volume", source: fromVol, block: true, wantCode: codes.InvalidArgument},
		{name: "empty source id", source: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{
			Volume: &csi.VolumeContentSource_VolumeSource{},
		}}, wantCode: codes.InvalidArgument},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := createReq(fmt.Sprintf("pvc-%d", i), 0)
			req.CapacityRange = tt.capRange
			req.VolumeContentSource = tt.source
			if tt.block {
				req.VolumeCapabilities = []*csi.VolumeCapability{blockCap(rwo)}
			}
			resp, err := d.CreateVolume(t.Context(), req)
			wantCode(t, err, tt.wantCode)
			if err != nil {
				return
			}
			if got := resp.GetVolume().GetCapacityBytes(); got != tt.wantSize {
				t.Errorf("capacity %d, want %d", got, tt.wantSize)
			}
			if got := resp.GetVolume().GetContentSource(); got.String() != tt.source.String() {
				t.Errorf("content source %v, want %v", got, tt.source)
			}
		})
	}
}

func TestDeleteVolume(t *testing.T) {
	tests := []struct {
		name     string
		mutate   func(*Config)
		setup    func(t *testing.T, d *Driver, id string)
		id       func(id string) string
		wantCode codes.Code
		wantGone bool
	}{
		{name: "existing", wantGone: true},
		{name: "unknown id", id: func(string) string { return "vol-ffffffffffffffff" }},
		{name: "not a volume id", id: func(string) string { return "whatever" }},
		{name: "empty id", id: func(string) string { return "" }, wantCode: codes.InvalidArgument},
		{name: "twice", setup: func(t *testing.T, d *Driver, id string) {
			if _, err := d.DeleteVolume(t.Context(), &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
				t.Fatal(err)
			}
		}, wantGone: true},
		{
			name:   "controller published",
			mutate: func(c *Config) { c.EnableAttach = true },
			setup: func(t *testing.T, d *Driver, id string) {
				if _, err := d.ControllerPublishVolume(t.Context(), &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: testNode, VolumeCapability: mountCap(rwo)}); err != nil {
					t.Fatal(err)
				}
			},
			wantCode: codes.FailedPrecondition,
		},
		{
			name: "node published",
			setup: func(t *testing.T, d *Driver, id string) {
				target := t.TempDir() + "/target"
				if _, err := d.NodePublishVolume(t.Context(), &csi.NodePublishVolumeRequest{VolumeId: id, TargetPath: target, VolumeCapability: mountCap(rwo)}); err != nil {
					t.Fatal(err)
				}
			},
			wantCode: codes.FailedPrecondition,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := newTestDriver(t, tt.mutate)
			id := mustCreate(t, d, createReq("pvc-1", gi)).GetVolumeId()
			if tt.setup != nil {
				tt.setup(t, d, id)
			}
			delID := id
			if tt.id != nil {
				delID = tt.id(id)
			}
			_, err := d.DeleteVolume(t.Context(), &csi.DeleteVolumeRequest{VolumeId: delID})
			wantCode(t, err, tt.wantCode)
			if _, exists := volumeIDs(t, d)[id]; exists == tt.wantGone {
				t.Errorf("volume exists=%t after DeleteVolume, want %t", exists, !tt.wantGone)
			}
		})
	}
}

func TestCapacityAccounting(t *testing.T) {
	d := newTestDriver(t, func(c *Config) { c.CapacityBytes, c.MaxVolumeSize = 10*gi, 5*gi })
	capacity := func() (int64, int64) {
		t.Helper()
		resp, err := d.GetCapacity(t.Context(), &csi.GetCapacityRequest{})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetAvailableCapacity(), resp.GetMaximumVolumeSize().GetValue()
	}
	checkCapacity := func(wantAvailable, wantMax int64) {
		t.Helper()
		if available, maxSize := capacity(); available != wantAvailable || maxSize != wantMax {
			t.Fatalf("available %d, max %d; want %d, %d", available, maxSize, wantAvailable, wantMax)
		}
	}
	checkCapacity(10*gi, 5*gi)
	a := mustCreate(t, d, createReq("a", 4*gi))
	mustCreate(t, d, createReq("a", 4*gi)) // idempotent retry: no second charge
	checkCapacity(6*gi, 5*gi)
	mustCreate(t, d, createReq("b", 4*gi))
	checkCapacity(2*gi, 2*gi)
	_, err := d.CreateVolume(t.Context(), createReq("c", 4*gi))
	wantCode(t, err, codes.ResourceExhausted)
	_, err = d.CreateVolume(t.Context(), createReq("d", 6*gi))
	wantCode(t, err, codes.OutOfRange)
	if _, err := d.CreateSnapshot(t.Context(), &csi.CreateSnapshotRequest{Name: "s", SourceVolumeId: a.GetVolumeId()}); err != nil {
		t.Fatal(err)
	}
	checkCapacity(2*gi, 2*gi) // snapshots are not charged
	if _, err := d.DeleteVolume(t.Context(), &csi.DeleteVolumeRequest{VolumeId: a.GetVolumeId()}); err != nil {
		t.Fatal(err)
	}
	checkCapacity(6*gi, 5*gi)
	mustCreate(t, d, createReq("c", 4*gi))
	checkCapacity(2*gi, 2*gi)
}

func TestGetCapacityFilters(t *testing.T) {
	d := newTestDriver(t, func(c *Config) { c.CapacityBytes = 10 * gi })
	tests := []struct {
		name string
		req  *csi.GetCapacityRequest
		want int64
	}{
		{name: "no filter", req: &csi.GetCapacityRequest{}, want: 10 * gi},
		{name: "this node", req: &csi.GetCapacityRequest{AccessibleTopology: d.nodeTopology()}, want: 10 * gi},
		{name: "other node", req: &csi.GetCapacityRequest{AccessibleTopology: &csi.Topology{Segments: map[string]string{TopologyKey: "x"}}}, want: 0},
		{name: "supported capability", req: &csi.GetCapacityRequest{VolumeCapabilities: []*csi.VolumeCapability{blockCap(rwo)}}, want: 10 * gi},
		{name: "unsupported capability", req: &csi.GetCapacityRequest{VolumeCapabilities: []*csi.VolumeCapability{
			mountCap(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER),
		}}, want: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, err := d.GetCapacity(t.Context(), tt.req)
			if err != nil {
				t.Fatal(err)
			}
			if resp.GetAvailableCapacity() != tt.want {
				t.Errorf("available %d, want %d", resp.GetAvailableCapacity(), tt.want)
			}
		})
	}
}

// TestReservedParameters checks that CreateVolume refuses the sidecar's own
// StorageClass parameters (csi.storage.k8s.io/...) and accepts its own and
// the keys a sidecar adds with --extra-create-metadata, which it returns in
// the volume context. GetCapacity takes them all (see
// TestGetCapacityTakesSidecarParameters).
func TestReservedParameters(t *testing.T) {
	d := newTestDriver(t, nil)
	reserved := map[string]string{"kind": "fast", "csi.storage.k8s.io/fstype": "xfs"}
	own := map[string]string{"kind": "fast"}
	metadata := map[string]string{"kind": "fast", "csi.storage.k8s.io/pvc/name": "data", "csi.storage.k8s.io/pvc/namespace": "ns", "csi.storage.k8s.io/pv/name": "pvc-1"}
	calls := map[string]struct {
		call func(map[string]string) error
		// metadataKey is the extra-metadata key the call refuses, "" if
		// it accepts them.
		metadataKey string
	}{
		"CreateVolume": {call: func(params map[string]string) error {
			req := createReq("v-"+fmt.Sprint(len(params)), gi)
			req.Parameters = params
			resp, err := d.CreateVolume(t.Context(), req)
			if err == nil && !maps.Equal(resp.GetVolume().GetVolumeContext(), params) {
				t.Errorf("volume context %v, want the parameters %v", resp.GetVolume().GetVolumeContext(), params)
			}
			return err
		}},
	}
	for name, c := range calls {
		t.Run(name, func(t *testing.T) {
			if err := c.call(reserved); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), `parameter "csi.storage.k8s.io/fstype" is in the csi.storage.k8s.io/ namespace`) {
				t.Errorf("with a reserved key: %v, want InvalidArgument naming the key", err)
			}
			if err := c.call(own); err != nil {
				t.Errorf("with the driver's own parameters: %v", err)
			}
			err := c.call(metadata)
			switch {
			case c.metadataKey == "" && err != nil:
				t.Errorf("with --extra-create-metadata's keys: %v", err)
			case c.metadataKey != "" && (status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), `parameter "`+c.metadataKey)):
				t.Errorf("with --extra-create-metadata's keys: %v, want InvalidArgument naming %s...", err, c.metadataKey)
			}
		})
	}
}

// TestGetCapacityTakesSidecarParameters: upstream external-provisioner
// sends GetCapacity the class's parameters as they are (capacity tracking)
// or CreateVolume's with --extra-create-metadata's keys (its node
// deployment's check). The driver answers with its capacity, as for its
// own parameters: refusing them would publish no CSIStorageCapacity, and
// late-binding pods would stay Pending for "not enough free storage".
func TestGetCapacityTakesSidecarParameters(t *testing.T) {
	d := newTestDriver(t, nil)
	topo := &csi.Topology{Segments: map[string]string{TopologyKey: testNode}}
	for name, params := range map[string]map[string]string{
		"own":                          {"kind": "fast"},
		"class parameters as they are": {"kind": "fast", "csi.storage.k8s.io/fstype": "xfs", "csi.storage.k8s.io/provisioner-secret-name": "s", "csi.storage.k8s.io/provisioner-secret-namespace": "ns"},
		"extra create metadata":        {"kind": "fast", "csi.storage.k8s.io/pvc/name": "data", "csi.storage.k8s.io/pvc/namespace": "ns", "csi.storage.k8s.io/pv/name": "pvc-1"},
	} {
		t.Run(name, func(t *testing.T) {
			resp, err := d.GetCapacity(t.Context(), &csi.GetCapacityRequest{Parameters: params, AccessibleTopology: topo})
			if err != nil {
				t.Fatalf("GetCapacity: %v", err)
			}
			if resp.GetAvailableCapacity() != DefaultCapacity {
				t.Errorf("available capacity %d, want %d", resp.GetAvailableCapacity(), DefaultCapacity)
			}
		})
	}
}

func TestListVolumesPagination(t *testing.T) {
	d := newTestDriver(t, nil)
	want := map[string]bool{}
	for i := range 25 {
		want[mustCreate(t, d, createReq(fmt.Sprintf("pvc-%d", i), gi)).GetVolumeId()] = true
	}
	tests := []struct {
		name       string
		maxEntries int32
		wantPages  []int
	}{
		{name: "all at once", maxEntries: 0, wantPages: []int{25}},
		{name: "pages of 7", maxEntries: 7, wantPages: []int{7, 7, 7, 4}},
		{name: "pages of 25", maxEntries: 25, wantPages: []int{25}},
		{name: "pages of 5", maxEntries: 5, wantPages: []int{5, 5, 5, 5, 5}},
		{name: "more than there are", maxEntries: 100, wantPages: []int{25}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			seen := map[string]bool{}
			var pages []int
			token := ""
			for {
				resp, err := d.ListVolumes(t.Context(), &csi.ListVolumesRequest{MaxEntries: tt.maxEntries, StartingToken: token})
				if err != nil {
					t.Fatal(err)
				}
				pages = append(pages, len(resp.GetEntries()))
				for _, e := range resp.GetEntries() {
					id := e.GetVolume().GetVolumeId()
					if seen[id] {
						t.Fatalf("volume %s listed twice", id)
					}
					seen[id] = true
				}
				if token = resp.GetNextToken(); token == "" {
					break
				}
			}
			if fmt.Sprint(pages) != fmt.Sprint(tt.wantPages) {
				t.Errorf("pages %v, want %v", pages, tt.wantPages)
			}
			if !maps.Equal(seen, want) {
				t.Errorf("listed %d volumes, want the %d created", len(seen), len(want))
			}
		})
	}

	t.Run("bad token", func(t *testing.T) {
		for _, token := range []string{"invalid-token", "vol-xyz", "snap-0000000000000000"} {
			_, err := d.ListVolumes(t.Context(), &csi.ListVolumesRequest{StartingToken: token})
			wantCode(t, err, codes.Aborted)
		}
	})
	t.Run("negative max entries", func(t *testing.T) {
		_, err := d.ListVolumes(t.Context(), &csi.ListVolumesRequest{MaxEntries: -1})
		wantCode(t, err, codes.InvalidArgument)
	})
	t.Run("token of a deleted volume", func(t *testing.T) {
		first, err := d.ListVolumes(t.Context(), &csi.ListVolumesRequest{MaxEntries: 10})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := d.DeleteVolume(t.Context(), &csi.DeleteVolumeRequest{VolumeId: first.GetNextToken()}); err != nil {
			t.Fatal(err)
		}
		rest, err := d.ListVolumes(t.Context(), &csi.ListVolumesRequest{StartingToken: first.GetNextToken()})
		if err != nil {
			t.Fatalf("ListVolumes after deleting the token's volume: %v", err)
		}
		if got := len(first.GetEntries()) + len(rest.GetEntries()); got != 25 {
			t.Errorf("two pages hold %d volumes, want 25 (24 left plus the deleted one on page 1)", got)
		}
	})
}

func TestValidateVolumeCapabilities(t *testing.T) {
	d := newTestDriver(t, nil)
	req := createReq("pvc-1", gi)
	req.Parameters = map[string]string{"type": "fast"}
	id := mustCreate(t, d, req).GetVolumeId()
	tests := []struct {
		name          string
		req           *csi.ValidateVolumeCapabilitiesRequest
		wantCode      codes.Code
		wantConfirmed bool
	}{
		{name: "confirmed", req: &csi.ValidateVolumeCapabilitiesRequest{VolumeId: id, VolumeCapabilities: []*csi.VolumeCapability{mountCap(rwo)}}, wantConfirmed: true},
		{name: "confirmed with parameters", req: &csi.ValidateVolumeCapabilitiesRequest{
			VolumeId: id, VolumeCapabilities: []*csi.VolumeCapability{mountCap(rwo)}, Parameters: map[string]string{"type": "fast"},
		}, wantConfirmed: true},
		{name: "other parameters", req: &csi.ValidateVolumeCapabilitiesRequest{
			VolumeId: id, VolumeCapabilities: []*csi.VolumeCapability{mountCap(rwo)}, Parameters: map[string]string{"type": "slow"},
		}},
		{name: "block", req: &csi.ValidateVolumeCapabilitiesRequest{VolumeId: id, VolumeCapabilities: []*csi.VolumeCapability{blockCap(rwo)}}},
		{name: "multi writer", req: &csi.ValidateVolumeCapabilitiesRequest{VolumeId: id, VolumeCapabilities: []*csi.VolumeCapability{
			mountCap(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER),
		}}},
		{name: "no id", req: &csi.ValidateVolumeCapabilitiesRequest{VolumeCapabilities: []*csi.VolumeCapability{mountCap(rwo)}}, wantCode: codes.InvalidArgument},
		{name: "no capabilities", req: &csi.ValidateVolumeCapabilitiesRequest{VolumeId: id}, wantCode: codes.InvalidArgument},
		{name: "unknown volume", req: &csi.ValidateVolumeCapabilitiesRequest{VolumeId: "vol-ffffffffffffffff", VolumeCapabilities: []*csi.VolumeCapability{mountCap(rwo)}}, wantCode: codes.NotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, err := d.ValidateVolumeCapabilities(t.Context(), tt.req)
			wantCode(t, err, tt.wantCode)
			if err != nil {
				return
			}
			if got := resp.GetConfirmed() != nil; got != tt.wantConfirmed {
				t.Errorf("confirmed=%t (message %q), want %t", got, resp.GetMessage(), tt.wantConfirmed)
			}
			if !tt.wantConfirmed && resp.GetMessage() == "" {
				t.Error("an unconfirmed answer has no message")
			}
		})
	}
}

func TestControllerPublish(t *testing.T) {
	t.Run("disabled", func(t *testing.T) {
		d := newTestDriver(t, nil)
		_, err := d.ControllerPublishVolume(t.Context(), &csi.ControllerPublishVolumeRequest{VolumeId: "v", NodeId: testNode, VolumeCapability: mountCap(rwo)})
		wantCode(t, err, codes.Unimplemented)
		_, err = d.ControllerUnpublishVolume(t.Context(), &csi.ControllerUnpublishVolumeRequest{VolumeId: "v"})
		wantCode(t, err, codes.Unimplemented)
	})

	d := newTestDriver(t, func(c *Config) { c.EnableAttach = true })
	id := mustCreate(t, d, createReq("pvc-1", gi)).GetVolumeId()
	publish := func(r *csi.ControllerPublishVolumeRequest) error {
		_, err := d.ControllerPublishVolume(t.Context(), r)
		return err
	}
	steps := []struct {
		name     string
		call     func() error
		wantCode codes.Code
	}{
		{"no volume id", func() error {
			return publish(&csi.ControllerPublishVolumeRequest{NodeId: testNode, VolumeCapability: mountCap(rwo)})
		}, codes.InvalidArgument},
		{"no node id", func() error {
			return publish(&csi.ControllerPublishVolumeRequest{VolumeId: id, VolumeCapability: mountCap(rwo)})
		}, codes.InvalidArgument},
		{"no capability", func() error { return publish(&csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: testNode}) }, codes.InvalidArgument},
		{"unknown volume", func() error {
			return publish(&csi.ControllerPublishVolumeRequest{VolumeId: "vol-ffffffffffffffff", NodeId: testNode, VolumeCapability: mountCap(rwo)})
		}, codes.NotFound},
		{"unknown node", func() error {
			return publish(&csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "node-2", VolumeCapability: mountCap(rwo)})
		}, codes.NotFound},
		{"block capability on a mount volume", func() error {
			return publish(&csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: testNode, VolumeCapability: blockCap(rwo)})
		}, codes.InvalidArgument},
		{"publish", func() error {
			return publish(&csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: testNode, VolumeCapability: mountCap(rwo)})
		}, codes.OK},
		{"publish again", func() error {
			return publish(&csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: testNode, VolumeCapability: mountCap(rwo)})
		}, codes.OK},
		{"publish read-only", func() error {
			return publish(&csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: testNode, VolumeCapability: mountCap(rwo), Readonly: true})
		}, codes.AlreadyExists},
		{"delete while published", func() error {
			_, err := d.DeleteVolume(t.Context(), &csi.DeleteVolumeRequest{VolumeId: id})
			return err
		}, codes.FailedPrecondition},
		{"unpublish without volume id", func() error {
			_, err := d.ControllerUnpublishVolume(t.Context(), &csi.ControllerUnpublishVolumeRequest{NodeId: testNode})
			return err
		}, codes.InvalidArgument},
		{"unpublish from another node", func() error {
			_, err := d.ControllerUnpublishVolume(t.Context(), &csi.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: "node-2"})
			return err
		}, codes.OK},
		{"still published", func() error {
			_, err := d.DeleteVolume(t.Context(), &csi.DeleteVolumeRequest{VolumeId: id})
			return err
		}, codes.FailedPrecondition},
		{"unpublish", func() error {
			_, err := d.ControllerUnpublishVolume(t.Context(), &csi.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: testNode})
			return err
		}, codes.OK},
		{"unpublish again", func() error {
			_, err := d.ControllerUnpublishVolume(t.Context(), &csi.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: testNode})
			return err
		}, codes.OK},
		{"unpublish unknown volume", func() error {
			_, err := d.ControllerUnpublishVolume(t.Context(), &csi.ControllerUnpublishVolumeRequest{VolumeId: "vol-ffffffffffffffff"})
			return err
		}, codes.OK},
		{"delete", func() error {
			_, err := d.DeleteVolume(t.Context(), &csi.DeleteVolumeRequest{VolumeId: id})
			return err
		}, codes.OK},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) { wantCode(t, s.call(), s.wantCode) })
	}
}

// failingBackend is a Memory backend whose Save fails while failSave is set.
type failingBackend struct {
	backend.Memory
	failSave bool
}

var _ backend.Backend = (*failingBackend)(nil)

func (b *failingBackend) Save(*state.State) error {
	if b.failSave {
		return errors.New("disk full")
	}
	return nil
}

func TestSaveFailureRollsBack(t *testing.T) {
	b := &failingBackend{}
	d := newTestDriver(t, func(c *Config) { c.EnableAttach = true }, WithBackend(b))
	kept := mustCreate(t, d, createReq("kept", gi))

	b.failSave = true
	_, err := d.CreateVolume(t.Context(), createReq("lost", gi))
	wantCode(t, err, codes.Internal)
	_, err = d.DeleteVolume(t.Context(), &csi.DeleteVolumeRequest{VolumeId: kept.GetVolumeId()})
	wantCode(t, err, codes.Internal)
	_, err = d.ControllerPublishVolume(t.Context(), &csi.ControllerPublishVolumeRequest{VolumeId: kept.GetVolumeId(), NodeId: testNode, VolumeCapability: mountCap(rwo)})
	wantCode(t, err, codes.Internal)

	b.failSave = false
	if ids := volumeIDs(t, d); len(ids) != 1 || ids[kept.GetVolumeId()] != gi {
		t.Fatalf("volumes after failed saves: %v, want only %s", ids, kept.GetVolumeId())
	}
	// The rolled-back create and delete left the capacity as it was.
	if resp, err := d.GetCapacity(t.Context(), &csi.GetCapacityRequest{}); err != nil || resp.GetAvailableCapacity() != DefaultCapacity-gi {
		t.Fatalf("available capacity after failed saves: %v, %v; want %d", resp.GetAvailableCapacity(), err, DefaultCapacity-gi)
	}
	// Nothing half-done: the name is free, the volume is not attached.
	mustCreate(t, d, createReq("lost", gi))
	if _, err := d.DeleteVolume(t.Context(), &csi.DeleteVolumeRequest{VolumeId: kept.GetVolumeId()}); err != nil {
		t.Fatalf("DeleteVolume after a failed ControllerPublish: %v", err)
	}
}

func TestControllerGetCapabilities(t *testing.T) {
	base := []csi.ControllerServiceCapability_RPC_Type{
		csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME,
		csi.ControllerServiceCapability_RPC_LIST_VOLUMES,
		csi.ControllerServiceCapability_RPC_GET_CAPACITY,
		csi.ControllerServiceCapability_RPC_CREATE_DELETE_SNAPSHOT,
		csi.ControllerServiceCapability_RPC_LIST_SNAPSHOTS,
		csi.ControllerServiceCapability_RPC_CLONE_VOLUME,
	}
	tests := []struct {
		name   string
		mutate func(*Config)
		want   []csi.ControllerServiceCapability_RPC_Type
	}{
		{name: "defaults", want: base},
		{name: "attach", mutate: func(c *Config) { c.EnableAttach = true }, want: append(base[:len(base):len(base)], csi.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME)},
		{name: "single node multi writer", mutate: func(c *Config) { c.SingleNodeMultiWriter = true }, want: append(base[:len(base):len(base)], csi.ControllerServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, err := newTestDriver(t, tt.mutate).ControllerGetCapabilities(t.Context(), &csi.ControllerGetCapabilitiesRequest{})
			if err != nil {
				t.Fatal(err)
			}
			var got []csi.ControllerServiceCapability_RPC_Type
			for _, c := range resp.GetCapabilities() {
				got = append(got, c.GetRpc().GetType())
			}
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Errorf("capabilities %v, want %v", got, tt.want)
			}
		})
	}
}
