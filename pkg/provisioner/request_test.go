package provisioner

import (
	"maps"
	"math"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"sigs.k8s.io/sig-storage-lib-external-provisioner/v13/controller"

	"github.com/kube-storage/csi-provisioner/internal/testutil"
	"github.com/kube-storage/csi-provisioner/pkg/csiclient"
	"github.com/kube-storage/csi-provisioner/pkg/inflight"
)

const gi = 1 << 30

func mountCap(mode csi.VolumeCapability_AccessMode_Mode, fsType string, flags ...string) *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: fsType, MountFlags: flags}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: mode},
	}
}

func blockCap(mode csi.VolumeCapability_AccessMode_Mode) *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: mode},
	}
}

const (
	snw  = csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER
	snmw = csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER
	snsw = csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER
	mnro = csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY
	mnmw = csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER
)

// TestCreateVolumeRequest covers the claim + class → CreateVolumeRequest
// mapping (reference §2b): name, capacity, one capability per access mode
// with the SINGLE_NODE_MULTI_WRITER variants, Block vs Mount, fsType sources,
// mount options, parameter stripping and --extra-create-metadata.
func TestCreateVolumeRequest(t *testing.T) {
	tests := []struct {
		name  string
		claim *corev1.PersistentVolumeClaim
		class *storagev1.StorageClass
		caps  func(*csiclient.Capabilities)
		opts  []Option
		want  *csi.CreateVolumeRequest
	}{
		{
			name:  "filesystem, class parameters passed on",
			claim: newClaim("c").Size("2Gi").Obj(),
			class: newClass().Param("foo", "bar").Obj(),
			want: &csi.CreateVolumeRequest{
				Name: "pvc-uid-c", CapacityRange: &csi.CapacityRange{RequiredBytes: 2 * gi},
				VolumeCapabilities: []*csi.VolumeCapability{mountCap(snw, "")},
				Parameters:         map[string]string{"foo": "bar"},
			},
		},
		{
			name:  "milli-units round up to a whole byte",
			claim: newClaim("c").Size("1500m").Obj(), class: newClass().Obj(),
			want: &csi.CreateVolumeRequest{
				Name: "pvc-uid-c", CapacityRange: &csi.CapacityRange{RequiredBytes: 2},
				VolumeCapabilities: []*csi.VolumeCapability{mountCap(snw, "")}, Parameters: map[string]string{},
			},
		},
		{
			// The parser caps a binary quantity at the largest int64.
			name:  "8Ei is the largest int64",
			claim: newClaim("c").Size("8Ei").Obj(), class: newClass().Obj(),
			want: &csi.CreateVolumeRequest{
				Name: "pvc-uid-c", CapacityRange: &csi.CapacityRange{RequiredBytes: math.MaxInt64},
				VolumeCapabilities: []*csi.VolumeCapability{mountCap(snw, "")}, Parameters: map[string]string{},
			},
		},
		{
			name:  "default fsType",
			claim: newClaim("c").Obj(), class: newClass().Obj(), opts: []Option{WithDefaultFSType("ext4")},
			want: &csi.CreateVolumeRequest{
				Name: "pvc-uid-c", CapacityRange: &csi.CapacityRange{RequiredBytes: gi},
				VolumeCapabilities: []*csi.VolumeCapability{mountCap(snw, "ext4")}, Parameters: map[string]string{},
			},
		},
		{
			name:  "prefixed fsType wins over the default and is stripped",
			claim: newClaim("c").Obj(), class: newClass().Param(prefixedFSTypeKey, "xfs").Obj(), opts: []Option{WithDefaultFSType("ext4")},
			want: &csi.CreateVolumeRequest{
				Name: "pvc-uid-c", CapacityRange: &csi.CapacityRange{RequiredBytes: gi},
				VolumeCapabilities: []*csi.VolumeCapability{mountCap(snw, "xfs")}, Parameters: map[string]string{},
			},
		},
		{
			name:  "deprecated fsType key in any case is used and passed on",
			claim: newClaim("c").Obj(), class: newClass().Param("FSType", "ext3").Obj(),
			want: &csi.CreateVolumeRequest{
				Name: "pvc-uid-c", CapacityRange: &csi.CapacityRange{RequiredBytes: gi},
				VolumeCapabilities: []*csi.VolumeCapability{mountCap(snw, "ext3")}, Parameters: map[string]string{"FSType": "ext3"},
			},
		},
		{
			name:  "mount options become mount flags",
			claim: newClaim("c").Obj(), class: newClass().MountOptions("noatime", "discard").Obj(),
			want: &csi.CreateVolumeRequest{
				Name: "pvc-uid-c", CapacityRange: &csi.CapacityRange{RequiredBytes: gi},
				VolumeCapabilities: []*csi.VolumeCapability{mountCap(snw, "", "noatime", "discard")}, Parameters: map[string]string{},
			},
		},
		{
			name:  "block claim has no fsType nor mount flags",
			claim: newClaim("c").Block().Obj(), class: newClass().Param(prefixedFSTypeKey, "xfs").MountOptions("noatime").Obj(),
			want: &csi.CreateVolumeRequest{
				Name: "pvc-uid-c", CapacityRange: &csi.CapacityRange{RequiredBytes: gi},
				VolumeCapabilities: []*csi.VolumeCapability{blockCap(snw)}, Parameters: map[string]string{},
			},
		},
		{
			name:  "one capability per access mode, in order",
			claim: newClaim("c").AccessModes(corev1.ReadWriteMany, corev1.ReadOnlyMany, corev1.ReadWriteOnce).Obj(), class: newClass().Obj(),
			want: &csi.CreateVolumeRequest{
				Name: "pvc-uid-c", CapacityRange: &csi.CapacityRange{RequiredBytes: gi},
				VolumeCapabilities: []*csi.VolumeCapability{mountCap(mnmw, ""), mountCap(mnro, ""), mountCap(snw, "")},
				Parameters:         map[string]string{},
			},
		},
		{
			name:  "ReadWriteOncePod without SINGLE_NODE_MULTI_WRITER",
			claim: newClaim("c").AccessModes(corev1.ReadWriteOncePod).Obj(), class: newClass().Obj(),
			want: &csi.CreateVolumeRequest{
				Name: "pvc-uid-c", CapacityRange: &csi.CapacityRange{RequiredBytes: gi},
				VolumeCapabilities: []*csi.VolumeCapability{mountCap(snw, "")}, Parameters: map[string]string{},
			},
		},
		{
			name:  "SINGLE_NODE_MULTI_WRITER maps ReadWriteOnce and ReadWriteOncePod",
			claim: newClaim("c").AccessModes(corev1.ReadWriteOnce, corev1.ReadWriteOncePod, corev1.ReadOnlyMany).Obj(), class: newClass().Obj(),
			caps: func(c *csiclient.Capabilities) { c.SingleNodeMultiWriter = true },
			want: &csi.CreateVolumeRequest{
				Name: "pvc-uid-c", CapacityRange: &csi.CapacityRange{RequiredBytes: gi},
				VolumeCapabilities: []*csi.VolumeCapability{mountCap(snmw, ""), mountCap(snsw, ""), mountCap(mnro, "")},
				Parameters:         map[string]string{},
			},
		},
		{
			name:  "extra create metadata",
			claim: newClaim("c").Obj(), class: newClass().Param("foo", "bar").Obj(),
			opts: []Option{WithExtraCreateMetadata(true), WithVolumeNamePrefix("test"), WithVolumeNameUUIDLength(3)},
			want: &csi.CreateVolumeRequest{
				Name: "test-uid", CapacityRange: &csi.CapacityRange{RequiredBytes: gi},
				VolumeCapabilities: []*csi.VolumeCapability{mountCap(snw, "")},
				Parameters: map[string]string{
					"foo": "bar", pvcNameKey: "c", pvcNamespaceKey: testNS, pvNameKey: "test-uid",
				},
			},
		},
		{
			name:  "every known reserved key is stripped, deprecated secret keys are not",
			claim: newClaim("c").Obj(),
			class: func() *storagev1.StorageClass {
				b := newClass().Param("csiProvisionerSecretName", "s").Param("csiProvisionerSecretNamespace", "ns")
				for _, k := range []secretKind{controllerPublishSecret, nodeStageSecret, nodePublishSecret, controllerExpandSecret, nodeExpandSecret, controllerModifySecret, defaultSecret} {
					b.Param(k.nameKey, "s").Param(k.namespaceKey, "ns")
				}
				return b.Param(prefixedFSTypeKey, "ext4").Obj()
			}(),
			want: &csi.CreateVolumeRequest{
				Name: "pvc-uid-c", CapacityRange: &csi.CapacityRange{RequiredBytes: gi},
				VolumeCapabilities: []*csi.VolumeCapability{mountCap(snw, "ext4")},
				Parameters:         map[string]string{"csiProvisionerSecretName": "s", "csiProvisionerSecretNamespace": "ns"},
				Secrets:            map[string]string{"key": "value"},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			caps := baseCaps()
			if tt.caps != nil {
				tt.caps(&caps)
			}
			h := newHarness(t, caps, objs(tt.claim, tt.class, secret("ns", "s", map[string]string{"key": "value"})), tt.opts...)
			pv, state, err := h.provision(tt.claim, tt.class)
			if err != nil || state != controller.ProvisioningFinished || pv == nil {
				t.Fatalf("Provision = %v, %v, %v; want a PV", pv != nil, state, err)
			}
			calls := h.driver.createCalls()
			if len(calls) != 1 {
				t.Fatalf("CreateVolume calls = %d, want 1", len(calls))
			}
			if !proto.Equal(calls[0], tt.want) {
				t.Errorf("request:\n%s\nwant:\n%s", prototext.Format(calls[0]), prototext.Format(tt.want))
			}
		})
	}
}

// TestPrepareErrors covers the validation errors and errors before the CSI
// call, with upstream's messages and states: no CreateVolume is sent and
// nothing is written.
func TestPrepareErrors(t *testing.T) {
	tests := []struct {
		name      string
		claim     *corev1.PersistentVolumeClaim
		class     *storagev1.StorageClass
		caps      func(*csiclient.Capabilities)
		wantState controller.ProvisioningState
		wantErr   string
	}{
		{
			name: "selector", claim: newClaim("c").Selector(map[string]string{"a": "b"}).Obj(), class: newClass().Obj(),
			wantState: controller.ProvisioningFinished, wantErr: "claim Selector is not supported",
		},
		{
			name: "both fsType keys", claim: newClaim("c").Obj(), class: newClass().Param("fstype", "ext4").Param(prefixedFSTypeKey, "xfs").Obj(),
			wantState: controller.ProvisioningFinished, wantErr: `fstype specified in parameters with both "fstype" and "csi.storage.k8s.io/fstype" keys`,
		},
		{
			name: "unknown reserved key", claim: newClaim("c").Obj(), class: newClass().Param(reservedPrefix+"foo", "x").Obj(),
			wantState: controller.ProvisioningFinished,
			wantErr:   `failed to strip CSI Parameters of prefixed keys: found unknown parameter key "csi.storage.k8s.io/foo" with reserved namespace csi.storage.k8s.io/`,
		},
		{
			name: "extra metadata key in the class is reserved", claim: newClaim("c").Obj(), class: newClass().Param(pvcNameKey, "x").Obj(),
			wantState: controller.ProvisioningFinished,
			wantErr:   `failed to strip CSI Parameters of prefixed keys: found unknown parameter key "csi.storage.k8s.io/pvc/name" with reserved namespace csi.storage.k8s.io/`,
		},
		{
			name: "unknown access mode", claim: newClaim("c").AccessModes("Bogus").Obj(), class: newClass().Obj(),
			wantState: controller.ProvisioningFinished, wantErr: "unsupported AccessMode combination",
		},
		{
			name: "no controller service", claim: newClaim("c").Obj(), class: newClass().Obj(),
			caps:      func(c *csiclient.Capabilities) { c.ControllerService = false },
			wantState: controller.ProvisioningFinished,
			wantErr:   "CSI driver does not support dynamic provisioning: plugin CONTROLLER_SERVICE capability is not reported",
		},
		{
			name: "no create-delete", claim: newClaim("c").Obj(), class: newClass().Obj(),
			caps:      func(c *csiclient.Capabilities) { c.CreateDeleteVolume = false },
			wantState: controller.ProvisioningFinished,
			wantErr:   "CSI driver does not support dynamic provisioning: controller CREATE_DELETE_VOLUME capability is not reported",
		},
		{
			// Quantity.Value() gives 0 for it: the driver would be asked
			// for a volume of its default size.
			name: "request above int64 bytes, decimal exponent", claim: newClaim("c").Size("10E").Obj(), class: newClass().Obj(),
			wantState: controller.ProvisioningFinished,
			wantErr:   "requested size 10E is more than the 9223372036854775807 bytes a CSI CreateVolume request can carry",
		},
		{
			// Quantity.Value() wraps around to a negative size.
			name: "request one byte above int64", claim: newClaim("c").Size("9223372036854775808").Obj(), class: newClass().Obj(),
			wantState: controller.ProvisioningFinished,
			wantErr:   "requested size 9223372036854775808 is more than the 9223372036854775807 bytes a CSI CreateVolume request can carry",
		},
		{
			name: "missing UID", claim: newClaim("c").UID("").Obj(), class: newClass().Obj(),
			wantState: controller.ProvisioningFinished, wantErr: "corrupted PVC object, it is missing UID",
		},
		{
			name: "nil class", claim: newClaim("c").Obj(),
			wantState: controller.ProvisioningFinished, wantErr: "storage class was nil",
		},
		{
			name: "bad secret template", claim: newClaim("c").Obj(),
			class:     newClass().Param(provisionerSecret.nameKey, "${pvc.foo}").Param(provisionerSecret.namespaceKey, "ns").Obj(),
			wantState: controller.ProvisioningNoChange,
			wantErr:   `error resolving value "${pvc.foo}": invalid tokens: ["pvc.foo"]`,
		},
		{
			name: "missing provisioner secret", claim: newClaim("c").Obj(),
			class:     newClass().Param(provisionerSecret.nameKey, "missing").Param(provisionerSecret.namespaceKey, "ns").Obj(),
			wantState: controller.ProvisioningNoChange,
			wantErr:   `error getting secret missing in namespace ns: secrets "missing" not found`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			caps := baseCaps()
			if tt.caps != nil {
				tt.caps(&caps)
			}
			o := objs(tt.claim)
			if tt.class != nil {
				o = append(o, tt.class)
			}
			h := newHarness(t, caps, o)
			pv, state, err := h.provision(tt.claim, tt.class)
			if pv != nil || state != tt.wantState || err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("Provision = %v, %v, %q; want no PV, %v, %q", pv != nil, state, errString(err), tt.wantState, tt.wantErr)
			}
			if n := len(h.driver.createCalls()); n != 0 {
				t.Errorf("CreateVolume calls = %d, want 0", n)
			}
			if w := h.writes(); len(w) != 0 {
				t.Errorf("writes = %v, want none", w)
			}
		})
	}
}

func TestStripReserved(t *testing.T) {
	in := map[string]string{"a": "1", prefixedFSTypeKey: "ext4", defaultSecret.nameKey: "s", "fstype": "xfs", "csiNodeStageSecretName": "n"}
	got, err := stripReserved(in)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"a": "1", "fstype": "xfs", "csiNodeStageSecretName": "n"}
	if !maps.Equal(got, want) {
		t.Errorf("stripReserved = %v, want %v", got, want)
	}
	if len(in) != 5 {
		t.Error("stripReserved changed its input")
	}
}

// TestDataSources covers upstream's data source handling (clones:
// TestClone, restores: TestRestore).
func TestDataSources(t *testing.T) {
	snapGroup := snapshotAPIGroup
	otherGroup := "populators.example.com"
	tests := []struct {
		name        string
		claim       *corev1.PersistentVolumeClaim
		wantIgnored bool
		wantErr     string
		wantEvent   string
	}{
		{
			name: "populator", claim: newClaim("c").DataSource(&otherGroup, "Sample", "s1").Obj(), wantIgnored: true,
			wantErr:   "ignored because data source (Sample) is not handled by the provisioner, assuming an external populator will provision it",
			wantEvent: "Normal Provisioning Assuming an external populator will provision the volume",
		},
		{
			name: "populator through dataSourceRef only",
			claim: func() *corev1.PersistentVolumeClaim {
				c := newClaim("c").DataSource(&otherGroup, "Sample", "s1").Obj()
				c.Spec.DataSource = nil
				return c
			}(),
			wantIgnored: true, wantErr: "data source (Sample) is not handled",
			wantEvent: "Normal Provisioning Assuming an external populator will provision the volume",
		},
		{name: "clone with a driver without CLONE_VOLUME", claim: newClaim("c").DataSource(nil, "PersistentVolumeClaim", "src").Obj(), wantErr: "CSI driver does not support clone operations"},
		{name: "snapshot with a driver without CREATE_DELETE_SNAPSHOT", claim: newClaim("c").DataSource(&snapGroup, "VolumeSnapshot", "snap").Obj(), wantErr: "CSI driver does not support snapshot restore"},
		{
			name: "snapshot of another group", claim: newClaim("c").DataSource(&otherGroup, "VolumeSnapshot", "snap").Obj(),
			wantErr: "the PVC source does not belong to the right APIGroup. Expected snapshot.storage.k8s.io, Got populators.example.com",
		},
		{name: "empty name", claim: newClaim("c").DataSource(nil, "PersistentVolumeClaim", "").Obj(), wantErr: "the PVC source not found for PVC c"},
		{
			name: "cross-namespace dataSourceRef",
			claim: func() *corev1.PersistentVolumeClaim {
				c := newClaim("c").DataSource(&otherGroup, "Sample", "s1").Obj()
				c.Spec.DataSource = nil
				other := "other"
				c.Spec.DataSourceRef.Namespace = &other
				return c
			}(),
			wantErr: "dataSourceRef namespace specified but the CrossNamespaceVolumeDataSource feature is disabled",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			class := newClass().Obj()
			h := newHarness(t, baseCaps(), objs(tt.claim, class))
			pv, state, err := h.provision(tt.claim, class)
			if pv != nil || state != controller.ProvisioningFinished || !strings.Contains(errString(err), tt.wantErr) {
				t.Errorf("Provision = %v, %v, %q; want no PV, Finished, %q", pv != nil, state, errString(err), tt.wantErr)
			}
			if isIgnored(err) != tt.wantIgnored {
				t.Errorf("IgnoredError = %v, want %v", isIgnored(err), tt.wantIgnored)
			}
			var wantEvents []string
			if tt.wantEvent != "" {
				wantEvents = []string{tt.wantEvent}
			}
			if got := h.events(); strings.Join(got, "|") != strings.Join(wantEvents, "|") {
				t.Errorf("events = %q, want %q", got, wantEvents)
			}
			if n := len(h.driver.createCalls()); n != 0 {
				t.Errorf("CreateVolume calls = %d, want 0", n)
			}
			if err := h.p.CheckProvision(h.ctx, tt.claim, class); err == nil {
				t.Error("CheckProvision = nil, want an error")
			}
		})
	}
}

// TestVolumeAttributesClass covers reference §2a "VolumeAttributesClass".
func TestVolumeAttributesClass(t *testing.T) {
	modify := func(c *csiclient.Capabilities) { c.ModifyVolume = true }
	tests := []struct {
		name        string
		caps        func(*csiclient.Capabilities)
		gate        bool
		unserved    bool // the API server serves no storage.k8s.io/v1 classes
		vacs        []*storagev1.VolumeAttributesClass
		wantState   controller.ProvisioningState
		wantErr     string
		wantMutable map[string]string
		wantPVVAC   string
	}{
		{
			name: "parameters become mutable parameters", caps: modify, gate: true,
			vacs:        []*storagev1.VolumeAttributesClass{volumeAttributesClass("gold", testDriver, map[string]string{"iops": "300"})},
			wantState:   controller.ProvisioningFinished,
			wantMutable: map[string]string{"iops": "300"}, wantPVVAC: "gold",
		},
		{
			name: "driver without MODIFY_VOLUME", gate: true,
			vacs:      []*storagev1.VolumeAttributesClass{volumeAttributesClass("gold", testDriver, nil)},
			wantState: controller.ProvisioningFinished,
			wantErr:   "CSI driver does not support VolumeAttributesClass: controller MODIFY_VOLUME capability is not reported",
		},
		{
			name: "class not found", caps: modify, gate: true,
			wantState: controller.ProvisioningNoChange, wantErr: `volumeattributesclasses.storage.k8s.io "gold" not found`,
		},
		{
			name: "class of another driver", caps: modify, gate: true,
			vacs:      []*storagev1.VolumeAttributesClass{volumeAttributesClass("gold", "other.example.com", nil)},
			wantState: controller.ProvisioningFinished,
			wantErr:   "VAC gold referenced in PVC is for driver other.example.com which does not match driver name " + testDriver,
		},
		{name: "gate off ignores the class", gate: false, wantState: controller.ProvisioningFinished},
		{
			name: "v1 not served (before v1.34)", caps: modify, gate: true, unserved: true,
			wantState: controller.ProvisioningFinished,
			wantErr:   `VolumeAttributesClass "gold" cannot be read: the API server does not serve storage.k8s.io/v1 VolumeAttributesClasses`,
		},
		{name: "v1 not served, gate off", gate: false, unserved: true, wantState: controller.ProvisioningFinished},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			caps := baseCaps()
			if tt.caps != nil {
				tt.caps(&caps)
			}
			claim := newClaim("c").VolumeAttributesClass("gold").Obj()
			class := newClass().Obj()
			o := objs(claim, class)
			for _, v := range tt.vacs {
				o = append(o, v)
			}
			h := newHarness(t, caps, o, WithVolumeAttributesClass(tt.gate), WithVolumeAttributesClassesServed(!tt.unserved))
			pv, state, err := h.provision(claim, class)
			if state != tt.wantState || !strings.Contains(errString(err), tt.wantErr) || (tt.wantErr == "") != (err == nil) {
				t.Fatalf("Provision = %v, %q; want %v, %q", state, errString(err), tt.wantState, tt.wantErr)
			}
			if err != nil {
				return
			}
			if got := h.driver.createCalls()[0].GetMutableParameters(); !maps.Equal(got, tt.wantMutable) {
				t.Errorf("mutable parameters = %v, want %v", got, tt.wantMutable)
			}
			got := ""
			if pv.Spec.VolumeAttributesClassName != nil {
				got = *pv.Spec.VolumeAttributesClassName
			}
			if got != tt.wantPVVAC {
				t.Errorf("PV volumeAttributesClassName = %q, want %q", got, tt.wantPVVAC)
			}
		})
	}
}

// TestCheckProvision covers the binder's check: nil exactly when a
// CreateVolume could be sent, with no write and no event.
func TestCheckProvision(t *testing.T) {
	tests := []struct {
		name    string
		class   *storagev1.StorageClass
		claim   *corev1.PersistentVolumeClaim
		wantErr string
	}{
		{name: "valid", class: newClass().Obj(), claim: testutil.NewPVC(testNS, "c").UID("u").Class(testClass).Obj()},
		{
			name: "secret present", claim: testutil.NewPVC(testNS, "c").UID("u").Class(testClass).Obj(),
			class: newClass().Param(defaultSecret.nameKey, "s").Param(defaultSecret.namespaceKey, "ns").Obj(),
		},
		{
			name: "secret missing", claim: testutil.NewPVC(testNS, "c").UID("u").Class(testClass).Obj(),
			class:   newClass().Param(defaultSecret.nameKey, "nope").Param(defaultSecret.namespaceKey, "ns").Obj(),
			wantErr: `secrets "nope" not found`,
		},
		{
			name: "invalid parameter", claim: testutil.NewPVC(testNS, "c").UID("u").Class(testClass).Obj(),
			class: newClass().Param(reservedPrefix+"x", "y").Obj(), wantErr: "found unknown parameter key",
		},
		{
			name: "selector", claim: testutil.NewPVC(testNS, "c").UID("u").Class(testClass).Selector(map[string]string{"a": "b"}).Obj(),
			class: newClass().Obj(), wantErr: "claim Selector is not supported",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, baseCaps(), objs(tt.class, secret("ns", "s", map[string]string{"k": "v"})))
			err := h.p.CheckProvision(h.ctx, tt.claim, tt.class)
			if (tt.wantErr == "") != (err == nil) || !strings.Contains(errString(err), tt.wantErr) {
				t.Errorf("CheckProvision = %v, want %q", err, tt.wantErr)
			}
			if w := h.writes(); len(w) != 0 {
				t.Errorf("writes = %v, want none", w)
			}
			if e := h.events(); len(e) != 0 {
				t.Errorf("events = %v, want none", e)
			}
			if inflight.Has(tt.claim) {
				t.Error("CheckProvision changed the claim")
			}
			if _, cached := h.p.topologies.get(tt.claim.UID); cached {
				t.Error("CheckProvision cached a topology")
			}
		})
	}
}
