package binder

import (
	"context"
	"reflect"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	storagehelpers "k8s.io/component-helpers/storage/volume"
	"k8s.io/klog/v2"

	"github.com/kube-storage/csi-provisioner/pkg/inflight"
)

// resync queues the claims and volumes that may need work. Upstream queues
// every object every period; with thousands of bound volumes that is
// thousands of syncs that find nothing to do. The predicates below are
// conservative: TestNeedsWorkIsComplete checks, over a large set of states,
// that whenever a sync would write or report anything, the predicate of the
// object was true.
func (b *Binder) resync(ctx context.Context) {
	logger := klog.FromContext(ctx)
	claims, err := b.pvcLister.List(labels.Everything())
	if err != nil {
		logger.Error(err, "Resync: cannot list claims")
		return
	}
	nClaims := 0
	for _, c := range claims {
		if c = b.getClaim(c.Namespace, c.Name); c != nil && b.claimNeedsWork(c) {
			b.claimQueue.Add(claimKey(c))
			nClaims++
		}
	}
	pvs, err := b.pvLister.List(labels.Everything())
	if err != nil {
		logger.Error(err, "Resync: cannot list volumes")
		return
	}
	nVolumes := 0
	for _, pv := range pvs {
		if pv = b.getVolume(pv.Name); pv != nil && b.volumeNeedsWork(pv) {
			b.volumeQueue.Add(pv.Name)
			nVolumes++
		}
	}
	logger.V(4).Info("Resync", "claims", len(claims), "claimsQueued", nClaims, "volumes", len(pvs), "volumesQueued", nVolumes)
}

// claimNeedsWork is false only for a claim whose sync would do nothing:
//
//   - a bound claim (bind-completed) whose volume exists, is in scope, points
//     back to it with its UID and is Bound, while the claim is Bound, has
//     the volume's access modes and no in-flight finalizer;
//   - a Lost claim whose volume is gone or claimed by another claim (a Lost
//     claim whose volume reappears unclaimed is bound again, as upstream
//     does, and so is one whose volume's claimRef names it without a UID,
//     unless another claim is still bound to that volume);
//   - a claim out of scope that nothing in scope refers to: spec.volumeName
//     names a volume out of scope, or its class exists with another
//     provisioner, no volume in scope is pre-bound to it or unbound in that
//     class, and it has no spec.volumeName.
//
// Every other claim, in particular every pending claim of this driver or
// without a class object, needs work: a static volume may have appeared, its
// events depend on pods and time.
func (b *Binder) claimNeedsWork(claim *corev1.PersistentVolumeClaim) bool {
	if !metav1.HasAnnotation(claim.ObjectMeta, storagehelpers.AnnBindCompleted) {
		if claim.Spec.VolumeName != "" {
			pv := b.getVolume(claim.Spec.VolumeName)
			if pv == nil {
				return b.classIsOurs(claim)
			}
			return b.volumeInScope(pv)
		}
		class := b.classOf(claim)
		if class != nil && !b.ownsClass(class) {
			return len(b.volumesReferencing(claim)) > 0 || len(b.unboundVolumesOfClass(class.Name)) > 0
		}
		return true
	}
	lost := claim.Status.Phase == corev1.ClaimLost
	if claim.Spec.VolumeName == "" {
		return !lost && b.classIsOurs(claim)
	}
	pv := b.getVolume(claim.Spec.VolumeName)
	if pv == nil {
		return !lost && b.classIsOurs(claim)
	}
	if !b.volumeInScope(pv) {
		return false
	}
	ref := pv.Spec.ClaimRef
	if ref == nil {
		return true // re-bind, even a Lost claim
	}
	if storagehelpers.IsVolumeBoundToClaim(pv, claim) && ref.UID != claim.UID {
		// claimRef by name only: re-bind, even a Lost claim, unless
		// another claim is still bound to the volume (the claimRef was
		// edited to this claim by name): that claim stays Misbound.
		return !lost || b.claimUsing(pv, claim) == nil
	}
	if ref.UID != claim.UID {
		return !lost // misbound
	}
	settled := ref.Name == claim.Name && ref.Namespace == claim.Namespace &&
		pv.Status.Phase == corev1.VolumeBound &&
		claim.Status.Phase == corev1.ClaimBound &&
		reflect.DeepEqual(claim.Status.AccessModes, pv.Spec.AccessModes) &&
		(!inflight.Has(claim) || !b.provisionedFor(pv, claim))
	return !settled
}

// volumeNeedsWork is false only for a volume whose sync would do nothing:
//
//   - a volume out of scope;
//   - an Available volume without claimRef, or with a claimRef by name only;
//   - a Bound volume whose claim exists with the claimRef's UID and has
//     spec.volumeName pointing to it;
//   - a Released volume with policy Delete or Retain, and a Failed volume,
//     whose claim is gone (or has another UID), unless another claim is
//     still bound to it (its sync then reports that it keeps the volume).
func (b *Binder) volumeNeedsWork(pv *corev1.PersistentVolume) bool {
	if !b.volumeInScope(pv) {
		return false
	}
	ref := pv.Spec.ClaimRef
	if ref == nil || ref.UID == "" {
		return pv.Status.Phase != corev1.VolumeAvailable
	}
	claim := b.getClaim(ref.Namespace, ref.Name)
	claimExists := claim != nil && claim.UID == ref.UID
	if !claimExists && b.otherClaimBoundTo(pv, ref) != nil {
		return true
	}
	switch pv.Status.Phase {
	case corev1.VolumeReleased:
		if claimExists {
			return true
		}
		p := pv.Spec.PersistentVolumeReclaimPolicy
		if p == corev1.PersistentVolumeReclaimDelete && b.undeletableInTree(pv) {
			return true // its Warning is renewed by the sync
		}
		return p != corev1.PersistentVolumeReclaimDelete && p != corev1.PersistentVolumeReclaimRetain
	case corev1.VolumeFailed:
		return claimExists || (pv.Spec.PersistentVolumeReclaimPolicy == corev1.PersistentVolumeReclaimDelete && b.undeletableInTree(pv))
	case corev1.VolumeBound:
		return !claimExists || claim.Spec.VolumeName != pv.Name
	default:
		return true
	}
}
