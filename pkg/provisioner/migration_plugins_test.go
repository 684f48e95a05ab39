package provisioner

import (
	"maps"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	storagehelpers "k8s.io/component-helpers/storage/volume"
	"sigs.k8s.io/sig-storage-lib-external-provisioner/v13/controller"

	"github.com/kube-storage/csi-provisioner/internal/testutil"
)

// TestMigrationPlugins runs every in-tree plugin csi-translation-lib
// migrates through Provision and Delete with a driver of the target's name
// answering as that driver does: the class's parameters and zones are
// translated for CreateVolume, the PV gets the plugin's in-tree source
// (with the in-tree topology keys), migrated-to names the driver, and
// Delete sends the handle the in-tree PV translates back to.
func TestMigrationPlugins(t *testing.T) {
	zone := func(key, value string) *csi.Topology { return &csi.Topology{Segments: map[string]string{key: value}} }
	for _, tt := range []struct {
		driver, inTree string
		params         map[string]string
		vol            *csi.Volume // the driver's answer
		wantParams     map[string]string
		wantRequisite  []*csi.Topology // nil: no topology
		inTreeID       func(*corev1.PersistentVolume) string
		wantID         string // the in-tree source's volume ID
		wantDelete     string // DeleteVolume's volume ID
	}{
		{
			driver: "ebs.csi.aws.com", inTree: "kubernetes.io/aws-ebs",
			params:        map[string]string{"type": "gp3", "zone": "us-east-1a", "iopsPerGB": "10"},
			vol:           &csi.Volume{VolumeId: "vol-1", AccessibleTopology: []*csi.Topology{zone("topology.ebs.csi.aws.com/zone", "us-east-1a")}},
			wantParams:    map[string]string{"type": "gp3", "iopsPerGB": "10", "allowautoiopspergbincrease": "true"},
			wantRequisite: []*csi.Topology{zone("topology.ebs.csi.aws.com/zone", "us-east-1a")},
			inTreeID: func(pv *corev1.PersistentVolume) string {
				return pv.Spec.AWSElasticBlockStore.VolumeID
			},
			wantID: "vol-1", wantDelete: "vol-1",
		},
		{
			driver: "pd.csi.storage.gke.io", inTree: "kubernetes.io/gce-pd",
			params: map[string]string{"type": "pd-ssd", "zones": "us-central1-a,us-central1-b", "replication-type": "regional-pd"},
			vol: &csi.Volume{VolumeId: "projects/p/regions/us-central1/disks/pvc-1", AccessibleTopology: []*csi.Topology{
				zone("topology.gke.io/zone", "us-central1-a"), zone("topology.gke.io/zone", "us-central1-b"),
			}},
			wantParams:    map[string]string{"type": "pd-ssd", "replication-type": "regional-pd"},
			wantRequisite: []*csi.Topology{zone("topology.gke.io/zone", "us-central1-a"), zone("topology.gke.io/zone", "us-central1-b")},
			inTreeID: func(pv *corev1.PersistentVolume) string {
				return pv.Spec.GCEPersistentDisk.PDName
			},
			wantID: "pvc-1", wantDelete: "projects/UNSPECIFIED/regions/us-central1/disks/pvc-1",
		},
		{
			driver: "disk.csi.azure.com", inTree: "kubernetes.io/azure-disk",
			params:     map[string]string{"skuName": "Premium_LRS", "kind": "managed"},
			vol:        &csi.Volume{VolumeId: "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/disks/pvc-1"},
			wantParams: map[string]string{"skuName": "Premium_LRS", "kind": "managed"},
			inTreeID: func(pv *corev1.PersistentVolume) string {
				return pv.Spec.AzureDisk.DataDiskURI
			},
			wantID: "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/disks/pvc-1", wantDelete: "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/disks/pvc-1",
		},
		{
			driver: "file.csi.azure.com", inTree: "kubernetes.io/azure-file",
			params:     map[string]string{"skuName": "Standard_LRS", "secretNamespace": "kube-system"},
			vol:        &csi.Volume{VolumeId: "rg#acct#pvc-1###kube-system"},
			wantParams: map[string]string{"skuName": "Standard_LRS", "secretNamespace": "kube-system"},
			inTreeID: func(pv *corev1.PersistentVolume) string {
				return pv.Spec.AzureFile.ShareName
			},
			// The in-tree source keeps the share, the account's secret
			// and, without a secret namespace in the volume context,
			// namespace "default".
			wantID: "pvc-1", wantDelete: "rg#acct#pvc-1#pvc-uid-c#default",
		},
		{
			driver: "cinder.csi.openstack.org", inTree: "kubernetes.io/cinder",
			params:     map[string]string{"availability": "nova", "fsType": "ext4"},
			vol:        &csi.Volume{VolumeId: "c-1"},
			wantParams: map[string]string{"availability": "nova"},
			inTreeID: func(pv *corev1.PersistentVolume) string {
				return pv.Spec.Cinder.VolumeID
			},
			wantID: "c-1", wantDelete: "c-1",
		},
		{
			driver: "csi.vsphere.vmware.com", inTree: "kubernetes.io/vsphere-volume",
			params:     map[string]string{"storagepolicyname": "gold", "diskformat": "thin"},
			vol:        &csi.Volume{VolumeId: "v-1", VolumeContext: map[string]string{"initialvolumefilepath": "[ds] kubevols/pvc-1.vmdk"}},
			wantParams: map[string]string{"storagepolicyname": "gold", "diskformat-migrationparam": "thin", "csimigration": "true"},
			inTreeID: func(pv *corev1.PersistentVolume) string {
				return pv.Spec.VsphereVolume.VolumePath
			},
			wantID: "[ds] kubevols/pvc-1.vmdk", wantDelete: "[ds] kubevols/pvc-1.vmdk",
		},
		{
			driver: "pxd.portworx.com", inTree: "kubernetes.io/portworx-volume",
			params:     map[string]string{"repl": "2"},
			vol:        &csi.Volume{VolumeId: "px-1"},
			wantParams: map[string]string{"repl": "2"},
			inTreeID: func(pv *corev1.PersistentVolume) string {
				return pv.Spec.PortworxVolume.VolumeID
			},
			wantID: "px-1", wantDelete: "px-1",
		},
	} {
		t.Run(tt.inTree, func(t *testing.T) {
			claim := testutil.NewPVC(testNS, "c").UID("uid-c").Class("old").Annotation(storagehelpers.AnnStorageProvisioner, tt.driver).Obj()
			b := testutil.NewSC("old", tt.inTree)
			for k, v := range tt.params {
				b = b.Param(k, v)
			}
			class := b.Obj()
			caps := baseCaps()
			if tt.wantRequisite != nil {
				caps = topologyCaps()
			}
			caps.DriverName = tt.driver
			h := newHarness(t, caps, objs(claim, class), WithInTreeMigration(tt.inTree))
			tt.vol.CapacityBytes = 1 << 30
			h.driver.createAnswers = []createAnswer{{vol: tt.vol}}
			pv, state, err := h.provision(claim, class)
			if err != nil || state != controller.ProvisioningFinished {
				t.Fatalf("Provision = %v, %v", state, err)
			}
			req := h.driver.createCalls()[0]
			if got := req.GetParameters(); !maps.Equal(got, tt.wantParams) {
				t.Errorf("CreateVolume parameters %v, want %v", got, tt.wantParams)
			}
			if got := req.GetAccessibilityRequirements().GetRequisite(); len(got) != len(tt.wantRequisite) ||
				(len(got) > 0 && !maps.Equal(got[0].GetSegments(), tt.wantRequisite[0].GetSegments())) {
				t.Errorf("CreateVolume requisite topology %v, want %v", got, tt.wantRequisite)
			}
			if pv.Spec.CSI != nil {
				t.Fatalf("PV has a CSI source %+v, want only the in-tree one", pv.Spec.CSI)
			}
			if got := tt.inTreeID(pv); got != tt.wantID {
				t.Errorf("in-tree source names %q, want %q", got, tt.wantID)
			}
			if got := pv.Annotations[storagehelpers.AnnMigratedTo]; got != tt.driver {
				t.Errorf("PV %s = %q, want %s", storagehelpers.AnnMigratedTo, got, tt.driver)
			}
			if tt.wantRequisite != nil {
				for _, term := range pv.Spec.NodeAffinity.Required.NodeSelectorTerms {
					for _, r := range term.MatchExpressions {
						if r.Key != corev1.LabelTopologyZone && r.Key != corev1.LabelTopologyRegion {
							t.Errorf("PV node affinity key %s, want the in-tree topology labels", r.Key)
						}
					}
				}
			}
			pv.Spec.ClaimRef = &corev1.ObjectReference{Namespace: testNS, Name: "c", UID: "uid-c"}
			pv.UID = "pv-uid"
			if err := h.p.Delete(h.ctx, pv); err != nil {
				t.Fatalf("Delete: %v", err)
			}
			if deletes := h.driver.deleteCalls(); len(deletes) != 1 || deletes[0].GetVolumeId() != tt.wantDelete {
				t.Errorf("DeleteVolume calls %v, want one of %s", deletes, tt.wantDelete)
			}
		})
	}
}
