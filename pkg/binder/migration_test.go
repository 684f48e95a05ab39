package binder

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"

	"github.com/kube-storage/csi-provisioner/internal/testutil"
)

// inTreeEBS is an in-tree plugin that migrates to a CSI driver; the tests
// pretend the driver under test is its target.
const inTreeEBS = "kubernetes.io/aws-ebs"

// ebsVolume is a static in-tree volume of that plugin, of class gp2.
func ebsVolume(name string) *corev1.PersistentVolume {
	pv := volumeB(name).NotCSI().Class("gp2").Obj()
	pv.Spec.AWSElasticBlockStore = &corev1.AWSElasticBlockStoreVolumeSource{VolumeID: "vol-0123456789abcdef0"}
	return pv
}

func TestInTreeMigration(t *testing.T) {
	gp2 := testutil.NewSC("gp2", inTreeEBS).Obj()
	c1 := claimB("c1").Class("gp2").Obj()
	static := ebsVolume("pv1")
	boundC1, boundPV1 := boundPair(c1, static)
	migration := []Option{WithInTreeMigration(inTreeEBS)}
	runSyncCases(t, []syncCase{
		{
			name: "a claim of the in-tree class is handed to the driver", opts: migration,
			objects: objs(gp2, c1), sync: "pvc/c1",
			claims: []*corev1.PersistentVolumeClaim{handedOver(c1, true)}, actions: []string{"update pvc/c1"},
			requeueAfter: 29 * time.Second,
		},
		{
			name: "a static volume of the in-tree plugin binds", opts: migration,
			objects: objs(gp2, c1, static), sync: "pvc/c1",
			claims: []*corev1.PersistentVolumeClaim{boundC1}, volumes: []*corev1.PersistentVolume{boundPV1},
			actions: bindActions,
		},
		{
			name: "without migration the in-tree class is not the driver's", objects: objs(gp2, c1, static), sync: "pvc/c1",
		},
	})
}

func TestInTreeMigrationScope(t *testing.T) {
	gce := volumeB("gce").NotCSI().Obj()
	gce.Spec.GCEPersistentDisk = &corev1.GCEPersistentDiskVolumeSource{PDName: "disk"}
	provisioned := volumeB("prov").NotCSI().Annotation(annProvisionedBy, inTreeEBS).Obj()
	for _, tt := range []struct {
		pv        *corev1.PersistentVolume
		migration bool
		want      bool
	}{
		{ebsVolume("ebs"), true, true},
		{ebsVolume("ebs"), false, false},
		{provisioned, true, true},
		{gce, true, false},
		{volumeB("csi").Obj(), true, true},
	} {
		var opts []Option
		if tt.migration {
			opts = append(opts, WithInTreeMigration(inTreeEBS))
		}
		f := newFixture(t, nil, opts...)
		if got := f.binder.volumeInScope(tt.pv); got != tt.want {
			t.Errorf("migration %v: volumeInScope(%s) = %v, want %v", tt.migration, tt.pv.Name, got, tt.want)
		}
	}
	f := newFixture(t, nil, WithInTreeMigration(inTreeEBS))
	if !f.binder.ownsClass(testutil.NewSC("gp2", inTreeEBS).Obj()) || f.binder.ownsClass(&storagev1.StorageClass{Provisioner: "kubernetes.io/gce-pd"}) {
		t.Error("ownsClass does not take exactly the driver's and the migrated plugin's classes")
	}
}
