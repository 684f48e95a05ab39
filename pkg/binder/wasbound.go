package binder

import (
	"context"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
)

// AnnBoundClaims is the volume annotation in which the binder records the
// UIDs (comma-separated) of the claims that were Bound to the volume when
// its spec.claimRef was edited away from them, just before it marks such a
// claim Lost (ClaimMisbound).
//
// Why: the binder keeps a volume, neither releasing nor handing it to
// another claim, while another claim still uses it (otherClaimBoundTo).
// A claim's bind-completed annotation and spec.volumeName do not prove
// that: anybody who may edit a claim may set both on their own claim and
// name any volume, which would keep another tenant's volume from ever
// being released, or take a volume an administrator pre-bound to another
// claim. The claim's status does prove it while it says Bound: only
// binders write it (the namespace roles do not grant
// persistentvolumeclaims/status, and a create drops it). Once the binder
// has marked a claim Lost, the status no longer tells it from a claim that
// was never bound; this record, on the volume, which namespace users
// cannot write, does.
//
// A recorded UID is never removed: UIDs are not reused, so a stale one
// names no claim.
const AnnBoundClaims = "csi-provisioner.kube-storage.io/bound-claims"

// boundByBinder reports whether claim, which has bind-completed and names
// pv in spec.volumeName, was bound to pv by a binder rather than marked so
// by its user: its status says Bound, or its UID is recorded on pv (see
// AnnBoundClaims).
func boundByBinder(pv *corev1.PersistentVolume, claim *corev1.PersistentVolumeClaim) bool {
	return claim.Status.Phase == corev1.ClaimBound || recordedBound(pv, claim.UID)
}

// recordedBound reports whether pv records uid in AnnBoundClaims.
func recordedBound(pv *corev1.PersistentVolume, uid types.UID) bool {
	v, ok := pv.Annotations[AnnBoundClaims]
	if !ok || uid == "" {
		return false
	}
	for s := range strings.SplitSeq(v, ",") {
		if types.UID(s) == uid {
			return true
		}
	}
	return false
}

// recordBound records on pv that claim, Bound to it, is about to be marked
// Lost because pv's claimRef no longer names it (see AnnBoundClaims). It
// writes nothing for a claim that is not Bound (never bound, or Lost
// already) or is recorded already.
func (b *Binder) recordBound(ctx context.Context, pv *corev1.PersistentVolume, claim *corev1.PersistentVolumeClaim) error {
	if claim.Status.Phase != corev1.ClaimBound || recordedBound(pv, claim.UID) {
		return nil
	}
	clone := pv.DeepCopy()
	v := string(claim.UID)
	if old := clone.Annotations[AnnBoundClaims]; old != "" {
		v = old + "," + v
	}
	metav1.SetMetaDataAnnotation(&clone.ObjectMeta, AnnBoundClaims, v)
	klog.FromContext(ctx).V(2).Info("Recording that the claim was bound to the volume before its claimRef was edited", "pvc", klog.KObj(claim), "pv", klog.KObj(pv))
	_, err := b.updateVolume(ctx, clone, "record bound claim "+claimKey(claim))
	return err
}
