package binder

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"

	"github.com/kube-storage/csi-provisioner/internal/events"
	"github.com/kube-storage/csi-provisioner/internal/testutil"
	"github.com/kube-storage/csi-provisioner/pkg/inflight"
)

func TestSyncPreboundClaim(t *testing.T) {
	c1 := claimB("c1").Class("fast").VolumeName("pv1").Obj()
	c1Bound := claimB("c1").Class("fast").VolumeName("pv1").Phase(corev1.ClaimBound).Obj()
	c1Bound.Status.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}
	pv1 := volumeB("pv1").Class("fast").Obj()
	byName := volumeB("pv1").Class("fast").ClaimRef(ns, "c1", "").Obj()
	byUID := volumeB("pv1").Class("fast").BoundTo(c1).Obj()
	toOther := volumeB("pv1").Class("fast").ClaimRef(ns, "other", "uid-other").Obj()
	c1ByCtrl := claimB("c1").Class("fast").VolumeName("pv1").Annotation(annBoundByCtrl, "yes").Obj()
	c1Sel := claimB("c1").Class("fast").VolumeName("pv1").Selector(map[string]string{"tier": "gold"}).Obj()
	cVAC := claimB("c1").Class("fast").VolumeName("pv1").VolumeAttributesClass("gold").Obj()
	pvVAC := volumeB("pv1").Class("fast").VolumeAttributesClass("gold").Obj()
	cOther := claimB("c1").Class("other").VolumeName("pv1").Obj()
	c2OnPV1 := claimB("c2").Class("fast").VolumeName("pv1").Annotation(annBindCompleted, "yes").
		Annotation(annBoundByCtrl, "yes").Phase(corev1.ClaimBound).Obj()

	mismatch := func(reason string) string {
		return `pvc/c1 Warning VolumeMismatch Cannot bind to requested volume "pv1": ` + reason
	}
	// Nobody else reports it: the provisioner skips a claim with
	// spec.volumeName, and kube-controller-manager posts nothing.
	missing := `pvc/c1 Warning FailedBinding Cannot bind to requested volume "pv1": the volume does not exist`
	cases := []syncCase{
		{
			name:    "2-1 claim pre-bound to a missing volume: checked with the API, a Warning says so, nothing written",
			objects: objs(classFast(), c1),
			sync:    "pvc/c1",
			actions: []string{"get pv/pv1"},
			events:  []string{missing},
		},
		{
			name:    "2-1-1 claim pre-bound to a volume the informer has not seen yet: no Warning",
			objects: objs(classFast(), c1, pv1),
			setup:   func(f *fixture) { f.hideFromInformer(pv1) },
			sync:    "pvc/c1",
			actions: []string{"get pv/pv1"},
		},
		{
			name:    "2-2 claim pre-bound to a missing volume: status reset to Pending, and the Warning",
			objects: objs(classFast(), c1Bound),
			sync:    "pvc/c1",
			claims:  []*corev1.PersistentVolumeClaim{pendingStatus(c1Bound)},
			actions: []string{"get pv/pv1", "status pvc/c1"},
			events:  []string{missing},
		},
		{
			name:    "2-2-1 claim of another provisioner pre-bound to a missing volume: out of scope",
			objects: objs(classOther(), cOther),
			sync:    "pvc/c1",
		},
		{
			name:    "2-3 claim pre-bound to an unbound volume: the volume gets bound-by-controller, the claim only bind-completed",
			objects: objs(classFast(), c1, pv1),
			sync:    "pvc/c1",
			claims:  []*corev1.PersistentVolumeClaim{boundClaim(c1, pv1, false)},
			volumes: []*corev1.PersistentVolume{boundVolume(pv1, c1, true)},
			actions: bindActions,
		},
		{
			name:    "2-4 claim pre-bound to a volume pre-bound by name",
			objects: objs(classFast(), c1, byName),
			sync:    "pvc/c1",
			claims:  []*corev1.PersistentVolumeClaim{boundClaim(c1, byName, false)},
			volumes: []*corev1.PersistentVolume{boundVolume(byName, c1, false)},
			actions: bindActions,
		},
		{
			name:    "2-5 claim pre-bound to a volume pre-bound by UID",
			objects: objs(classFast(), c1, byUID),
			sync:    "pvc/c1",
			claims:  []*corev1.PersistentVolumeClaim{boundClaim(c1, byUID, false)},
			volumes: []*corev1.PersistentVolume{boundVolume(byUID, c1, false)},
			actions: []string{"status pv/pv1", "update pvc/c1", "status pvc/c1"},
		},
		{
			name:    "2-6 claim pre-bound by the user to a volume bound elsewhere: wait",
			objects: objs(classFast(), c1, toOther),
			sync:    "pvc/c1",
			events:  []string{`pvc/c1 Warning FailedBinding volume "pv1" already bound to a different claim.`},
		},
		{
			// Beyond upstream, which hands c2's data to c1.
			name:    "guard: claim pre-bound to a volume whose claimRef was removed while another claim is still bound to it: wait",
			objects: objs(classFast(), c1, c2OnPV1, pv1),
			sync:    "pvc/c1",
			events:  []string{`pvc/c1 Warning FailedBinding volume "pv1" already bound to a different claim.`},
		},
		{
			name:    "guard: the same with the volume pre-bound to the claim by name",
			objects: objs(classFast(), c1, c2OnPV1, byName),
			sync:    "pvc/c1",
			events:  []string{`pvc/c1 Warning FailedBinding volume "pv1" already bound to a different claim.`},
		},
		{
			name:    "2-7 claim bound by a controller to a volume bound elsewhere: error",
			objects: objs(classFast(), c1ByCtrl, toOther),
			sync:    "pvc/c1",
			events:  []string{`pvc/c1 Warning FailedBinding volume "pv1" already bound to a different claim.`},
			wantErr: true,
		},
		{
			name:    "2-8 the selector is not checked for a pre-bound claim",
			objects: objs(classFast(), c1Sel, pv1),
			sync:    "pvc/c1",
			claims:  []*corev1.PersistentVolumeClaim{boundClaim(c1Sel, pv1, false)},
			volumes: []*corev1.PersistentVolume{boundVolume(pv1, c1Sel, true)},
			actions: bindActions,
		},
		{
			name:    "2-9 requested volume too small",
			objects: objs(classFast(), c1, volumeB("pv1").Class("fast").Size("100Mi").Obj()),
			sync:    "pvc/c1",
			events:  []string{mismatch("requested PV is too small")},
		},
		{
			name:    "2-10 requested volume of another class",
			objects: objs(classFast(), c1, volumeB("pv1").Class("slow").Obj()),
			sync:    "pvc/c1",
			events:  []string{mismatch("storageClassName does not match")},
		},
		{
			name:    "2-11 requested volume of another attributes class",
			objects: objs(classFast(), c1, pvVAC),
			sync:    "pvc/c1",
			events:  []string{mismatch("volumeAttributesClassName does not match")},
		},
		{
			name:    "2-12 requested volume of the same attributes class: current class set in the status",
			objects: objs(classFast(), cVAC, pvVAC),
			sync:    "pvc/c1",
			claims:  []*corev1.PersistentVolumeClaim{boundClaim(cVAC, pvVAC, false)},
			volumes: []*corev1.PersistentVolume{boundVolume(pvVAC, cVAC, true)},
			actions: bindActions,
		},
		{
			name:    "14-8 requested volume of another volume mode",
			objects: objs(classFast(), c1, volumeB("pv1").Class("fast").Block().Obj()),
			sync:    "pvc/c1",
			events:  []string{mismatch("incompatible volumeMode")},
		},
		{
			name:    "requested volume without the access mode",
			objects: objs(classFast(), c1, volumeB("pv1").Class("fast").AccessModes(corev1.ReadOnlyMany).Obj()),
			sync:    "pvc/c1",
			events:  []string{mismatch("incompatible accessMode")},
		},
		{
			name:    "requested volume being deleted",
			objects: objs(classFast(), c1, volumeB("pv1").Class("fast").Deleted().Obj()),
			sync:    "pvc/c1",
			events:  []string{mismatch(`the volume is marked for deletion "pv1"`)},
		},
		{
			name:    "mismatch on a claim that was Bound: status reset",
			objects: objs(classFast(), c1Bound, volumeB("pv1").Class("fast").Size("100Mi").Obj()),
			sync:    "pvc/c1",
			claims:  []*corev1.PersistentVolumeClaim{pendingStatus(c1Bound)},
			actions: []string{"status pvc/c1"},
			events:  []string{mismatch("requested PV is too small")},
		},
		{
			name:    "scope: claim pre-bound to a volume of another driver",
			objects: objs(classFast(), c1, testutil.NewPV("pv1", otherDriver).Class("fast").Obj()),
			sync:    "pvc/c1",
		},
	}
	runSyncCases(t, cases)
}

func TestSyncBoundClaim(t *testing.T) {
	bound := func(volumeName string) *corev1.PersistentVolumeClaim {
		return claimB("c1").Class("fast").VolumeName(volumeName).Annotation(annBindCompleted, "yes").
			Annotation(annBoundByCtrl, "yes").Phase(corev1.ClaimBound).Obj()
	}
	c1 := bound("pv1")
	c1.Status.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}
	c1.Status.Capacity = corev1.ResourceList{corev1.ResourceStorage: testutil.NewPV("x", driver).Obj().Spec.Capacity[corev1.ResourceStorage]}
	c1NoVolume := bound("")
	c1VAC := c1.DeepCopy()
	c1VAC.Status.CurrentVolumeAttributesClassName = ptr.To("gold")
	c1Lost := bound("pv1")
	c1Lost.Status.Phase = corev1.ClaimLost
	c1Pending := bound("pv1")
	c1Pending.Status.Phase = corev1.ClaimPending
	c1Other := claimB("c1").Class("other").VolumeName("pv1").Annotation(annBindCompleted, "yes").Phase(corev1.ClaimBound).Obj()
	c1Finalizer := c1.DeepCopy()
	inflight.Add(c1Finalizer, "")
	c1NoClass := claimB("c1").Class("").VolumeName("pv1").Annotation(annBindCompleted, "yes").Phase(corev1.ClaimBound).Obj()
	pvNoClass := volumeB("pv1").Class("").BoundTo(c1NoClass).Phase(corev1.VolumeBound).Obj()

	pvBound := volumeB("pv1").Class("fast").BoundTo(c1).Annotation(annBoundByCtrl, "yes").Phase(corev1.VolumeBound).Obj()
	pvProvisioned := volumeB("pv1").Class("fast").BoundTo(c1).Annotation("pv.kubernetes.io/provisioned-by", driver).Phase(corev1.VolumeBound).Obj()
	pvUnbound := volumeB("pv1").Class("fast").Phase(corev1.VolumeBound).Obj()
	pvAvailable := volumeB("pv1").Class("fast").BoundTo(c1).Annotation(annBoundByCtrl, "yes").Obj()
	pvOtherUID := volumeB("pv1").Class("fast").ClaimRef(ns, "c1", "uid-older").Phase(corev1.VolumeBound).Obj()
	pvToOther := volumeB("pv1").Class("fast").ClaimRef(ns, "other", "uid-other").Phase(corev1.VolumeBound).Obj()
	// c1's binding after its volume's claimRef UID was removed by hand and
	// the volume's sync made it Available (upstream's 4-2).
	pvUIDRemoved := volumeB("pv1").Class("fast").ClaimRef(ns, "c1", "").Annotation(annBoundByCtrl, "yes").Phase(corev1.VolumeAvailable).Obj()
	otherBound := claimB("other").Class("fast").VolumeName("pv1").Annotation(annBindCompleted, "yes").Phase(corev1.ClaimBound).Obj()
	lostNamed := func(name string) *corev1.PersistentVolumeClaim {
		return claimB(name).Class("fast").VolumeName("pv1").Annotation(annBindCompleted, "yes").Phase(corev1.ClaimLost).Obj()
	}
	pvLabelled := volumeB("pv1").Class("fast").Label("tier", "bronze").Obj()
	// An unbound volume that does not fit c1, and the same recording c1.
	pvGold := volumeB("pv1").Class("gold").Size("100Gi").Phase(corev1.VolumeAvailable).Obj()
	pvGoldRecorded := recordBoundClaims(pvGold, c1Lost.UID)
	c1Sel := c1.DeepCopy()
	c1Sel.Spec.Selector = &metav1.LabelSelector{MatchLabels: map[string]string{"tier": "gold"}}
	pvPreResize := volumeB("pv1").Class("fast").Size("2Gi").Annotation(annPreResizeCapacity, "1Gi").BoundTo(c1).
		Annotation(annBoundByCtrl, "yes").Phase(corev1.VolumeBound).Obj()
	preResized := boundClaim(c1Pending, pvPreResize, true)
	preResized.Status.Capacity = corev1.ResourceList{corev1.ResourceStorage: testutil.NewPV("x", driver).Size("1Gi").Obj().Spec.Capacity[corev1.ResourceStorage]}

	cases := []syncCase{
		{
			name:    "3-1 bound claim without volumeName: Lost",
			objects: objs(classFast(), c1NoVolume),
			sync:    "pvc/c1",
			claims:  []*corev1.PersistentVolumeClaim{lost(c1NoVolume)},
			actions: []string{"status pvc/c1"},
			events:  []string{"pvc/c1 Warning ClaimLost Bound claim has lost reference to PersistentVolume. Data on the volume is lost!"},
		},
		{
			name:    "3-1-1 already Lost: nothing, no event",
			objects: objs(classFast(), lost(c1NoVolume)),
			sync:    "pvc/c1",
		},
		{
			name:    "3-2 bound claim whose volume is gone: checked with the API, then Lost",
			objects: objs(classFast(), c1),
			sync:    "pvc/c1",
			claims:  []*corev1.PersistentVolumeClaim{lost(c1)},
			actions: []string{"get pv/pv1", "status pvc/c1"},
			events:  []string{"pvc/c1 Warning ClaimLost Bound claim has lost its PersistentVolume. Data on the volume is lost!"},
		},
		{
			// kube-controller-manager clears only the access modes and
			// the capacity.
			name:    "3-2-v bound claim with a current VolumeAttributesClass whose volume is gone: Lost, the class kept",
			objects: objs(classFast(), c1VAC),
			sync:    "pvc/c1",
			claims:  []*corev1.PersistentVolumeClaim{lost(c1VAC)},
			actions: []string{"get pv/pv1", "status pvc/c1"},
			events:  []string{"pvc/c1 Warning ClaimLost Bound claim has lost its PersistentVolume. Data on the volume is lost!"},
		},
		{
			// Seed bug 2 for claims: bound by another binder (the scheduler
			// or kube-controller-manager's) to a volume the informer has not
			// delivered yet. Lost would stop the kubelet from mounting it.
			name:    "3-2-0 bound claim whose volume the informer has not seen yet: read from the API, not Lost",
			objects: objs(classFast(), c1, pvBound),
			setup:   func(f *fixture) { f.hideFromInformer(pvBound) },
			sync:    "pvc/c1",
			actions: []string{"get pv/pv1"},
		},
		{
			name:    "3-2-1 bound claim of another provisioner whose volume is gone: out of scope",
			objects: objs(classOther(), c1Other),
			sync:    "pvc/c1",
		},
		{
			name:    "3-2-2 bound claim of class \"\" whose volume of this driver was deleted: Lost",
			objects: objs(c1NoClass),
			setup:   func(f *fixture) { f.binder.onVolumeDelete(pvNoClass) },
			sync:    "pvc/c1",
			claims:  []*corev1.PersistentVolumeClaim{lost(c1NoClass)},
			actions: []string{"get pv/pv1", "status pvc/c1"},
			events:  []string{"pvc/c1 Warning ClaimLost Bound claim has lost its PersistentVolume. Data on the volume is lost!"},
			queued:  []string{"pvc/ns/c1"}, // by the deletion
		},
		{
			name:    "3-2-3 the same when the deleted volume was another driver's: out of scope",
			objects: objs(c1NoClass),
			setup: func(f *fixture) {
				f.binder.onVolumeDelete(testutil.NewPV("pv1", otherDriver).Class("").BoundTo(c1NoClass).Obj())
			},
			sync: "pvc/c1",
		},
		{
			name:    "3-2-4 the same when the deleted volume named an older claim of the same name: out of scope",
			objects: objs(c1NoClass),
			setup: func(f *fixture) {
				f.binder.onVolumeDelete(volumeB("pv1").Class("").ClaimRef(ns, "c1", "uid-older").Obj())
			},
			sync:   "pvc/c1",
			queued: []string{"pvc/ns/c1"}, // by the deletion
		},
		{
			name:    "3-2-5 the same when nothing recorded the deletion (after a restart): out of scope",
			objects: objs(c1NoClass),
			sync:    "pvc/c1",
		},
		{
			name:    "3-3 bound claim with an unbound volume: re-bound",
			objects: objs(classFast(), c1, pvUnbound),
			sync:    "pvc/c1",
			volumes: []*corev1.PersistentVolume{boundVolume(pvUnbound, c1, true)},
			actions: []string{"update pv/pv1"},
		},
		{
			name:    "3-3-1 a Lost claim whose volume comes back unbound is re-bound",
			objects: objs(classFast(), c1Lost, pvUnbound),
			sync:    "pvc/c1",
			claims:  []*corev1.PersistentVolumeClaim{boundClaim(c1Lost, pvUnbound, true)},
			volumes: []*corev1.PersistentVolume{boundVolume(pvUnbound, c1Lost, true)},
			actions: []string{"update pv/pv1", "status pvc/c1"},
		},
		{
			// Beyond upstream, where whichever claim syncs first takes it:
			// c1 lost pv1 to other, which is still bound to it, and pv1's
			// claimRef was then removed by hand.
			name:    "3-3-2 a Lost claim does not re-bind a volume whose claimRef was removed while another claim is still bound to it",
			objects: objs(classFast(), c1Lost, otherBound, recordBoundClaims(pvUnbound, c1Lost.UID)),
			sync:    "pvc/c1",
			events:  []string{`pvc/c1 Warning FailedBinding volume "pv1" already bound to a different claim.`},
		},
		{
			// The same with Lost claims naming pv1 too: the index returns
			// them in a map's order, and any of them must not hide other.
			name: "3-3-3 a Lost claim does not re-bind a volume another claim is bound to, whatever Lost claims also name it",
			objects: objs(classFast(), c1Lost, lostNamed("lost-a"), lostNamed("lost-b"), lostNamed("lost-c"), lostNamed("lost-d"), lostNamed("lost-e"), lostNamed("lost-f"), lostNamed("lost-g"), otherBound,
				recordBoundClaims(pvUnbound, c1Lost.UID, "uid-lost-a", "uid-lost-b", "uid-lost-c", "uid-lost-d", "uid-lost-e", "uid-lost-f", "uid-lost-g")),
			sync:   "pvc/c1",
			events: []string{`pvc/c1 Warning FailedBinding volume "pv1" already bound to a different claim.`},
		},
		{
			name:    "3-4 bound claim with a volume bound to another claim: Misbound",
			objects: objs(classFast(), c1, pvToOther),
			sync:    "pvc/c1",
			claims:  []*corev1.PersistentVolumeClaim{lost(c1)},
			volumes: []*corev1.PersistentVolume{recordBoundClaims(pvToOther, c1.UID)},
			actions: []string{"update pv/pv1", "status pvc/c1"},
			events:  []string{"pvc/c1 Warning ClaimMisbound Two claims are bound to the same volume, this one is bound incorrectly"},
		},
		{
			// Beyond upstream, which marks the claim Lost (Misbound) though
			// no other claim has the volume: its pods could not start.
			name:    "3-4-1 bound claim whose volume's claimRef names it without the UID (removed by hand): re-bound",
			objects: objs(classFast(), c1, pvUIDRemoved),
			sync:    "pvc/c1",
			volumes: []*corev1.PersistentVolume{boundVolume(pvUIDRemoved, c1, true)},
			actions: []string{"update pv/pv1", "status pv/pv1"},
		},
		{
			// The claimRef was moved by name from other, still bound to the
			// volume, to c1: re-binding would hand other's data to c1.
			name:    "3-4-2 bound claim whose volume's claimRef names it without a UID while another claim is bound to it: Misbound",
			objects: objs(classFast(), c1, otherBound, pvUIDRemoved),
			sync:    "pvc/c1",
			claims:  []*corev1.PersistentVolumeClaim{lost(c1)},
			volumes: []*corev1.PersistentVolume{recordBoundClaims(pvUIDRemoved, c1.UID)},
			actions: []string{"update pv/pv1", "status pvc/c1"},
			events:  []string{"pvc/c1 Warning ClaimMisbound Two claims are bound to the same volume, this one is bound incorrectly"},
		},
		{
			// c1 is recorded on pv1 already: nothing more to write.
			name:    "3-4-3 bound claim recorded on its volume, which is bound to another claim: Misbound, recorded once",
			objects: objs(classFast(), c1, recordBoundClaims(pvToOther, "uid-x", c1.UID)),
			sync:    "pvc/c1",
			claims:  []*corev1.PersistentVolumeClaim{lost(c1)},
			actions: []string{"status pvc/c1"},
			events:  []string{"pvc/c1 Warning ClaimMisbound Two claims are bound to the same volume, this one is bound incorrectly"},
		},
		{
			// Its user set bind-completed and spec.volumeName: no binder
			// bound it, so it must not keep the volume once Lost.
			name:    "3-4-4 claim never Bound, marked bound by its user, with a volume bound to another claim: Misbound, not recorded",
			objects: objs(classFast(), c1Pending, pvToOther),
			sync:    "pvc/c1",
			claims:  []*corev1.PersistentVolumeClaim{lost(c1Pending)},
			actions: []string{"status pvc/c1"},
			events:  []string{"pvc/c1 Warning ClaimMisbound Two claims are bound to the same volume, this one is bound incorrectly"},
		},
		{
			// Upstream binds pv1, and other's data, to c1.
			name:    "3-3-4 a claim its user marked bound does not take a volume whose claimRef was removed while another claim is still bound to it",
			objects: objs(classFast(), c1Pending, otherBound, pvUnbound),
			sync:    "pvc/c1",
			events:  []string{`pvc/c1 Warning FailedBinding volume "pv1" already bound to a different claim.`},
		},
		{
			// Upstream re-binds without a check; a claim its user
			// pre-bound (spec.volumeName alone) is checked first.
			name:    "3-3-6 a claim its user marked bound takes an unbound volume only if it fits, as a claim its user pre-bound",
			objects: objs(classFast(), c1Pending, pvGold),
			sync:    "pvc/c1",
			events:  []string{`pvc/c1 Warning VolumeMismatch Cannot bind to requested volume "pv1": storageClassName does not match`},
		},
		{
			name:    "3-3-7 the same volume is re-bound to a claim a binder bound to it (Bound, or Lost and recorded)",
			objects: objs(classFast(), c1Lost, pvGoldRecorded),
			sync:    "pvc/c1",
			claims:  []*corev1.PersistentVolumeClaim{boundClaim(c1Lost, pvGoldRecorded, true)},
			volumes: []*corev1.PersistentVolume{boundVolume(pvGoldRecorded, c1Lost, true)},
			actions: []string{"update pv/pv1", "status pv/pv1", "status pvc/c1"},
		},
		{
			name:    "3-3-5 nor while the claim bound to it is Lost and recorded on it",
			objects: objs(classFast(), c1Pending, lostNamed("other"), recordBoundClaims(pvUnbound, "uid-other")),
			sync:    "pvc/c1",
			events:  []string{`pvc/c1 Warning FailedBinding volume "pv1" already bound to a different claim.`},
		},
		{
			// Only a Lost claim (recorded: bound before an earlier edit)
			// names pv1 too: the Bound claim the claimRef names keeps it,
			// as when the claimRef is removed altogether (3-3-2).
			name:    "3-4-5 bound claim whose volume's claimRef names it without a UID while only a Lost claim is also bound to it: re-bound",
			objects: objs(classFast(), c1, lostNamed("other"), recordBoundClaims(pvUIDRemoved, "uid-other")),
			sync:    "pvc/c1",
			volumes: []*corev1.PersistentVolume{boundVolume(recordBoundClaims(pvUIDRemoved, "uid-other"), c1, true)},
			actions: []string{"update pv/pv1", "status pv/pv1"},
		},
		{
			name:    "3-5 bound claim with bound volume: phases filled in",
			objects: objs(classFast(), c1Pending, pvAvailable),
			sync:    "pvc/c1",
			claims:  []*corev1.PersistentVolumeClaim{boundClaim(c1Pending, pvAvailable, true)},
			volumes: []*corev1.PersistentVolume{boundVolume(pvAvailable, c1Pending, true)},
			actions: []string{"status pv/pv1", "status pvc/c1"},
		},
		{
			name:    "3-6 bound claim and a volume bound to an older claim of the same name: Misbound",
			objects: objs(classFast(), c1, pvOtherUID),
			sync:    "pvc/c1",
			claims:  []*corev1.PersistentVolumeClaim{lost(c1)},
			volumes: []*corev1.PersistentVolume{recordBoundClaims(pvOtherUID, c1.UID)},
			actions: []string{"update pv/pv1", "status pvc/c1"},
			events:  []string{"pvc/c1 Warning ClaimMisbound Two claims are bound to the same volume, this one is bound incorrectly"},
		},
		{
			name:    "3-7 re-bind ignores the selector",
			objects: objs(classFast(), c1Sel, pvLabelled),
			sync:    "pvc/c1",
			volumes: []*corev1.PersistentVolume{boundVolume(pvLabelled, c1Sel, true)},
			actions: []string{"update pv/pv1", "status pv/pv1"},
		},
		{
			name:    "3-8 settled binding: nothing",
			objects: objs(classFast(), c1, pvBound),
			sync:    "pvc/c1",
		},
		{
			name:    "3-9 a claim bound to the volume provisioned for it loses the in-flight finalizer",
			objects: objs(classFast(), c1Finalizer, pvProvisioned),
			sync:    "pvc/c1",
			claims:  []*corev1.PersistentVolumeClaim{c1},
			actions: []string{"update pvc/c1"},
		},
		{
			// A create may still be in flight: the provisioner's guard removes
			// the finalizer once it has ended.
			name:    "3-9-1 a claim bound to a static volume keeps the in-flight finalizer",
			objects: objs(classFast(), c1Finalizer, pvBound),
			sync:    "pvc/c1",
			claims:  []*corev1.PersistentVolumeClaim{c1Finalizer},
		},
		{
			name:    "5-2-3 capacity from the pre-resize annotation",
			objects: objs(classFast(), c1Pending, pvPreResize),
			sync:    "pvc/c1",
			claims:  []*corev1.PersistentVolumeClaim{preResized},
			actions: []string{"status pvc/c1"},
		},
		{
			name:    "scope: bound to a volume of another driver",
			objects: objs(classFast(), c1, testutil.NewPV("pv1", otherDriver).Class("fast").Obj()),
			sync:    "pvc/c1",
		},
	}
	runSyncCases(t, cases)
}

// TestWaitForPodScheduledAfterReschedule: a delayed-binding claim waits for
// its pod (WaitForPodScheduled), the scheduler selects a node, and the
// provisioner reschedules it (the driver had no room: selected-node
// removed). The claim waits for its pod again, and says so again, as
// kube-controller-manager does at every sync; the deduplicator must not
// take it for a repetition of the wait before the node was selected.
// Each update runs the claim handler, as the informer does; the binder
// syncs the claim while its node is selected, or not at all (its queue
// held the key through both updates, kube-controller-manager's binder
// having handed the claim over). Any other update of the waiting claim
// (an annotation of its user's) starts no new wait: one event per cause.
func TestWaitForPodScheduledAfterReschedule(t *testing.T) {
	for _, tc := range []struct {
		name         string
		syncSelected bool
		unrelated    bool
	}{
		{name: "a sync sees the node selected", syncSelected: true},
		{name: "no sync sees it"},
		{name: "an update that is no reschedule: not posted again", unrelated: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			log := &eventLog{}
			claim := claimB("c1").Class("wait").Obj()
			pod := testutil.NewPod(ns, "p1", "", "c1")
			f := newFixture(t, objs(classWait(), claim, pod), WithEventRecorder(events.NewDeduplicator(log, 0)))
			sync := func() {
				t.Helper()
				f.loadInformers()
				if _, err := f.binder.syncClaim(f.ctx, ns+"/c1"); err != nil {
					t.Fatal(err)
				}
			}
			update := func(change func(m *metav1.ObjectMeta)) {
				t.Helper()
				old := f.claim("c1")
				c := old.DeepCopy()
				change(&c.ObjectMeta)
				updated, err := f.client.CoreV1().PersistentVolumeClaims(ns).Update(f.ctx, c, metav1.UpdateOptions{})
				if err != nil {
					t.Fatal(err)
				}
				f.binder.onClaimUpdate(old, updated)
			}
			want := "pvc/c1 Normal WaitForPodScheduled waiting for pod p1 to be scheduled"
			sync()
			if len(log.events) != 1 || log.events[0] != want {
				t.Fatalf("events before a node is selected = %q, want [%q]", log.events, want)
			}
			if tc.unrelated {
				update(func(m *metav1.ObjectMeta) { metav1.SetMetaDataAnnotation(m, "example.com/owner", "team-a") })
				log.events = nil
				sync()
				if len(log.events) != 0 {
					t.Errorf("events after an unrelated update = %q, want none (the wait did not start again)", log.events)
				}
				return
			}
			update(func(m *metav1.ObjectMeta) {
				metav1.SetMetaDataAnnotation(m, annSelectedNode, "node-1")
				if !tc.syncSelected {
					metav1.SetMetaDataAnnotation(m, annProvisioner, driver)
					metav1.SetMetaDataAnnotation(m, annBetaProvisioner, driver)
				}
			})
			if tc.syncSelected {
				sync()
			}
			update(func(m *metav1.ObjectMeta) { delete(m.Annotations, annSelectedNode) }) // rescheduled
			log.events = nil
			sync()
			if len(log.events) != 1 || log.events[0] != want {
				t.Fatalf("events after the reschedule = %q, want [%q]", log.events, want)
			}
			log.events = nil
			sync()
			if len(log.events) != 0 {
				t.Errorf("events at the next sync = %q, want none (one per cause)", log.events)
			}
		})
	}
}

// TestEventsAreDeduplicated syncs claims that report something several
// times: each cause is reported once.
func TestEventsAreDeduplicated(t *testing.T) {
	tests := []struct {
		name    string
		objects []runtime.Object
		want    int
	}{
		{"ProvisioningFailed", objs(claimB("c1").Class("ghost").Created(now.Add(-time.Hour)).Obj()), 1},
		{"WaitForFirstConsumer", objs(classWait(), claimB("c1").Class("wait").Obj()), 1},
		{"ExternalProvisioning", objs(classFast(), handedOver(claimB("c1").Class("fast").Created(now.Add(-time.Hour)).Obj(), true)), 1},
		{"VolumeMismatch", objs(classFast(), claimB("c1").Class("fast").VolumeName("pv1").Obj(), volumeB("pv1").Class("slow").Obj()), 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, tt.objects)
			for range 5 {
				if _, err := f.binder.syncClaim(f.ctx, ns+"/c1"); err != nil {
					t.Fatal(err)
				}
			}
			if got := f.events.take(); len(got) != tt.want {
				t.Errorf("events = %q, want %d", got, tt.want)
			}
		})
	}
}
