package binder

import (
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kube-storage/csi-provisioner/internal/testutil"
)

func withPhase(pv *corev1.PersistentVolume, phase corev1.PersistentVolumePhase) *corev1.PersistentVolume {
	pv = pv.DeepCopy()
	pv.Status.Phase = phase
	pv.Status.Message = ""
	return pv
}

func withStatus(pv *corev1.PersistentVolume, phase corev1.PersistentVolumePhase, message string) *corev1.PersistentVolume {
	pv = withPhase(pv, phase)
	pv.Status.Message = message
	return pv
}

func TestSyncVolume(t *testing.T) {
	c1 := claimB("c1").Class("fast").Obj()
	c1Bound := claimB("c1").Class("fast").VolumeName("pv1").Annotation(annBindCompleted, "yes").
		Annotation(annBoundByCtrl, "yes").Phase(corev1.ClaimBound).Obj()
	c1Elsewhere := claimB("c1").Class("fast").VolumeName("pv2").Annotation(annBindCompleted, "yes").
		Annotation(annBoundByCtrl, "yes").Phase(corev1.ClaimBound).Obj()
	c1Recreated := claimB("c1").Class("fast").UID("uid-c1-new").Obj()
	c2Elsewhere := claimB("c2").Class("fast").VolumeName("pv2").Annotation(annBindCompleted, "yes").
		Annotation(annBoundByCtrl, "yes").Phase(corev1.ClaimBound).Obj()
	c2PreboundToPV1 := claimB("c2").Class("fast").VolumeName("pv1").Obj()
	// c2's user set bind-completed and volumeName naming pv1 on it; the
	// binder then marked it Lost (Misbound) without recording it.
	c2Forged := claimB("c2").Class("fast").VolumeName("pv1").Annotation(annBindCompleted, "yes").Phase(corev1.ClaimPending).Obj()
	c2ForgedLost := lost(c2Forged)
	c1Lost := lost(c1Bound)

	pending := volumeB("pv1").Class("fast").Phase(corev1.VolumePending).Obj()
	releasedNoRef := volumeB("pv1").Class("fast").Phase(corev1.VolumeReleased).Obj()
	prebound := volumeB("pv1").Class("fast").ClaimRef(ns, "c1", "").Phase(corev1.VolumePending).Obj()
	bound := func(policy corev1.PersistentVolumeReclaimPolicy) *testutil.PVBuilder {
		return volumeB("pv1").Class("fast").BoundTo(c1).Annotation(annBoundByCtrl, "yes").
			ReclaimPolicy(policy).Phase(corev1.VolumeBound)
	}
	pvDelete := bound(corev1.PersistentVolumeReclaimDelete).Finalizers(pvFinalizer).Obj()
	pvRetain := bound(corev1.PersistentVolumeReclaimRetain).Obj()
	pvRecycle := bound(corev1.PersistentVolumeReclaimRecycle).Obj()
	pvUnknown := bound("Shred").Obj()
	pvFailedRecycle := bound(corev1.PersistentVolumeReclaimRecycle).Phase(corev1.VolumeFailed).Obj()
	pvReleasedDelete := bound(corev1.PersistentVolumeReclaimDelete).Phase(corev1.VolumeReleased).Obj()
	byUser := volumeB("pv1").Class("fast").BoundTo(c1).Phase(corev1.VolumeBound).Obj()
	byUserUnbound := volumeB("pv1").Class("fast").ClaimRef(ns, "c1", "").Obj()
	provisioned := bound(corev1.PersistentVolumeReclaimDelete).Annotation(annProvisionedBy, driver).Obj()
	provisionedEditedToC2 := bound(corev1.PersistentVolumeReclaimDelete).Annotation(annProvisionedBy, driver).BoundTo(c2Elsewhere).Obj()
	provisionedEditedToGone := bound(corev1.PersistentVolumeReclaimDelete).Annotation(annProvisionedBy, driver).ClaimRef(ns, "gone", "uid-gone").Obj()
	// c1 is being deleted, and kubernetes.io/pvc-protection keeps it
	// while its pods still use the volume.
	c1Terminating := c1Bound.DeepCopy()
	c1Terminating.DeletionTimestamp = &metav1.Time{Time: time.Unix(1, 0)}
	c1Terminating.Finalizers = []string{"kubernetes.io/pvc-protection"}
	provisionedRenamed := bound(corev1.PersistentVolumeReclaimDelete).Annotation(annProvisionedBy, driver).ClaimRef(ns, "c1-renamed", "uid-c1").Obj()
	provisionedOtherNS := bound(corev1.PersistentVolumeReclaimDelete).Annotation(annProvisionedBy, driver).ClaimRef("ns2", "c1", "uid-c1").Obj()
	c1BoundUIDNamed := claimB("c1").Class("fast").VolumeName("pvc-uid-c1").Annotation(annBindCompleted, "yes").
		Annotation(annBoundByCtrl, "yes").Phase(corev1.ClaimBound).Obj()
	uidNamedRenamed := volumeB("pvc-uid-c1").Class("fast").Annotation(annProvisionedBy, driver).
		ClaimRef(ns, "c1-renamed", "uid-c1").Phase(corev1.VolumeBound).Obj()
	provisionedRetain := bound(corev1.PersistentVolumeReclaimRetain).Annotation(annProvisionedBy, driver).Obj()
	provisionedRetainUnbound := volumeB("pv1").Class("fast").ReclaimPolicy(corev1.PersistentVolumeReclaimRetain).
		Annotation(annProvisionedBy, driver).Obj()
	// Fresh from the provisioner: phase Pending, claimRef with UID.
	fresh := volumeB("pv1").Class("fast").BoundTo(c1).Annotation(annProvisionedBy, driver).
		Finalizers(pvFinalizer).Phase(corev1.VolumePending).Obj()
	available := bound(corev1.PersistentVolumeReclaimDelete).Phase(corev1.VolumeAvailable).Obj()
	blockPrebound := volumeB("pv1").Class("fast").Block().BoundTo(c1).Phase(corev1.VolumeAvailable).Obj()
	otherDriverOrphan := testutil.NewPV("pv1", otherDriver).UID("uid-pv1").ClaimRef(ns, "gone", "uid-gone").
		Phase(corev1.VolumeBound).Obj()
	notCSIOrphan := volumeB("pv1").NotCSI().ClaimRef(ns, "gone", "uid-gone").Phase(corev1.VolumeBound).Obj()

	released := func(pv *corev1.PersistentVolume) *corev1.PersistentVolume {
		return withPhase(pv, corev1.VolumeReleased)
	}
	cases := []syncCase{
		{
			name:    "4-1 pending volume becomes Available",
			objects: objs(pending),
			sync:    "pv/pv1",
			volumes: []*corev1.PersistentVolume{withPhase(pending, corev1.VolumeAvailable)},
			actions: []string{"status pv/pv1"},
		},
		{
			name:    "4-1-1 a released volume whose claimRef an admin removed becomes Available",
			objects: objs(releasedNoRef),
			sync:    "pv/pv1",
			volumes: []*corev1.PersistentVolume{withPhase(releasedNoRef, corev1.VolumeAvailable)},
			actions: []string{"status pv/pv1"},
		},
		{
			name:    "4-2 volume pre-bound by name becomes Available",
			objects: objs(prebound),
			sync:    "pv/pv1",
			volumes: []*corev1.PersistentVolume{withPhase(prebound, corev1.VolumeAvailable)},
			actions: []string{"status pv/pv1"},
		},
		{
			name:    "4-3 bound volume whose claim is gone: double-checked with the API, then Released (Delete: left to the provisioner, finalizer untouched)",
			objects: objs(pvDelete),
			sync:    "pv/pv1",
			volumes: []*corev1.PersistentVolume{released(pvDelete)},
			actions: []string{"get pvc/c1", "status pv/pv1"},
		},
		{
			name:    "4-4 volume bound to a claim with another UID: re-read from the API, then Released",
			objects: objs(c1Recreated, pvDelete),
			sync:    "pv/pv1",
			volumes: []*corev1.PersistentVolume{released(pvDelete)},
			actions: []string{"get pvc/c1", "status pv/pv1"},
		},
		{
			name:    "4-5 volume bound by the controller to an unbound claim: the claim is queued, the phase stays",
			objects: objs(c1, available),
			sync:    "pv/pv1",
			queued:  []string{"pvc/ns/c1"},
		},
		{
			name:    "4-5-1 volume bound by the user to an unbound claim: the claim is queued",
			objects: objs(c1, byUser),
			sync:    "pv/pv1",
			queued:  []string{"pvc/ns/c1"},
		},
		{
			name:    "4-6 volume bound to its bound claim becomes Bound",
			objects: objs(c1Bound, available),
			sync:    "pv/pv1",
			volumes: []*corev1.PersistentVolume{withPhase(available, corev1.VolumeBound)},
			actions: []string{"status pv/pv1"},
		},
		{
			name:    "4-6-1 settled: nothing",
			objects: objs(c1Bound, pvDelete),
			sync:    "pv/pv1",
		},
		{
			name:    "4-7 volume bound by the controller to a claim bound elsewhere: unbound",
			objects: objs(c1Elsewhere, pvRetain),
			sync:    "pv/pv1",
			volumes: []*corev1.PersistentVolume{withPhase(volumeB("pv1").Class("fast").ReclaimPolicy(corev1.PersistentVolumeReclaimRetain).Obj(), corev1.VolumeAvailable)},
			actions: []string{"update pv/pv1", "status pv/pv1"},
		},
		{
			name:    "4-7-1 unbinding keeps other annotations",
			objects: objs(c1Elsewhere, provisionedRetain),
			sync:    "pv/pv1",
			volumes: []*corev1.PersistentVolume{withPhase(provisionedRetainUnbound, corev1.VolumeAvailable)},
			actions: []string{"update pv/pv1", "status pv/pv1"},
		},
		{
			name:    "4-8 volume bound by the user to a claim bound elsewhere: only the UID is cleared",
			objects: objs(c1Elsewhere, byUser),
			sync:    "pv/pv1",
			volumes: []*corev1.PersistentVolume{withPhase(byUserUnbound, corev1.VolumeAvailable)},
			actions: []string{"update pv/pv1", "status pv/pv1"},
		},
		{
			name:    "4-10 bound volume whose claim is gone, policy Retain: Released and kept",
			objects: objs(pvRetain),
			sync:    "pv/pv1",
			volumes: []*corev1.PersistentVolume{released(pvRetain)},
			actions: []string{"get pvc/c1", "status pv/pv1"},
		},
		{
			name:    "4-11 seed bug 2: a fresh volume whose claim the informer has not seen yet is not released",
			objects: objs(handedOver(c1, true), fresh),
			setup:   func(f *fixture) { f.hideFromInformer(c1) },
			sync:    "pv/pv1",
			actions: []string{"get pvc/c1"},
			queued:  []string{"pvc/ns/c1"},
		},
		{
			name:    "4-11-1 seed bug 2: a bound volume whose claim the informer has not seen yet becomes Bound",
			objects: objs(c1Bound, available),
			setup:   func(f *fixture) { f.hideFromInformer(c1Bound) },
			sync:    "pv/pv1",
			volumes: []*corev1.PersistentVolume{withPhase(available, corev1.VolumeBound)},
			actions: []string{"get pvc/c1", "status pv/pv1"},
		},
		{
			name:    "4-12 the informer has an older claim of the same name, the API the right one: not released",
			objects: objs(c1Bound, available),
			setup: func(f *fixture) {
				old := c1Bound.DeepCopy()
				old.UID = types.UID("uid-older")
				f.putInInformer(old)
			},
			sync:    "pv/pv1",
			volumes: []*corev1.PersistentVolume{withPhase(available, corev1.VolumeBound)},
			actions: []string{"get pvc/c1", "status pv/pv1"},
		},
		{
			name:    "a Released volume whose claim is not cached is not looked up again",
			objects: objs(pvReleasedDelete),
			sync:    "pv/pv1",
		},
		{
			name:    "8-11 provisioned volume (Delete) whose claim is bound elsewhere: Released, not unbound",
			objects: objs(c1Elsewhere, provisioned),
			sync:    "pv/pv1",
			volumes: []*corev1.PersistentVolume{released(provisioned)},
			actions: []string{"status pv/pv1"},
		},
		{
			// Beyond upstream: pv1's claimRef was edited by hand to claim c2,
			// which is bound to pv2, while c1 is still bound to pv1. Upstream
			// would release (and, Delete, destroy) c1's data.
			name:    "guard: claimRef edited to a claim bound elsewhere while another claim is bound to the volume: kept, Warning",
			objects: objs(c1Bound, c2Elsewhere, provisionedEditedToC2),
			sync:    "pv/pv1",
			volumes: []*corev1.PersistentVolume{provisionedEditedToC2},
			events:  []string{"pv/pv1 Warning VolumeStillInUse " + fmt.Sprintf(msgVolumeStillInUse, ns+"/c2", ns+"/c1")},
		},
		{
			name:    "guard: claimRef edited to a claim that does not exist while another claim is bound to the volume: kept, Warning",
			objects: objs(c1Bound, provisionedEditedToGone),
			sync:    "pv/pv1",
			volumes: []*corev1.PersistentVolume{provisionedEditedToGone},
			actions: []string{"get pvc/gone"},
			events:  []string{"pv/pv1 Warning VolumeStillInUse " + fmt.Sprintf(msgVolumeStillInUse, ns+"/gone", ns+"/c1")},
		},
		{
			name:    "guard: claimRef edited to a claim that does not exist while a claim being deleted is bound to the volume: kept, Warning",
			objects: objs(c1Terminating, provisionedEditedToGone),
			sync:    "pv/pv1",
			volumes: []*corev1.PersistentVolume{provisionedEditedToGone},
			actions: []string{"get pvc/gone"},
			events:  []string{"pv/pv1 Warning VolumeStillInUse " + fmt.Sprintf(msgVolumeStillInUse, ns+"/gone", ns+"/c1")},
		},
		{
			// The claimRef keeps the UID of c1, which is still bound to pv1,
			// but names another claim: the UID alone must not make c1 look
			// like the claimRef's (gone) claim.
			name:    "guard: claimRef's name edited, UID kept, while the claim of that UID is bound to the volume: kept, Warning",
			objects: objs(c1Bound, provisionedRenamed),
			sync:    "pv/pv1",
			volumes: []*corev1.PersistentVolume{provisionedRenamed},
			actions: []string{"get pvc/c1-renamed"},
			events:  []string{"pv/pv1 Warning VolumeStillInUse " + fmt.Sprintf(msgVolumeStillInUse, ns+"/c1-renamed", ns+"/c1")},
		},
		{
			name:    "guard: claimRef's namespace edited, UID kept, while the claim of that UID is bound to the volume: kept, Warning",
			objects: objs(c1Bound, provisionedOtherNS),
			sync:    "pv/pv1",
			volumes: []*corev1.PersistentVolume{provisionedOtherNS},
			actions: []string{"get pvc/c1"},
			events:  []string{"pv/pv1 Warning VolumeStillInUse " + fmt.Sprintf(msgVolumeStillInUse, "ns2/c1", ns+"/c1")},
		},
		{
			name:    "guard: the same for a volume named after the claim's UID (no index entry)",
			objects: objs(c1BoundUIDNamed, uidNamedRenamed),
			opts:    []Option{WithUIDNamedVolumes("pvc")},
			sync:    "pv/pvc-uid-c1",
			volumes: []*corev1.PersistentVolume{uidNamedRenamed},
			actions: []string{"get pvc/c1-renamed"},
			events:  []string{"pv/pvc-uid-c1 Warning VolumeStillInUse " + fmt.Sprintf(msgVolumeStillInUse, ns+"/c1-renamed", ns+"/c1")},
		},
		{
			name:    "guard: a claim pre-bound by the user (no bind-completed) does not keep a volume whose claim is gone",
			objects: objs(c2PreboundToPV1, pvDelete),
			sync:    "pv/pv1",
			volumes: []*corev1.PersistentVolume{released(pvDelete)},
			actions: []string{"get pvc/c1", "status pv/pv1"},
		},
		{
			name:    "guard: a claim its user marked bound to the volume (never Bound) does not keep a volume whose claim is gone",
			objects: objs(c2Forged, pvDelete),
			sync:    "pv/pv1",
			volumes: []*corev1.PersistentVolume{released(pvDelete)},
			actions: []string{"get pvc/c1", "status pv/pv1"},
		},
		{
			name:    "guard: nor once Lost (Misbound), not recorded on the volume",
			objects: objs(c2ForgedLost, pvDelete),
			sync:    "pv/pv1",
			volumes: []*corev1.PersistentVolume{released(pvDelete)},
			actions: []string{"get pvc/c1", "status pv/pv1"},
		},
		{
			name:    "guard: a Lost claim recorded on the volume (bound before its claimRef was edited away) keeps it: Warning",
			objects: objs(c1Lost, recordBoundClaims(provisionedEditedToGone, c1Lost.UID)),
			sync:    "pv/pv1",
			volumes: []*corev1.PersistentVolume{recordBoundClaims(provisionedEditedToGone, c1Lost.UID)},
			actions: []string{"get pvc/gone"},
			events:  []string{"pv/pv1 Warning VolumeStillInUse " + fmt.Sprintf(msgVolumeStillInUse, ns+"/gone", ns+"/c1")},
		},
		{
			name:    "guard: a Lost claim not recorded (marked Lost by another binder) does not keep it",
			objects: objs(c1Lost, provisionedEditedToGone),
			sync:    "pv/pv1",
			volumes: []*corev1.PersistentVolume{released(provisionedEditedToGone)},
			actions: []string{"get pvc/gone", "status pv/pv1"},
		},
		{
			name:    "6-3 policy Recycle: Released, then Failed with a warning",
			objects: objs(pvRecycle),
			sync:    "pv/pv1",
			volumes: []*corev1.PersistentVolume{withStatus(pvRecycle, corev1.VolumeFailed, msgRecycleUnsupported)},
			actions: []string{"get pvc/c1", "status pv/pv1", "status pv/pv1"},
			events:  []string{"pv/pv1 Warning VolumeFailedRecycle " + msgRecycleUnsupported},
		},
		{
			name:    "6-3-1 a Failed Recycle volume is left alone",
			objects: objs(pvFailedRecycle),
			sync:    "pv/pv1",
		},
		{
			name:    "6-10 unknown reclaim policy: Failed with a warning",
			objects: objs(pvUnknown),
			sync:    "pv/pv1",
			volumes: []*corev1.PersistentVolume{withStatus(pvUnknown, corev1.VolumeFailed, "Volume has unrecognized PersistentVolumeReclaimPolicy")},
			actions: []string{"get pvc/c1", "status pv/pv1", "status pv/pv1"},
			events:  []string{"pv/pv1 Warning VolumeUnknownReclaimPolicy Volume has unrecognized PersistentVolumeReclaimPolicy"},
		},
		{
			name:    "14-13 volume pre-bound to a claim of another volume mode: warnings on both, nothing written",
			objects: objs(c1, blockPrebound),
			sync:    "pv/pv1",
			events: []string{
				`pv/pv1 Warning VolumeMismatch Cannot bind PersistentVolume to requested PersistentVolumeClaim "ns/c1" due to incompatible volumeMode.`,
				`pvc/c1 Warning VolumeMismatch Cannot bind PersistentVolume "pv1" to requested PersistentVolumeClaim due to incompatible volumeMode.`,
			},
		},
		{
			name:    "scope: an orphaned volume of another driver is never written",
			objects: objs(otherDriverOrphan),
			sync:    "pv/pv1",
		},
		{
			name:    "scope: an orphaned volume of no CSI driver is never written",
			objects: objs(notCSIOrphan),
			sync:    "pv/pv1",
		},
		{
			name:    "the volume is gone",
			objects: objs(c1),
			sync:    "pv/pv1",
		},
	}
	runSyncCases(t, cases)
}
