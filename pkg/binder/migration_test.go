package binder

import (
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	storagehelpers "k8s.io/component-helpers/storage/volume"

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
	preMigration := boundPV1.DeepCopy()
	metav1.SetMetaDataAnnotation(&preMigration.ObjectMeta, annProvisionedBy, inTreeEBS)
	preMigration.Finalizers = []string{storagehelpers.PVDeletionInTreeProtectionFinalizer, "example.com/other"}
	annealed := preMigration.DeepCopy()
	annealed.Annotations[storagehelpers.AnnMigratedTo] = driver
	annealed.Finalizers = []string{"example.com/other"}
	staticFinalized := boundPV1.DeepCopy()
	staticFinalized.Finalizers = []string{storagehelpers.PVDeletionInTreeProtectionFinalizer}
	// boundPV1 once its claim is gone: Released, with reclaim policy
	// Delete (the builder's default).
	staticReleased := boundPV1.DeepCopy()
	staticReleased.Status.Phase = corev1.VolumeReleased
	migratedReleased := staticReleased.DeepCopy()
	metav1.SetMetaDataAnnotation(&migratedReleased.ObjectMeta, storagehelpers.AnnMigratedTo, driver)
	provisionedReleased := annealed.DeepCopy()
	provisionedReleased.Status.Phase = corev1.VolumeReleased
	otherProvisioner := staticReleased.DeepCopy()
	metav1.SetMetaDataAnnotation(&otherProvisioner.ObjectMeta, annProvisionedBy, "example.com/old-ebs-provisioner")
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
		{
			// Provisioned by kube-controller-manager before the migration:
			// its in-tree finalizer would keep the volume Terminating for
			// ever once the provisioner deleted it through the driver.
			name: "a volume the in-tree plugin provisioned loses kube-controller-manager's finalizer", opts: migration,
			objects: objs(gp2, boundC1, preMigration), sync: "pv/pv1",
			volumes: []*corev1.PersistentVolume{annealed}, actions: []string{"update pv/pv1"},
		},
		{
			name: "an annealed volume is not written again", opts: migration,
			objects: objs(gp2, boundC1, annealed), sync: "pv/pv1",
		},
		{
			// Nor a static one: kube-controller-manager anneals only
			// provisioned volumes.
			name: "a static in-tree volume keeps its finalizers", opts: migration,
			objects: objs(gp2, boundC1, staticFinalized), sync: "pv/pv1",
		},
		{
			name: "without migration the finalizer stays", objects: objs(gp2, boundC1, preMigration), sync: "pv/pv1",
		},
		{
			// The provisioning library deletes an in-tree volume only
			// when provisioned-by or migrated-to names the driver or the
			// plugin: without a word, the Released volume would stay.
			name: "a released static in-tree volume that nobody deletes gets a Warning", opts: migration,
			objects: objs(gp2, boundPV1), sync: "pv/pv1",
			volumes: []*corev1.PersistentVolume{staticReleased}, actions: []string{"get pvc/c1", "status pv/pv1"},
			events: []string{"pv/pv1 Warning VolumeFailedDelete " + fmt.Sprintf(msgInTreeNotDeleted, inTreeEBS, annProvisionedBy, storagehelpers.AnnMigratedTo, driver)},
		},
		{
			name: "a released static in-tree volume migrated to the driver is left to the provisioner", opts: migration,
			objects: objs(gp2, migratedReleased), sync: "pv/pv1",
		},
		{
			name: "a released volume the in-tree plugin provisioned is left to the provisioner", opts: migration,
			objects: objs(gp2, provisionedReleased), sync: "pv/pv1",
		},
		{
			// Another provisioner made it and deletes it: the advice to
			// name the driver in migrated-to would have both delete it.
			name: "a released in-tree volume of another provisioner gets no Warning", opts: migration,
			objects: objs(gp2, otherProvisioner), sync: "pv/pv1",
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

// TestResyncRenewsInTreeNotDeletedWarning: a Released static in-tree volume
// (reclaim policy Delete) that no provisioner deletes is explained only by
// the Warning VolumeFailedDelete that syncVolume posts (release ->
// reportUndeletableInTree); the README says it "stays Released with a
// Warning". The API server drops events after an hour, and the binder's
// recorder renews a cause every 30 minutes, but only when a sync runs: the
// selective resync must therefore queue that volume.
func TestResyncRenewsInTreeNotDeletedWarning(t *testing.T) {
	gp2 := testutil.NewSC("gp2", inTreeEBS).Obj()
	_, boundPV1 := boundPair(claimB("c1").Class("gp2").Obj(), ebsVolume("pv1"))
	released := boundPV1.DeepCopy() // claim c1 is gone
	released.Status.Phase = corev1.VolumeReleased

	f := newFixture(t, objs(gp2, released), WithInTreeMigration(inTreeEBS))
	// The sync of that state does report something: the Warning.
	if _, err := f.runSync("pv/pv1"); err != nil {
		t.Fatal(err)
	}
	if ev := f.events.take(); len(ev) != 1 {
		t.Fatalf("sync of the released static in-tree volume posted %q, want its one Warning", ev)
	}
	// An hour later the event is gone from the API server; the resync is
	// the only thing that can post it again.
	f.clock.Step(time.Hour)
	f.binder.resync(f.ctx)
	if got := f.queued(); !slices.Contains(got, "pv/pv1") {
		t.Errorf("resync queued %v: the Released in-tree volume whose only explanation is an event is never synced again (volumeNeedsWork = %v)",
			got, f.binder.volumeNeedsWork(f.binder.getVolume("pv1")))
	}
}
