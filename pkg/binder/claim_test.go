package binder

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kube-storage/csi-provisioner/internal/testutil"
	"github.com/kube-storage/csi-provisioner/pkg/inflight"
)

const (
	annBindCompleted   = "pv.kubernetes.io/bind-completed"
	annBoundByCtrl     = "pv.kubernetes.io/bound-by-controller"
	annProvisioner     = "volume.kubernetes.io/storage-provisioner"
	annBetaProvisioner = "volume.beta.kubernetes.io/storage-provisioner"
	annSelectedNode    = "volume.kubernetes.io/selected-node"
	annProvisionedBy   = "pv.kubernetes.io/provisioned-by"
	pvFinalizer        = "external-provisioner.volume.kubernetes.io/finalizer"
)

// handedOver returns claim as the binder leaves it when it hands it to the
// provisioner.
func handedOver(claim *corev1.PersistentVolumeClaim, finalizer bool) *corev1.PersistentVolumeClaim {
	claim = claim.DeepCopy()
	metav1.SetMetaDataAnnotation(&claim.ObjectMeta, annProvisioner, driver)
	metav1.SetMetaDataAnnotation(&claim.ObjectMeta, annBetaProvisioner, driver)
	if finalizer {
		inflight.Add(claim, "")
	}
	return claim
}

// withVolumeName returns claim with name recorded as the in-flight
// finalizer's volume name.
func withVolumeName(claim *corev1.PersistentVolumeClaim, name string) *corev1.PersistentVolumeClaim {
	claim = claim.DeepCopy()
	metav1.SetMetaDataAnnotation(&claim.ObjectMeta, inflight.AnnVolumeName, name)
	return claim
}

// pendingStatus returns claim with a reset Pending status.
func pendingStatus(claim *corev1.PersistentVolumeClaim) *corev1.PersistentVolumeClaim {
	claim = claim.DeepCopy()
	claim.Status = corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimPending}
	return claim
}

func lost(claim *corev1.PersistentVolumeClaim) *corev1.PersistentVolumeClaim {
	claim = claim.DeepCopy()
	claim.Status.Phase = corev1.ClaimLost
	claim.Status.AccessModes, claim.Status.Capacity = nil, nil
	return claim
}

// recordBoundClaims returns pv with uids recorded as claims a binder bound
// to it (AnnBoundClaims).
func recordBoundClaims(pv *corev1.PersistentVolume, uids ...types.UID) *corev1.PersistentVolume {
	pv = pv.DeepCopy()
	s := make([]string, len(uids))
	for i, uid := range uids {
		s[i] = string(uid)
	}
	metav1.SetMetaDataAnnotation(&pv.ObjectMeta, AnnBoundClaims, strings.Join(s, ","))
	return pv
}

// boundPair returns a claim and volume bound the way bind leaves them.
func boundPair(claim *corev1.PersistentVolumeClaim, pv *corev1.PersistentVolume) (*corev1.PersistentVolumeClaim, *corev1.PersistentVolume) {
	return boundClaim(claim, pv, true), boundVolume(pv, claim, true)
}

// Writes of a complete binding.
var bindActions = []string{"update pv/pv1", "status pv/pv1", "update pvc/c1", "status pvc/c1"}

// checker is a hand-written ProvisionChecker.
type checker struct {
	err   error
	calls int
}

var _ ProvisionChecker = (*checker)(nil)

func (c *checker) CheckProvision(context.Context, *corev1.PersistentVolumeClaim, *storagev1.StorageClass) error {
	c.calls++
	return c.err
}

func (c *checker) VolumeName(claim *corev1.PersistentVolumeClaim) string {
	return "vol-" + string(claim.UID)
}

func TestSyncPendingClaim(t *testing.T) {
	c1 := claimB("c1").Class("fast").Obj()
	pv1 := volumeB("pv1").Class("fast").Obj()
	boundC1, boundPV1 := boundPair(c1, pv1)

	small := volumeB("pv1").Class("fast").Obj()
	big := volumeB("pv-big").Class("fast").Size("10Gi").Obj()
	mid := volumeB("pv-mid").Class("fast").Size("5Gi").Obj()

	manyModes := volumeB("pv-many").Class("fast").AccessModes(corev1.ReadWriteOnce, corev1.ReadOnlyMany, corev1.ReadWriteMany).Obj()
	oneModeBig := volumeB("pv1").Class("fast").Size("10Gi").Obj()

	byName := volumeB("pv1").Class("fast").ClaimRef(ns, "c1", "").Obj()
	byUID := volumeB("pv1").Class("fast").BoundTo(c1).Obj()
	toOther := volumeB("pv1").Class("fast").ClaimRef(ns, "other", "").Obj()
	// c2 still uses pv1 (bind-completed, volumeName) after an edit of pv1's
	// claimRef: pre-bound to c1 by name, or removed.
	c2OnPV1 := claimB("c2").Class("fast").VolumeName("pv1").Annotation(annBindCompleted, "yes").
		Annotation(annBoundByCtrl, "yes").Phase(corev1.ClaimBound).Obj()
	// c2's user set bind-completed and volumeName on it: no binder bound
	// it (its status was never Bound).
	c2Forged := claimB("c2").Class("fast").VolumeName("pv1").Annotation(annBindCompleted, "yes").Phase(corev1.ClaimLost).Obj()
	byNameInUse := volumeB("pv1").Class("fast").ClaimRef(ns, "c1", "").Phase(corev1.VolumeAvailable).Obj()
	unboundInUse := volumeB("pv1").Class("fast").Phase(corev1.VolumeAvailable).Obj()

	reserved := volumeB("pv1").Class("fast").BoundTo(c1).Annotation(annBoundByCtrl, "yes").Obj()
	reservedBound := volumeB("pv1").Class("fast").BoundTo(c1).Annotation(annBoundByCtrl, "yes").Phase(corev1.VolumeBound).Obj()

	sel := claimB("c1").Class("fast").Selector(map[string]string{"tier": "gold"}).Obj()
	labelled := volumeB("pv1").Class("fast").Label("tier", "gold").Obj()

	cWait := claimB("c1").Class("wait").Obj()
	pvWait := volumeB("pv1").Class("wait").Obj()
	cWaitSelected := claimB("c1").Class("wait").Annotation(annSelectedNode, "node-1").Obj()
	cFastSelected := claimB("c1").Class("fast").Annotation(annSelectedNode, "node-1").Obj()
	pvWaitPrebound := volumeB("pv1").Class("wait").BoundTo(c1).Obj()

	ephemeralPod := testutil.NewPod(ns, "p3", "")
	ephemeralPod.Spec.Volumes = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{Ephemeral: &corev1.EphemeralVolumeSource{}}}}
	cEphemeral := claimB("p3-data").Class("wait").Obj()
	finishedPod := testutil.NewPod(ns, "done", "", "c1")
	finishedPod.Status.Phase = corev1.PodSucceeded

	// The dynamic path: the provisioner created pv1 for the annotated claim.
	cAnnotated := handedOver(claimB("c1").Class("fast").Obj(), true)
	provisioned := volumeB("pv1").Class("fast").BoundTo(c1).Annotation(annProvisionedBy, driver).
		Finalizers(pvFinalizer).Phase(corev1.VolumePending).Obj()

	// Static volumes out of scope that kube-controller-manager's binder
	// binds to c1: of the class (another driver, no CSI), pre-bound by
	// claimRef (any class), without class for a claim without class.
	foreignFast := testutil.NewPV("nfs1", otherDriver).UID("uid-nfs1").Class("fast").Obj()
	foreignSmall := testutil.NewPV("nfs1", otherDriver).UID("uid-nfs1").Class("fast").Size("100Mi").Obj()
	notCSIFast := volumeB("nfs1").NotCSI().Class("fast").Obj()
	notCSIReserved := volumeB("nfs1").NotCSI().ClaimRef(ns, "c1", "").Obj()
	notCSINoClass := volumeB("nfs1").NotCSI().Obj()
	cNil := claimB("c1").Obj()
	defaultFast := testutil.NewSC("fast", driver).Default("storageclass.kubernetes.io/is-default-class").Obj()
	externalBinding := "pvc/c1 Normal ExternalBinding " + fmt.Sprintf(msgExternalBinding, "nfs1", driver)
	cNilOld := claimB("c1").Created(now.Add(-time.Hour)).Obj()
	otherDefault := testutil.NewSC("slow", otherDriver).Default("storageclass.kubernetes.io/is-default-class").Obj()

	// The claim names a VolumeAttributesClass that the volume provisioned
	// for it lacks (the provisioner's gate off).
	cVAC := handedOver(claimB("c1").Class("fast").VolumeAttributesClass("gold").Created(now.Add(-time.Hour)).Obj(), true)
	provisionedNoVAC := volumeB("pv1").Class("fast").BoundTo(cVAC).Annotation(annProvisionedBy, driver).
		Finalizers(pvFinalizer).Phase(corev1.VolumePending).Obj()
	staticReservedSmall := volumeB("pv1").Class("fast").Size("100Mi").BoundTo(c1).Obj()

	cOld := claimB("c1").Class("fast").Created(now.Add(-time.Hour)).Obj()
	cOldAnnotated := handedOver(cOld, true)
	cDeleting := claimB("c1").Class("fast").Deleted().Finalizers("kubernetes.io/pvc-protection").Obj()

	cGhost := claimB("c1").Class("ghost").Created(now.Add(-time.Hour)).Obj()
	cGhostNew := claimB("c1").Class("ghost").Obj()
	ghostWarning := func(last time.Time, message string) *corev1.Event {
		return &corev1.Event{
			ObjectMeta:     metav1.ObjectMeta{Namespace: ns, Name: "c1.ghost"},
			InvolvedObject: corev1.ObjectReference{Kind: "PersistentVolumeClaim", Namespace: ns, Name: "c1", UID: "uid-c1"},
			Type:           corev1.EventTypeWarning, Reason: "ProvisioningFailed", Message: message,
			Source: corev1.EventSource{Component: "persistentvolume-controller"}, LastTimestamp: metav1.NewTime(last),
		}
	}
	ghostMsg := `storageclass.storage.k8s.io "ghost" not found`
	pvGhost := volumeB("pv1").Class("ghost").Obj()
	cNoClass := claimB("c1").Class("").Obj()
	cNoClassOld := claimB("c1").Class("").Created(now.Add(-time.Hour)).Obj()
	noClassEvent := ghostWarning(now.Add(-time.Minute), msgNoVolumeNoClass)
	noClassEvent.Type, noClassEvent.Reason = corev1.EventTypeNormal, "FailedBinding"
	pvNoClass := volumeB("pv1").Obj()
	cNoClassBound := claimB("c1").Class("").Phase(corev1.ClaimBound).AccessModes(corev1.ReadWriteOnce).Obj()
	cNoClassBound.Status.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}
	tooSmallPrebound := volumeB("pv1").Size("100Mi").BoundTo(c1).Obj()
	cOtherClass := claimB("c1").Class("other").Obj()
	pvOtherClass := volumeB("pv1").Class("other").Obj()
	pvOtherDriver := testutil.NewPV("pv1", otherDriver).UID("uid-pv1").Obj()
	pvNotCSI := volumeB("pv1").NotCSI().Obj()
	pvAnnotatedOnly := volumeB("pv1").NotCSI().Annotation(annProvisionedBy, driver).Obj()
	noMode := testutil.NewSC("fast", driver).NoBindingMode().Obj()
	badSelector := claimB("c1").Class("fast").Obj()
	badSelector.Spec.Selector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "k", Operator: "Sometimes"}}}

	cases := []syncCase{
		{
			name:    "1-1 successful bind",
			objects: objs(classFast(), c1, pv1),
			sync:    "pvc/c1",
			claims:  []*corev1.PersistentVolumeClaim{boundC1},
			volumes: []*corev1.PersistentVolume{boundPV1},
			actions: bindActions,
		},
		{
			name:    "1-4 smallest volume",
			objects: objs(classFast(), c1, big, small, mid),
			sync:    "pvc/c1",
			claims:  []*corev1.PersistentVolumeClaim{boundClaim(c1, small, true)},
			volumes: []*corev1.PersistentVolume{boundVolume(small, c1, true)},
			actions: bindActions,
		},
		{
			name:    "1-4-1 fewest extra access modes first, then smallest",
			objects: objs(classFast(), c1, manyModes, oneModeBig),
			sync:    "pvc/c1",
			claims:  []*corev1.PersistentVolumeClaim{boundClaim(c1, oneModeBig, true)},
			volumes: []*corev1.PersistentVolume{boundVolume(oneModeBig, c1, true)},
			actions: bindActions,
		},
		{
			name:    "1-5 pre-bound volume by name",
			objects: objs(classFast(), c1, byName, big),
			sync:    "pvc/c1",
			claims:  []*corev1.PersistentVolumeClaim{boundClaim(c1, byName, true)},
			volumes: []*corev1.PersistentVolume{boundVolume(byName, c1, false)},
			actions: bindActions,
		},
		{
			// Beyond upstream too: a claim that merely says it is bound
			// to pv1 does not hold a volume an administrator pre-bound.
			name:    "1-5-1 pre-bound volume by name that another claim's user marked as bound to it",
			objects: objs(classFast(), c1, c2Forged, byName, big),
			sync:    "pvc/c1",
			claims:  []*corev1.PersistentVolumeClaim{boundClaim(c1, byName, true)},
			volumes: []*corev1.PersistentVolume{boundVolume(byName, c1, false)},
			actions: bindActions,
		},
		{
			name:    "1-6 pre-bound volume by UID: the volume needs no update",
			objects: objs(classFast(), c1, byUID, big),
			sync:    "pvc/c1",
			claims:  []*corev1.PersistentVolumeClaim{boundClaim(c1, byUID, true)},
			volumes: []*corev1.PersistentVolume{boundVolume(byUID, c1, false)},
			actions: []string{"status pv/pv1", "update pvc/c1", "status pvc/c1"},
		},
		{
			name:         "1-7 volume pre-bound to a different claim is not used",
			objects:      objs(classFast(), c1, toOther),
			sync:         "pvc/c1",
			claims:       []*corev1.PersistentVolumeClaim{handedOver(c1, true)},
			actions:      []string{"update pvc/c1"},
			requeueAfter: 29 * time.Second,
		},
		{
			name:    "1-8 complete bind after crash: volume reserved",
			objects: objs(classFast(), c1, reserved),
			sync:    "pvc/c1",
			claims:  []*corev1.PersistentVolumeClaim{boundClaim(c1, reserved, true)},
			volumes: []*corev1.PersistentVolume{boundVolume(reserved, c1, true)},
			actions: []string{"status pv/pv1", "update pvc/c1", "status pvc/c1"},
		},
		{
			name:    "1-9 complete bind after crash: volume status saved",
			objects: objs(classFast(), c1, reservedBound),
			sync:    "pvc/c1",
			claims:  []*corev1.PersistentVolumeClaim{boundClaim(c1, reservedBound, true)},
			actions: []string{"update pvc/c1", "status pvc/c1"},
		},
		{
			name:    "1-11 bind when the selector matches",
			objects: objs(classFast(), sel, labelled),
			sync:    "pvc/c1",
			claims:  []*corev1.PersistentVolumeClaim{boundClaim(sel, labelled, true)},
			volumes: []*corev1.PersistentVolume{boundVolume(labelled, sel, true)},
			actions: bindActions,
		},
		{
			name:         "1-12 no bind when the selector does not match: the claim goes to the provisioner",
			objects:      objs(classFast(), sel, pv1),
			sync:         "pvc/c1",
			claims:       []*corev1.PersistentVolumeClaim{handedOver(sel, true)},
			actions:      []string{"update pvc/c1"},
			requeueAfter: 29 * time.Second,
		},
		{
			name:    "1-13 delayed binding: an unbound volume is not used",
			objects: objs(classWait(), cWait, pvWait),
			sync:    "pvc/c1",
			events:  []string{"pvc/c1 Normal WaitForFirstConsumer waiting for first consumer to be created before binding"},
		},
		{
			name:    "1-13-1 delayed binding: waiting for a pod (terminated pods do not count)",
			objects: objs(classWait(), cWait, testutil.NewPod(ns, "p1", "", "c1"), testutil.NewPod(ns, "running", "node-1", "c1"), finishedPod),
			sync:    "pvc/c1",
			events:  []string{"pvc/c1 Normal WaitForPodScheduled waiting for pod p1 to be scheduled"},
		},
		{
			name:    "1-13-2 delayed binding: waiting for pods",
			objects: objs(classWait(), cWait, testutil.NewPod(ns, "p2", "", "c1"), testutil.NewPod(ns, "p1", "", "c1")),
			sync:    "pvc/c1",
			events:  []string{"pvc/c1 Normal WaitForPodScheduled waiting for pods p1,p2 to be scheduled"},
		},
		{
			name:    "1-13-3 delayed binding: generic ephemeral volume",
			objects: objs(classWait(), cEphemeral, ephemeralPod),
			sync:    "pvc/p3-data",
			events:  []string{"pvc/p3-data Normal WaitForPodScheduled waiting for pod p3 to be scheduled"},
		},
		{
			name:    "1-14 delayed binding: a pre-bound volume is bound",
			objects: objs(classWait(), cWait, pvWaitPrebound),
			sync:    "pvc/c1",
			claims:  []*corev1.PersistentVolumeClaim{boundClaim(cWait, pvWaitPrebound, true)},
			volumes: []*corev1.PersistentVolume{boundVolume(pvWaitPrebound, cWait, false)},
			actions: []string{"status pv/pv1", "update pvc/c1", "status pvc/c1"},
		},
		{
			name:         "1-17 a volume that is not Available is not used",
			objects:      objs(classFast(), c1, volumeB("pv1").Class("fast").Phase(corev1.VolumePending).Obj()),
			sync:         "pvc/c1",
			claims:       []*corev1.PersistentVolumeClaim{handedOver(c1, true)},
			actions:      []string{"update pvc/c1"},
			requeueAfter: 29 * time.Second,
		},
		{
			name:    "1-18 provisioned volume: bound, in-flight finalizer removed in the claim write, volume finalizer untouched",
			objects: objs(classFast(), cAnnotated, provisioned),
			sync:    "pvc/c1",
			claims:  []*corev1.PersistentVolumeClaim{boundClaim(cAnnotated, provisioned, true)},
			volumes: []*corev1.PersistentVolume{boundVolume(provisioned, cAnnotated, false)},
			actions: []string{"status pv/pv1", "update pvc/c1", "status pvc/c1"},
		},
		{
			name:    "1-18-1 provisioned volume that does not fit: a Warning names it, no ExternalProvisioning",
			objects: objs(classFast(), cVAC, provisionedNoVAC),
			sync:    "pvc/c1",
			events:  []string{`pvc/c1 Warning VolumeMismatch Cannot bind to volume "pv1", provisioned for this claim: volumeAttributesClassName does not match`},
		},
		{
			name:         "1-18-2 a static volume reserved for the claim by UID that does not fit: provisioned, as upstream",
			objects:      objs(classFast(), c1, staticReservedSmall),
			sync:         "pvc/c1",
			claims:       []*corev1.PersistentVolumeClaim{handedOver(c1, true)},
			actions:      []string{"update pvc/c1"},
			requeueAfter: 29 * time.Second,
		},
		{
			name:         "seed bug 1 (11-23): a claim with a selected node is provisioned, not bound to a static volume",
			objects:      objs(classWait(), cWaitSelected, pvWait),
			sync:         "pvc/c1",
			claims:       []*corev1.PersistentVolumeClaim{handedOver(cWaitSelected, true)},
			actions:      []string{"update pvc/c1"},
			requeueAfter: 29 * time.Second,
		},
		{
			name:         "seed bug 1: the same with an Immediate class (selected by a node-local provisioner)",
			objects:      objs(classFast(), cFastSelected, pv1),
			sync:         "pvc/c1",
			claims:       []*corev1.PersistentVolumeClaim{handedOver(cFastSelected, true)},
			actions:      []string{"update pvc/c1"},
			requeueAfter: 29 * time.Second,
		},
		{
			name:    "seed bug 1: a claim with a selected node still binds a volume pre-bound to it",
			objects: objs(classWait(), cWaitSelected, pvWaitPrebound),
			sync:    "pvc/c1",
			claims:  []*corev1.PersistentVolumeClaim{boundClaim(cWaitSelected, pvWaitPrebound, true)},
			volumes: []*corev1.PersistentVolume{boundVolume(pvWaitPrebound, cWaitSelected, false)},
			actions: []string{"status pv/pv1", "update pvc/c1", "status pvc/c1"},
		},
		{
			// Beyond upstream, which hands c2's data to c1.
			name:         "guard: a volume pre-bound to the claim by name while another claim is still bound to it is not taken: Warning, provisioned instead",
			objects:      objs(classFast(), c1, c2OnPV1, byNameInUse),
			sync:         "pvc/c1",
			claims:       []*corev1.PersistentVolumeClaim{handedOver(c1, true)},
			actions:      []string{"update pvc/c1"},
			events:       []string{"pv/pv1 Warning VolumeStillInUse " + fmt.Sprintf(msgVolumeStillInUse, ns+"/c1", ns+"/c2")},
			requeueAfter: 29 * time.Second,
		},
		{
			name:         "guard: a volume whose claimRef was removed while a claim is still bound to it is not taken by another claim",
			objects:      objs(classFast(), c1, c2OnPV1, unboundInUse),
			sync:         "pvc/c1",
			claims:       []*corev1.PersistentVolumeClaim{handedOver(c1, true)},
			actions:      []string{"update pvc/c1"},
			requeueAfter: 29 * time.Second,
		},
		{
			name:         "provision: both annotations and the in-flight finalizer in one write, no event",
			objects:      objs(classFast(), c1),
			sync:         "pvc/c1",
			claims:       []*corev1.PersistentVolumeClaim{handedOver(c1, true)},
			actions:      []string{"update pvc/c1"},
			requeueAfter: 29 * time.Second,
		},
		{
			name:         "a static volume of another driver in the claim's class fits: left to kube-controller-manager's binder, not provisioned",
			objects:      objs(classFast(), c1, foreignFast),
			sync:         "pvc/c1",
			requeueAfter: 29 * time.Second,
		},
		{
			name:    "the same, still unbound after the grace: one ExternalBinding event",
			objects: objs(classFast(), cOld, foreignFast),
			sync:    "pvc/c1",
			events:  []string{externalBinding},
		},
		{
			name:    "the same with a volume of no CSI driver",
			objects: objs(classFast(), cOld, notCSIFast),
			sync:    "pvc/c1",
			events:  []string{externalBinding},
		},
		{
			name:    "the same with a volume of no CSI driver and no class pre-bound to the claim",
			objects: objs(classFast(), cOld, notCSIReserved),
			sync:    "pvc/c1",
			events:  []string{externalBinding},
		},
		{
			name:         "a claim without class that a volume of no CSI driver fits does not get the default class",
			objects:      objs(defaultFast, cNil, notCSINoClass),
			sync:         "pvc/c1",
			requeueAfter: 29 * time.Second,
		},
		{
			// Not this driver's claim: reportUnowned stays silent when a
			// volume fits, and no sidecar of another driver says a word.
			name:    "a claim without class while no class of the driver is default, that a volume of no CSI driver fits: nothing",
			objects: objs(classFast(), cNilOld, notCSINoClass),
			sync:    "pvc/c1",
		},
		{
			name:    "the same while another driver's class is default: nothing",
			objects: objs(classFast(), otherDefault, cNilOld, notCSINoClass),
			sync:    "pvc/c1",
		},
		{
			name:         "a static volume of another driver that does not fit: provisioned",
			objects:      objs(classFast(), c1, foreignSmall),
			sync:         "pvc/c1",
			claims:       []*corev1.PersistentVolumeClaim{handedOver(c1, true)},
			actions:      []string{"update pvc/c1"},
			requeueAfter: 29 * time.Second,
		},
		{
			name:    "delayed binding: an unbound static volume of another driver is left to the scheduler",
			objects: objs(classWait(), cWait, testutil.NewPV("nfs1", otherDriver).UID("uid-nfs1").Class("wait").Obj()),
			sync:    "pvc/c1",
			events:  []string{"pvc/c1 Normal WaitForFirstConsumer waiting for first consumer to be created before binding"},
		},
		{
			name:         "provision: a failing check gives the annotations without the finalizer",
			objects:      objs(classFast(), c1),
			opts:         []Option{WithProvisionCheck(&checker{err: errors.New("secret missing")})},
			sync:         "pvc/c1",
			claims:       []*corev1.PersistentVolumeClaim{handedOver(c1, false)},
			actions:      []string{"update pvc/c1"},
			requeueAfter: 29 * time.Second,
		},
		{
			name:         "provision: a passing check gives the finalizer, with the volume name recorded",
			objects:      objs(classFast(), c1),
			opts:         []Option{WithProvisionCheck(&checker{})},
			sync:         "pvc/c1",
			claims:       []*corev1.PersistentVolumeClaim{withVolumeName(handedOver(c1, true), "vol-uid-c1")},
			actions:      []string{"update pvc/c1"},
			requeueAfter: 29 * time.Second,
		},
		{
			name:         "provision: already handed over, within the grace: nothing",
			objects:      objs(classFast(), handedOver(c1, true)),
			sync:         "pvc/c1",
			requeueAfter: 29 * time.Second,
		},
		{
			name:    "provision: still unbound after the grace: one ExternalProvisioning event",
			objects: objs(classFast(), cOldAnnotated),
			sync:    "pvc/c1",
			events: []string{"pvc/c1 Normal ExternalProvisioning Waiting for a volume to be created either by the external provisioner 'csi.example.com' " +
				"or manually by the system administrator. If volume creation is delayed, please verify that the provisioner is running and correctly registered."},
		},
		{
			name:    "provision: an old claim handed over now gets the annotations and the event",
			objects: objs(classFast(), cOld),
			sync:    "pvc/c1",
			claims:  []*corev1.PersistentVolumeClaim{cOldAnnotated},
			actions: []string{"update pvc/c1"},
			events: []string{"pvc/c1 Normal ExternalProvisioning Waiting for a volume to be created either by the external provisioner 'csi.example.com' " +
				"or manually by the system administrator. If volume creation is delayed, please verify that the provisioner is running and correctly registered."},
		},
		{
			name:    "provision: a claim being deleted is not handed over",
			objects: objs(classFast(), cDeleting),
			sync:    "pvc/c1",
		},
		{
			name:    "a claim being deleted does not take an unbound static volume",
			objects: objs(classFast(), cDeleting, pv1),
			sync:    "pvc/c1",
		},
		{
			name:    "a claim being deleted still binds the volume pre-bound to it",
			objects: objs(classFast(), cDeleting, byUID),
			sync:    "pvc/c1",
			claims:  []*corev1.PersistentVolumeClaim{boundClaim(cDeleting, byUID, true)},
			volumes: []*corev1.PersistentVolume{boundVolume(byUID, cDeleting, false)},
			actions: []string{"status pv/pv1", "update pvc/c1", "status pvc/c1"},
		},
		{
			name:    "11-14 class not found: ProvisioningFailed",
			objects: objs(cGhost),
			sync:    "pvc/c1",
			actions: []string{"get storageclasses/ghost"},
			events:  []string{`pvc/c1 Warning ProvisioningFailed storageclass.storage.k8s.io "ghost" not found`},
		},
		{
			// Every binder would say so: this one waits for its turn.
			name:         "class not found, claim just created: looked at again at this binder's turn",
			objects:      objs(cGhostNew),
			sync:         "pvc/c1",
			actions:      []string{"get storageclasses/ghost"},
			requeueAfter: MissingClassTurn("uid-c1", driver) - time.Second,
		},
		{
			name:    "class not found, another binder said so 10 minutes ago: silent",
			objects: objs(cGhost, ghostWarning(now.Add(-10*time.Minute), ghostMsg)),
			sync:    "pvc/c1",
			actions: []string{"get storageclasses/ghost"},
		},
		{
			name:    "class not found, another binder said so 31 minutes ago: ProvisioningFailed",
			objects: objs(cGhost, ghostWarning(now.Add(-31*time.Minute), ghostMsg)),
			sync:    "pvc/c1",
			actions: []string{"get storageclasses/ghost"},
			events:  []string{`pvc/c1 Warning ProvisioningFailed storageclass.storage.k8s.io "ghost" not found`},
		},
		{
			name:    "class not found, another binder said something else: ProvisioningFailed",
			objects: objs(cGhost, ghostWarning(now.Add(-time.Minute), `storageclass.storage.k8s.io "other" not found`)),
			sync:    "pvc/c1",
			actions: []string{"get storageclasses/ghost"},
			events:  []string{`pvc/c1 Warning ProvisioningFailed storageclass.storage.k8s.io "ghost" not found`},
		},
		{
			// Another driver's binder (or kube-controller-manager's) binds
			// it: a Warning would stay on a claim that ends Bound.
			name:    "class not found but another driver's static volume of that class fits: silent",
			objects: objs(cGhost, testutil.NewPV("pv9", otherDriver).UID("uid-pv9").Class("ghost").Obj()),
			sync:    "pvc/c1",
			actions: []string{"get storageclasses/ghost"},
		},
		{
			name:    "class not found and another driver's volume of that class does not fit: ProvisioningFailed",
			objects: objs(cGhost, testutil.NewPV("pv9", otherDriver).UID("uid-pv9").Class("ghost").Size("100Mi").Obj()),
			sync:    "pvc/c1",
			actions: []string{"get storageclasses/ghost"},
			events:  []string{`pvc/c1 Warning ProvisioningFailed storageclass.storage.k8s.io "ghost" not found`},
		},
		{
			// kubectl apply of a class and its claim: the claim's event
			// can come before the class's.
			name:    "class created just before the claim, not cached yet: no Warning",
			objects: objs(cGhost, testutil.NewSC("ghost", driver).Obj()),
			setup: func(f *fixture) {
				if err := f.store(&storagev1.StorageClass{}).Delete(testutil.NewSC("ghost", driver).Obj()); err != nil {
					t.Fatal(err)
				}
			},
			sync:    "pvc/c1",
			actions: []string{"get storageclasses/ghost"},
		},
		{
			name:    "13-1 class not found but a static volume of that class in scope matches: bound",
			objects: objs(cGhost, pvGhost),
			sync:    "pvc/c1",
			claims:  []*corev1.PersistentVolumeClaim{boundClaim(cGhost, pvGhost, true)},
			volumes: []*corev1.PersistentVolume{boundVolume(pvGhost, cGhost, true)},
			actions: bindActions,
		},
		{
			name:    "13-2 binding without a class",
			objects: objs(cNoClass, pvNoClass),
			sync:    "pvc/c1",
			claims:  []*corev1.PersistentVolumeClaim{boundClaim(cNoClass, pvNoClass, true)},
			volumes: []*corev1.PersistentVolume{boundVolume(pvNoClass, cNoClass, true)},
			actions: bindActions,
		},
		{
			// kube-controller-manager's binder says so at each sync;
			// this one once among binders, at its turn (unowned.go).
			name:         "13-4 class \"\" and nothing matches, claim just created: looked at again at this binder's turn",
			objects:      objs(cNoClass, pv1),
			sync:         "pvc/c1",
			requeueAfter: turnC1,
		},
		{
			name:    "13-4 class \"\" and nothing matches, at this binder's turn: FailedBinding, no write",
			objects: objs(cNoClassOld, pv1),
			sync:    "pvc/c1",
			events:  []string{"pvc/c1 Normal FailedBinding " + msgNoVolumeNoClass},
		},
		{
			name:    "class \"\" and nothing matches, another binder said so a minute ago: silent",
			objects: objs(cNoClassOld, pv1, noClassEvent),
			sync:    "pvc/c1",
		},
		{
			name:    "class \"\" and another driver's volume without class fits: silent",
			objects: objs(cNoClassOld, testutil.NewPV("pv9", otherDriver).UID("uid-pv9").Obj()),
			sync:    "pvc/c1",
		},
		{
			name:    "class \"\" and another driver's volume without class does not fit: FailedBinding",
			objects: objs(cNoClassOld, testutil.NewPV("pv9", otherDriver).UID("uid-pv9").Size("100Mi").Obj()),
			sync:    "pvc/c1",
			events:  []string{"pvc/c1 Normal FailedBinding " + msgNoVolumeNoClass},
		},
		{
			name:    "1-3 class \"\", in scope through a pre-bound volume that does not fit: FailedBinding and reset to Pending",
			objects: objs(cNoClassBound, tooSmallPrebound),
			sync:    "pvc/c1",
			claims:  []*corev1.PersistentVolumeClaim{pendingStatus(cNoClassBound)},
			actions: []string{"status pvc/c1"},
			events:  []string{"pvc/c1 Normal FailedBinding no persistent volumes available for this claim and no storage class is set"},
		},
		{
			// kube-controller-manager's binder binds it before handing the
			// claim to that provisioner (kubernetes.io/no-provisioner for
			// static volumes, typically); TestBinderDifferential.
			name:    "a claim of another provisioner's class takes our unbound volume of that class",
			objects: objs(classOther(), cOtherClass, pvOtherClass),
			sync:    "pvc/c1",
			claims:  []*corev1.PersistentVolumeClaim{boundClaim(cOtherClass, pvOtherClass, true)},
			volumes: []*corev1.PersistentVolume{boundVolume(pvOtherClass, cOtherClass, true)},
			actions: bindActions,
		},
		{
			name:    "a claim of another provisioner's WaitForFirstConsumer class does not take an unbound volume, silently",
			objects: objs(testutil.NewSC("other", otherDriver).WaitForFirstConsumer().Obj(), cOtherClass, pvOtherClass),
			sync:    "pvc/c1",
		},
		{
			name:    "a claim of another provisioner's class without binding mode: no unbound volume, not our error",
			objects: objs(testutil.NewSC("other", otherDriver).NoBindingMode().Obj(), cOtherClass, pvOtherClass),
			sync:    "pvc/c1",
		},
		{
			name:    "scope: a volume of another driver is never bound",
			objects: objs(cNoClass, pvOtherDriver),
			sync:    "pvc/c1",
		},
		{
			name:    "scope: a volume of no CSI driver is never bound",
			objects: objs(cNoClass, pvNotCSI),
			sync:    "pvc/c1",
		},
		{
			name:    "scope: a volume provisioned by the driver is in scope",
			objects: objs(cNoClass, pvAnnotatedOnly),
			sync:    "pvc/c1",
			claims:  []*corev1.PersistentVolumeClaim{boundClaim(cNoClass, pvAnnotatedOnly, true)},
			volumes: []*corev1.PersistentVolume{boundVolume(pvAnnotatedOnly, cNoClass, true)},
			actions: bindActions,
		},
		{
			name:    "an invalid selector is an error",
			objects: objs(classFast(), badSelector, pv1),
			sync:    "pvc/c1",
			wantErr: true,
		},
		{
			name:    "a class of another provisioner without binding mode is not our error",
			objects: objs(testutil.NewSC("other", otherDriver).NoBindingMode().Obj(), cOtherClass),
			sync:    "pvc/c1",
		},
		{
			name:    "a class without binding mode is an error",
			objects: objs(noMode, c1),
			sync:    "pvc/c1",
			wantErr: true,
		},
		{
			name:    "the claim is gone",
			objects: objs(classFast()),
			sync:    "pvc/c1",
		},
	}
	runSyncCases(t, cases)
}

// TestCheckVolumeSatisfyClaimSize: a volume requested by name must hold at
// least what the claim requests, to the byte.
func TestCheckVolumeSatisfyClaimSize(t *testing.T) {
	for _, tc := range []struct {
		request, size string
		wantErr       bool
	}{
		{request: "1Gi", size: "1Gi"},
		{request: "1Gi", size: "1073741823", wantErr: true},
		{request: "1Gi", size: "2Gi"},
		// Whole bytes rounded up, as kube-controller-manager compares.
		{request: "2", size: "1500m"},
		{request: "2", size: "1", wantErr: true},
		// Requests beyond int64 bytes, where Value() overflows (to 0, or
		// negative): no volume is that large.
		{request: "10E", size: "1Gi", wantErr: true},
		{request: "9300000000000000000", size: "1Gi", wantErr: true},
	} {
		claim := claimB("c1").Size(tc.request).Obj()
		err := checkVolumeSatisfyClaim(volumeB("pv1").Size(tc.size).Obj(), claim)
		if (err != nil) != tc.wantErr {
			t.Errorf("volume of %s for a claim of %s: error %v, want error %v", tc.size, tc.request, err, tc.wantErr)
		}
	}
}

// TestFindBestMatchAccessModes: a volume that lacks an access mode the
// claim requests is never matched, unbound or pre-bound to the claim
// (FindMatchingVolume checks access modes only on the scheduler's path).
func TestFindBestMatchAccessModes(t *testing.T) {
	claim := claimB("c1").Class("fast").AccessModes(corev1.ReadWriteMany).Obj()
	for _, pv := range []*corev1.PersistentVolume{
		volumeB("pv-unbound").Class("fast").AccessModes(corev1.ReadWriteOnce).Phase(corev1.VolumeAvailable).Obj(),
		volumeB("pv-prebound").Class("fast").AccessModes(corev1.ReadWriteOnce).ClaimRef(ns, "c1", "").Phase(corev1.VolumeAvailable).Obj(),
	} {
		if got, err := findBestMatch(claim, []*corev1.PersistentVolume{pv}, false); err != nil || got != nil {
			t.Errorf("findBestMatch(ReadWriteMany claim, %s with ReadWriteOnce) = %v, %v; want no volume", pv.Name, got, err)
		}
	}
	ok := volumeB("pv-ok").Class("fast").AccessModes(corev1.ReadWriteOnce, corev1.ReadWriteMany).Phase(corev1.VolumeAvailable).Obj()
	if got, err := findBestMatch(claim, []*corev1.PersistentVolume{ok}, false); err != nil || got != ok {
		t.Errorf("findBestMatch(ReadWriteMany claim, pv-ok) = %v, %v; want pv-ok", got, err)
	}
}

// TestMissingRequestedVolumeReadOnce: a claim whose spec.volumeName names
// a volume that does not exist is queued at every resync (it may appear).
// The API server is asked once, when the Warning is posted; the resyncs
// after it, while the Warning stands, read nothing: a namespace's many
// such claims would otherwise spend the client budget that every other
// claim's binding shares.
func TestMissingRequestedVolumeReadOnce(t *testing.T) {
	claim := claimB("c1").Class("fast").VolumeName("missing").Obj()
	f := newFixture(t, objs(classFast(), claim))
	for i := range 5 {
		f.loadInformers()
		if !f.binder.claimNeedsWork(f.binder.getClaim(ns, "c1")) {
			t.Fatalf("resync %d: claim not queued", i)
		}
		if _, err := f.runSync("pvc/c1"); err != nil {
			t.Fatalf("sync %d: %v", i, err)
		}
	}
	gets := 0
	for _, a := range f.actions() {
		if a == "get pv/missing" {
			gets++
		}
	}
	if gets != 1 {
		t.Errorf("%d reads of the missing volume over 5 syncs of one claim, want 1 (actions %q)", gets, f.actions())
	}
	if got := f.events.take(); len(got) != 1 {
		t.Errorf("events %q, want one FailedBinding", got)
	}
}
