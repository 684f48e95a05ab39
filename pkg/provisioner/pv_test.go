package provisioner

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/encoding/protojson"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/runtime"
	storagehelpers "k8s.io/component-helpers/storage/volume"
	"sigs.k8s.io/sig-storage-lib-external-provisioner/v13/controller"
	"sigs.k8s.io/yaml"

	"github.com/kube-storage/csi-provisioner/internal/testutil"
	"github.com/kube-storage/csi-provisioner/pkg/csiclient"
	"github.com/kube-storage/csi-provisioner/pkg/inflight"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// TestGolden provisions a few complete claims and compares the
// CreateVolumeRequest and the PV with testdata/<case>.{request,pv}.yaml
// (go test -run TestGolden -update rewrites them).
func TestGolden(t *testing.T) {
	ro := corev1.ReadOnlyMany
	tests := []struct {
		name  string
		caps  func(*csiclient.Capabilities)
		opts  []Option
		claim *corev1.PersistentVolumeClaim
		class *storagev1.StorageClass
		objs  []runtime.Object
		vol   *csi.Volume
	}{
		{
			name: "filesystem",
			opts: []Option{WithExtraCreateMetadata(true), WithDefaultFSType("ext4")},
			claim: newClaim("data").Size("5Gi").Annotation("team", "storage").
				AccessModes(corev1.ReadWriteOnce, corev1.ReadWriteMany).Finalizers(inflight.Finalizer).Obj(),
			class: newClass().ReclaimPolicy(corev1.PersistentVolumeReclaimRetain).MountOptions("noatime").
				Param("tier", "gold").Param(prefixedFSTypeKey, "xfs").
				Param(provisionerSecret.nameKey, "${pvc.annotations['team']}-creds").Param(provisionerSecret.namespaceKey, "${pvc.namespace}").
				Param(nodeStageSecret.nameKey, "stage").Param(nodeStageSecret.namespaceKey, "kube-system").
				Param(controllerModifySecret.nameKey, "modify").Param(controllerModifySecret.namespaceKey, "kube-system").Obj(),
			objs: objs(secret(testNS, "storage-creds", map[string]string{"password": "s3cr3t"})),
			vol: &csi.Volume{
				VolumeId: "vol-7", CapacityBytes: 0,
				VolumeContext: map[string]string{"server": "10.0.0.1", volumeAttributeIdentity: "driver-wins"},
			},
		},
		{
			name: "block-topology-readonly",
			caps: func(c *csiclient.Capabilities) { c.VolumeAccessibility, c.ModifyVolume = true, true },
			opts: []Option{WithControllerPublishReadOnly(true)},
			claim: newClaim("logs").Block().AccessModes(ro).VolumeAttributesClass("fast").
				Annotation(storagehelpers.AnnSelectedNode, "n2").Obj(),
			class: newClass().WaitForFirstConsumer().Param(prefixedFSTypeKey, "xfs").AllowedTopology(keyZone, "a", "b").Obj(),
			objs:  append(cluster(), volumeAttributesClass("fast", testDriver, map[string]string{"iops": "3000"})),
			vol: &csi.Volume{
				VolumeId: "vol-9", CapacityBytes: 3 << 30,
				AccessibleTopology: topos(topo(keyZone, "b", keyRack, "r2")),
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			caps := baseCaps()
			if tt.caps != nil {
				tt.caps(&caps)
			}
			h := newHarness(t, caps, append(tt.objs, tt.claim, tt.class), tt.opts...)
			h.driver.createAnswers = []createAnswer{{vol: tt.vol}}
			pv, state, err := h.provision(tt.claim, tt.class)
			if err != nil || state != controller.ProvisioningFinished {
				t.Fatalf("Provision = %v, %v", state, err)
			}
			reqJSON, err := protojson.Marshal(h.driver.createCalls()[0])
			if err != nil {
				t.Fatal(err)
			}
			var req any
			if err := json.Unmarshal(reqJSON, &req); err != nil {
				t.Fatal(err)
			}
			compareGolden(t, tt.name+".request.yaml", req)
			compareGolden(t, tt.name+".pv.yaml", pv)
		})
	}
}

func compareGolden(t *testing.T, name string, obj any) {
	t.Helper()
	got, err := yaml.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from the golden file:\n--- got\n%s\n--- want\n%s", name, got, want)
	}
}

// TestPersistentVolumeReadOnly covers --controller-publish-readonly: only a
// volume requested with the single access mode ReadOnlyMany is read-only.
func TestPersistentVolumeReadOnly(t *testing.T) {
	tests := []struct {
		name  string
		modes []corev1.PersistentVolumeAccessMode
		flag  bool
		want  bool
	}{
		{name: "ROX with the flag", modes: []corev1.PersistentVolumeAccessMode{corev1.ReadOnlyMany}, flag: true, want: true},
		{name: "ROX without the flag", modes: []corev1.PersistentVolumeAccessMode{corev1.ReadOnlyMany}},
		{name: "RWO with the flag", modes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, flag: true},
		{name: "ROX and RWX with the flag", modes: []corev1.PersistentVolumeAccessMode{corev1.ReadOnlyMany, corev1.ReadWriteMany}, flag: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			claim := testutil.NewPVC(testNS, "c").UID("u").Class(testClass).
				Annotation(storagehelpers.AnnStorageProvisioner, testDriver).AccessModes(tt.modes...).Obj()
			class := newClass().Obj()
			h := newHarness(t, baseCaps(), objs(claim, class), WithControllerPublishReadOnly(tt.flag))
			pv, _, err := h.provision(claim, class)
			if err != nil {
				t.Fatal(err)
			}
			if pv.Spec.CSI.ReadOnly != tt.want {
				t.Errorf("readOnly = %v, want %v", pv.Spec.CSI.ReadOnly, tt.want)
			}
		})
	}
}
