package provisioner

import (
	"slices"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	storagehelpers "k8s.io/component-helpers/storage/volume"
	"k8s.io/klog/v2"
	"sigs.k8s.io/sig-storage-lib-external-provisioner/v13/controller"

	"github.com/kube-storage/csi-provisioner/internal/testutil"
	"github.com/kube-storage/csi-provisioner/pkg/csiclient"
	"github.com/kube-storage/csi-provisioner/pkg/inflight"
)

// The driver under test is the migration target of an in-tree plugin.
const (
	ebsDriver = "ebs.csi.aws.com"
	ebsInTree = "kubernetes.io/aws-ebs"
)

func ebsCaps() csiclient.Capabilities {
	c := baseCaps()
	c.DriverName = ebsDriver
	return c
}

// ebsClaim is a claim of the in-tree class "gp2", annotated for the driver
// as the binder hands it over.
func ebsClaim(name string) *testutil.PVCBuilder {
	return testutil.NewPVC(testNS, name).UID("uid-"+name).Class("gp2").
		Annotation(storagehelpers.AnnStorageProvisioner, ebsDriver)
}

func TestMigrationProvision(t *testing.T) {
	claim := ebsClaim("c").Obj()
	class := testutil.NewSC("gp2", ebsInTree).Param("type", "gp2").Param("fsType", "xfs").Obj()
	h := newHarness(t, ebsCaps(), objs(claim, class), WithInTreeMigration(ebsInTree))
	if !h.p.ShouldProvision(h.ctx, claim) {
		t.Fatalf("ShouldProvision = false for a claim of the migrated plugin's class; events %v", h.events())
	}
	if err := h.p.CheckProvision(h.ctx, claim, class); err != nil {
		t.Errorf("CheckProvision: %v", err)
	}
	pv, state, err := h.provision(claim, class)
	if err != nil || state != controller.ProvisioningFinished {
		t.Fatalf("Provision = %v, %v", state, err)
	}
	creates := h.driver.createCalls()
	if len(creates) != 1 {
		t.Fatalf("%d CreateVolume calls", len(creates))
	}
	req := creates[0]
	if got := req.GetParameters(); len(got) != 1 || got["type"] != "gp2" {
		t.Errorf("CreateVolume parameters %v, want the translated class's: type=gp2 only", got)
	}
	if fs := req.GetVolumeCapabilities()[0].GetMount().GetFsType(); fs != "xfs" {
		t.Errorf("CreateVolume fsType %q, want the in-tree class's xfs", fs)
	}
	ebs := pv.Spec.AWSElasticBlockStore
	if pv.Spec.CSI != nil || ebs == nil || ebs.VolumeID != "id-"+req.GetName() || ebs.FSType != "xfs" {
		t.Errorf("PV source CSI %+v, awsElasticBlockStore %+v; want only the in-tree source with the volume's ID and fsType xfs", pv.Spec.CSI, ebs)
	}
	if got := pv.Annotations[storagehelpers.AnnMigratedTo]; got != ebsDriver {
		t.Errorf("PV %s = %q, want %s", storagehelpers.AnnMigratedTo, got, ebsDriver)
	}
	if src, err := h.p.csiVolume(klog.FromContext(h.ctx), pv); err != nil || src == nil || src.VolumeHandle != "id-"+req.GetName() {
		t.Errorf("the provisioned PV translates back to %+v, %v", src, err)
	}
}

// TestMigrationAnnotatedInTree: a claim whose storage-provisioner
// annotation names the in-tree plugin is the driver's only when
// pv.kubernetes.io/migrated-to names the driver and migration is on (as
// upstream's ShouldProvision and the library's known provisioner names
// decide together).
func TestMigrationAnnotatedInTree(t *testing.T) {
	tests := []struct {
		name       string
		migratedTo string
		migration  bool
		want       bool
	}{
		{name: "migrated-to the driver", migratedTo: ebsDriver, migration: true, want: true},
		{name: "no migrated-to", migration: true},
		{name: "migrated-to another driver", migratedTo: "other.csi.example.com", migration: true},
		{name: "migrated-to the driver, migration off", migratedTo: ebsDriver},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := testutil.NewPVC(testNS, "c").UID("uid-c").Class("gp2").Annotation(storagehelpers.AnnStorageProvisioner, ebsInTree)
			if tt.migratedTo != "" {
				b.Annotation(storagehelpers.AnnMigratedTo, tt.migratedTo)
			}
			claim := b.Obj()
			class := testutil.NewSC("gp2", ebsInTree).Param("type", "gp2").Obj()
			var opts []Option
			if tt.migration {
				opts = append(opts, WithInTreeMigration(ebsInTree))
			}
			h := newHarness(t, ebsCaps(), objs(claim, class), opts...)
			if got := h.p.ShouldProvision(h.ctx, claim); got != tt.want {
				t.Fatalf("ShouldProvision = %v, want %v; events %v", got, tt.want, h.events())
			}
			_, state, err := h.provision(claim, class)
			if got := !isIgnoredError(err); got != tt.want {
				t.Fatalf("Provision = %v, %v; want it provisioned: %v", state, err, tt.want)
			}
			if tt.want && (err != nil || len(h.driver.createCalls()) != 1) {
				t.Errorf("Provision = %v, %v with %d CreateVolume calls, want one volume", state, err, len(h.driver.createCalls()))
			}
		})
	}
}

func TestMigrationOff(t *testing.T) {
	claim := ebsClaim("c").Obj()
	class := testutil.NewSC("gp2", ebsInTree).Obj()
	h := newHarness(t, ebsCaps(), objs(claim, class))
	if h.p.ShouldProvision(h.ctx, claim) {
		t.Error("ShouldProvision = true for an in-tree class without migration")
	}
	if ev := h.events(); len(ev) != 1 || !strings.Contains(ev[0], `names provisioner "kubernetes.io/aws-ebs"`) {
		t.Errorf("events %v, want one Warning naming the in-tree provisioner", ev)
	}
}

func TestMigrationDelete(t *testing.T) {
	inTree := func() *corev1.PersistentVolume {
		pv := testutil.NewPV("pv-ebs", ebsDriver).NotCSI().Annotation(storagehelpers.AnnDynamicallyProvisioned, ebsInTree).Obj()
		pv.Spec.AWSElasticBlockStore = &corev1.AWSElasticBlockStoreVolumeSource{VolumeID: "aws://us-east-1a/vol-0123456789abcdef0"}
		return pv
	}
	gce := testutil.NewPV("pv-gce", ebsDriver).NotCSI().Obj()
	gce.Spec.GCEPersistentDisk = &corev1.GCEPersistentDiskVolumeSource{PDName: "disk"}
	for _, tt := range []struct {
		name      string
		pv        *corev1.PersistentVolume
		migration bool
		wantID    string // "" for an ignored volume
	}{
		{"in-tree volume of the migrated plugin", inTree(), true, "vol-0123456789abcdef0"},
		{"the same without migration", inTree(), false, ""},
		{"in-tree volume of another plugin", gce, true, ""},
		{"CSI volume of the driver", testutil.NewPV("pv-csi", ebsDriver).Obj(), true, "handle-pv-csi"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var opts []Option
			if tt.migration {
				opts = append(opts, WithInTreeMigration(ebsInTree))
			}
			h := newHarness(t, ebsCaps(), objs(tt.pv), opts...)
			err := h.p.Delete(h.ctx, tt.pv)
			deletes := h.driver.deleteCalls()
			if tt.wantID == "" {
				if !isIgnored(err) || len(deletes) != 0 {
					t.Errorf("Delete = %v with %d DeleteVolume calls, want an ignored volume", err, len(deletes))
				}
				return
			}
			if err != nil || len(deletes) != 1 || deletes[0].GetVolumeId() != tt.wantID {
				t.Errorf("Delete = %v, DeleteVolume calls %v; want one of %s", err, deletes, tt.wantID)
			}
		})
	}
}

// TestMigrationGuard: the in-flight guard recognizes the in-tree PV of a
// migrated claim as the record of its volume.
func TestMigrationGuard(t *testing.T) {
	claim := ebsClaim("c").Obj()
	pv := testutil.NewPV("pv-ebs", ebsDriver).NotCSI().BoundTo(claim).Annotation(storagehelpers.AnnDynamicallyProvisioned, ebsInTree).Obj()
	pv.Spec.AWSElasticBlockStore = &corev1.AWSElasticBlockStoreVolumeSource{VolumeID: "vol-0123456789abcdef0"}
	for _, migration := range []bool{true, false} {
		var opts []Option
		if migration {
			opts = append(opts, WithInTreeMigration(ebsInTree))
		}
		h := newHarness(t, ebsCaps(), objs(claim, pv), opts...)
		if got := h.p.provisionedVolume(klog.FromContext(h.ctx), claim) != nil; got != migration {
			t.Errorf("migration %v: the guard finds the in-tree PV: %v", migration, got)
		}
	}
}

// TestMigrationClone: a claim of the in-tree class clones a claim bound to
// an in-tree volume of the plugin from that volume's ID.
func TestMigrationClone(t *testing.T) {
	src := ebsClaim("src").VolumeName("pv-src").Phase(corev1.ClaimBound).Obj()
	pv := testutil.NewPV("pv-src", ebsDriver).NotCSI().BoundTo(src).Phase(corev1.VolumeBound).Obj()
	pv.Spec.AWSElasticBlockStore = &corev1.AWSElasticBlockStoreVolumeSource{VolumeID: "vol-0123456789abcdef0"}
	clone := ebsClaim("clone").DataSource(nil, kindClaim, "src").Obj()
	class := testutil.NewSC("gp2", ebsInTree).Obj()
	caps := ebsCaps()
	caps.CloneVolume = true
	h := newHarness(t, caps, objs(src, pv, clone, class), WithInTreeMigration(ebsInTree))
	if _, _, err := h.provision(clone, class); err != nil {
		t.Fatalf("Provision: %v", err)
	}
	if got := h.driver.createCalls()[0].GetVolumeContentSource().GetVolume().GetVolumeId(); got != "vol-0123456789abcdef0" {
		t.Errorf("cloned from %q, want the in-tree volume's ID", got)
	}
}

// TestMigrationDeleteSecretFromInTreeClass: an in-tree volume provisioned
// before the migration has no deletion-secret annotations, so Delete
// resolves the provisioner secret from its class; the class is the in-tree
// plugin's and must be translated first, as upstream's getSecretsFromSC
// does (Portworx names its secret openstorage.io/auth-secret-*, which the
// translation turns into the provisioner secret).
func TestMigrationDeleteSecretFromInTreeClass(t *testing.T) {
	const (
		pxDriver = "pxd.portworx.com"
		pxInTree = "kubernetes.io/portworx-volume"
	)
	pv := testutil.NewPV("pv-px", pxDriver).NotCSI().Class("px").ClaimRef(testNS, "c", "uid-c").Phase(corev1.VolumeReleased).
		Annotation(storagehelpers.AnnDynamicallyProvisioned, pxInTree).Obj()
	pv.Spec.PortworxVolume = &corev1.PortworxVolumeSource{VolumeID: "px-vol-1"}
	class := testutil.NewSC("px", pxInTree).
		Param("openstorage.io/auth-secret-name", "px-token").Param("openstorage.io/auth-secret-namespace", "kube-system").Obj()
	caps := baseCaps()
	caps.DriverName = pxDriver
	h := newHarness(t, caps, objs(pv, class, secret("kube-system", "px-token", map[string]string{"auth-token": "t"})),
		WithInTreeMigration(pxInTree))
	if err := h.p.Delete(h.ctx, pv); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	deletes := h.driver.deleteCalls()
	if len(deletes) != 1 || deletes[0].GetVolumeId() != "px-vol-1" {
		t.Fatalf("DeleteVolume calls %v, want one of px-vol-1", deletes)
	}
	if got := deletes[0].GetSecrets(); got["auth-token"] != "t" {
		t.Errorf("DeleteVolume secrets %v, want the translated class's provisioner secret kube-system/px-token", got)
	}
}

// TestDeleteSharedVolumeMigrated: with --migrated-in-tree, an in-tree PV of
// the migrated plugin records a volume of this driver, so Delete of another
// PV recording the same volume refuses while it is Bound, whichever of the
// two is in-tree.
func TestDeleteSharedVolumeMigrated(t *testing.T) {
	const volumeID = "vol-0123456789abcdef0"
	inTree := func(name string, phase corev1.PersistentVolumePhase) *corev1.PersistentVolume {
		pv := testutil.NewPV(name, ebsDriver).NotCSI().Class("gp2").ClaimRef(testNS, "c-"+name, "uid-c-"+name).Phase(phase).
			Annotation(storagehelpers.AnnDynamicallyProvisioned, ebsInTree).Obj()
		pv.Spec.AWSElasticBlockStore = &corev1.AWSElasticBlockStoreVolumeSource{VolumeID: "aws://us-east-1a/" + volumeID}
		return pv
	}
	csiPV := func(name string, phase corev1.PersistentVolumePhase) *corev1.PersistentVolume {
		pv := testutil.NewPV(name, ebsDriver).Class("gp2").ClaimRef(testNS, "c-"+name, "uid-c-"+name).Phase(phase).Obj()
		pv.Spec.CSI.VolumeHandle = volumeID
		return pv
	}
	for _, tt := range []struct {
		name            string
		released, bound *corev1.PersistentVolume
	}{
		{"CSI released, CSI Bound", csiPV("pv-a", corev1.VolumeReleased), csiPV("pv-b", corev1.VolumeBound)},
		{"in-tree released, in-tree Bound", inTree("pv-a", corev1.VolumeReleased), inTree("pv-b", corev1.VolumeBound)},
		{"CSI released, in-tree Bound", csiPV("pv-a", corev1.VolumeReleased), inTree("pv-b", corev1.VolumeBound)},
		{"in-tree released, CSI Bound", inTree("pv-a", corev1.VolumeReleased), csiPV("pv-b", corev1.VolumeBound)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, ebsCaps(), objs(tt.released, tt.bound), WithInTreeMigration(ebsInTree))
			err := h.p.Delete(h.ctx, tt.released)
			if calls := h.driver.deleteCalls(); len(calls) != 0 {
				t.Fatalf("DeleteVolume(%s) sent (Delete = %v) while Bound PV %s records the same volume", calls[0].GetVolumeId(), err, tt.bound.Name)
			}
			if err == nil || !strings.Contains(err.Error(), tt.bound.Name) {
				t.Fatalf("Delete = %v, want an error naming %s", err, tt.bound.Name)
			}
		})
	}
}

// TestMigrationUntranslatableVolumeDeleted: a volume created for a claim of
// the migrated plugin's class whose CSI PV cannot be translated back to the
// in-tree source (here the driver reports a zone csi-translation-lib cannot
// parse into an AWS region) is deleted again, as upstream does, so nothing
// leaks, and a claim being deleted goes. Before, the volume was kept and
// the claim kept the in-flight finalizer: Terminating for ever.
func TestMigrationUntranslatableVolumeDeleted(t *testing.T) {
	for _, deleting := range []bool{false, true} {
		name := "pending"
		if deleting {
			name = "deleting"
		}
		t.Run(name, func(t *testing.T) {
			b := ebsClaim("c").Finalizers(inflight.Finalizer)
			if deleting {
				b = b.Deleted()
			}
			claim := b.Obj()
			class := testutil.NewSC("gp2", ebsInTree).Param("type", "gp2").Param("zone", "snow").Obj()
			caps := topologyCaps()
			caps.DriverName = ebsDriver
			h := newHarness(t, caps, objs(claim, class), WithInTreeMigration(ebsInTree))
			h.driver.createAnswers = []createAnswer{{vol: &csi.Volume{
				VolumeId: "vol-0123456789abcdef0", CapacityBytes: 1 << 30,
				AccessibleTopology: []*csi.Topology{{Segments: map[string]string{"topology.ebs.csi.aws.com/zone": "snow"}}},
			}}}
			for i := 0; i < 3; i++ { // the library's retries
				pv, state, err := h.provision(claim, class)
				t.Logf("Provision #%d = %v, %v, %v", i+1, pv != nil, state, err)
				if pv != nil {
					t.Fatalf("got a PV; the test needs an untranslatable volume")
				}
				if i == 0 && (err == nil || strings.Contains(err.Error(), "ObjectMeta") || !strings.Contains(err.Error(), "failed to translate topology: Failed to handle region topology. error: Unexpected zone format: snow is not a valid AWS zone")) {
					t.Errorf("Provision error %q, want the translation's cause without the PV's dump", err)
				}
			}
			if n := len(h.driver.createCalls()); n == 0 {
				t.Fatal("no CreateVolume")
			}
			if n := len(h.driver.deleteCalls()); n == 0 {
				t.Errorf("%d CreateVolume calls created volume vol-0123456789abcdef0, which no PV can record, and it was never deleted (upstream deletes it)", len(h.driver.createCalls()))
			}
			if deleting {
				if err := h.p.guardSync(h.ctx, testNS+"/c"); err != nil {
					t.Logf("guardSync = %v", err)
				}
			}
			if deleting && slices.Contains(h.liveClaim(claim).Finalizers, inflight.Finalizer) {
				t.Errorf("the claim being deleted keeps %s: it stays Terminating for ever", inflight.Finalizer)
			}
		})
	}
}
