package binder

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	storagehelpers "k8s.io/component-helpers/storage/volume"
	"k8s.io/klog/v2"
)

// syncVolume brings one volume, by name, to the phase its claim implies
// (reference §1.3) and moves a released volume on to reclaim (§4). It is
// idempotent; an error means "retry later".
func (b *Binder) syncVolume(ctx context.Context, name string) (result, error) {
	logger := klog.FromContext(ctx)
	pv := b.getVolume(name)
	if pv == nil {
		logger.V(4).Info("Volume is gone")
		return result{}, nil
	}
	if !b.volumeInScope(pv) {
		logger.V(5).Info("Volume is not in scope")
		return result{}, nil
	}
	pv, err := b.annealMigrated(ctx, pv)
	if err != nil {
		return result{}, err
	}
	ref := pv.Spec.ClaimRef
	if ref == nil || ref.UID == "" {
		// Unbound (4-1), or pre-bound by name only (4-2): the claim sync
		// does the binding.
		_, err := b.updateVolumePhase(ctx, pv, corev1.VolumeAvailable, "")
		return result{}, err
	}

	claim, err := b.claimOfVolume(ctx, pv)
	if err != nil {
		return result{}, err
	}
	if claim == nil || (claim.Spec.VolumeName != "" && claim.Spec.VolumeName != pv.Name) {
		// The volume is about to be released or unbound. Beyond upstream:
		// not while another claim is still bound to it, which happens only
		// when someone edited spec.claimRef by hand; releasing would delete
		// (or hand out) that claim's data.
		if user := b.otherClaimBoundTo(pv, ref); user != nil {
			logger.Info("Volume is still in use by another claim; not releasing or unbinding it", "pvc", klog.KObj(user), "claimRef", claimRefKey(ref))
			b.recorder.Event(pv, corev1.EventTypeWarning, reasonVolumeStillInUse, fmt.Sprintf(msgVolumeStillInUse, claimRefKey(ref), claimKey(user)))
			return result{}, nil
		}
	}
	switch {
	case claim == nil:
		// The claim is gone (4-3, 4-4, 4-10, 4-12): release and reclaim.
		logger.V(4).Info("Claim of the volume is gone", "pvc", klog.KRef(ref.Namespace, ref.Name), "claimUID", ref.UID)
		return result{}, b.release(ctx, pv)
	case claim.Spec.VolumeName == "":
		if storagehelpers.CheckVolumeModeMismatches(&claim.Spec, &pv.Spec) {
			// 14-13: the claim will never bind to it; say so on both.
			b.recorder.Event(pv, corev1.EventTypeWarning, reasonVolumeMismatch, fmt.Sprintf(msgVolumeModeMismatchPV, claimKey(claim)))
			b.recorder.Event(claim, corev1.EventTypeWarning, reasonVolumeMismatch, fmt.Sprintf(msgVolumeModeMismatchPVC, pv.Name))
			return result{}, nil
		}
		// Reserved for a claim that is not bound yet (4-5): let the claim
		// sync finish the binding; the phase stays as it is.
		logger.V(4).Info("Volume is reserved for an unbound claim, queueing the claim", "pvc", klog.KObj(claim))
		b.claimQueue.Add(claimKey(claim))
		return result{}, nil
	case claim.Spec.VolumeName == pv.Name:
		// 4-6, 4-9, 4-11.
		_, err := b.updateVolumePhase(ctx, pv, corev1.VolumeBound, "")
		return result{}, err
	case metav1.HasAnnotation(pv.ObjectMeta, storagehelpers.AnnDynamicallyProvisioned) &&
		pv.Spec.PersistentVolumeReclaimPolicy == corev1.PersistentVolumeReclaimDelete:
		// A provisioned volume whose claim got bound to another volume
		// lost a race: release it so it gets deleted (8-11, 8-12).
		logger.V(4).Info("Claim of the provisioned volume is bound to another volume", "pvc", klog.KObj(claim), "claimVolume", claim.Spec.VolumeName)
		return result{}, b.release(ctx, pv)
	default:
		// The claim is bound to another volume: undo this side (4-7, 4-8).
		return result{}, b.unbindVolume(ctx, pv)
	}
}

// otherClaimBoundTo returns an existing claim, other than the one ref
// names (namespace, name and UID: a claim with the UID but another name is
// another claim, one the claimRef was edited away from), that completed a
// binding to pv and still names it in spec.volumeName, or nil. Only a claim
// a binder bound counts, not one whose user set bind-completed and
// spec.volumeName (see AnnBoundClaims). A claim
// being deleted counts: kubernetes.io/pvc-protection keeps it while pods
// still use the volume, and its deletion queues the volume again. Of
// several such claims it returns one that is not Lost if there is one (the
// index's order is a map's), so that a caller asking whether a claim still
// uses the volume is not answered with a claim that lost it.
func (b *Binder) otherClaimBoundTo(pv *corev1.PersistentVolume, ref *corev1.ObjectReference) *corev1.PersistentVolumeClaim {
	other := func(c *corev1.PersistentVolumeClaim) bool {
		return c.UID != ref.UID || claimKey(c) != claimRefKey(ref)
	}
	if objs, err := b.pvcInformer.GetIndexer().ByIndex(indexClaimByVolume, pv.Name); err == nil {
		var first *corev1.PersistentVolumeClaim
		for _, obj := range objs {
			c, ok := obj.(*corev1.PersistentVolumeClaim)
			if !ok || !other(c) || !boundByBinder(pv, c) {
				continue
			}
			if c.Status.Phase != corev1.ClaimLost {
				return c
			}
			if first == nil {
				first = c
			}
		}
		if first != nil {
			return first
		}
	}
	// A claim bound to the volume named after it has no index entry (see
	// WithUIDNamedVolumes): it can only be the claim whose UID the volume's
	// name holds. That is the claimRef's claim, unless the claimRef was
	// edited or the volume restored under its old name; only then look
	// for it, through every cached claim, by the index's rule.
	// A claim known to be gone (see newGoneClaims) spares that walk.
	uid, named := b.volumes.UIDOf(pv.Name)
	if !named || (uid == ref.UID && b.claimHasUID(ref.Namespace, ref.Name, uid)) || b.gone.Has(uid) {
		return nil
	}
	var bound *corev1.PersistentVolumeClaim
	b.gone.Walk(uid, func() bool {
		for _, obj := range b.pvcInformer.GetIndexer().List() {
			c, ok := obj.(*corev1.PersistentVolumeClaim)
			if !ok || c.UID != uid {
				continue
			}
			if c.Spec.VolumeName == pv.Name && metav1.HasAnnotation(c.ObjectMeta, storagehelpers.AnnBindCompleted) && other(c) && boundByBinder(pv, c) {
				bound = c
			}
			return true
		}
		return false
	})
	return bound
}

// claimHasUID reports whether the cached claim namespace/name has uid.
func (b *Binder) claimHasUID(namespace, name string, uid types.UID) bool {
	c := b.getClaim(namespace, name)
	return c != nil && c.UID == uid
}

// claimOfVolume returns the claim pv's claimRef names if it still exists
// with the claimRef's UID, or nil. A volume must never be released because
// the binder has not seen its claim yet (seed bug 2): when the claim is not
// cached, it is read from the API server, unless the volume is already
// Released or Failed; when the cached claim has another UID, the claim is
// read again from the API server to rule out a stale cache.
func (b *Binder) claimOfVolume(ctx context.Context, pv *corev1.PersistentVolume) (*corev1.PersistentVolumeClaim, error) {
	ref := pv.Spec.ClaimRef
	claim := b.getClaim(ref.Namespace, ref.Name)
	live := false
	if claim == nil && pv.Status.Phase != corev1.VolumeReleased && pv.Status.Phase != corev1.VolumeFailed {
		var err error
		if claim, err = b.getClaimFromAPI(ctx, ref.Namespace, ref.Name); err != nil {
			return nil, fmt.Errorf("get claim %s of volume %s: %w", claimRefKey(ref), pv.Name, err)
		}
		live = true
	}
	if claim != nil && claim.UID != ref.UID && !live {
		var err error
		if claim, err = b.getClaimFromAPI(ctx, ref.Namespace, ref.Name); err != nil {
			return nil, fmt.Errorf("get claim %s of volume %s: %w", claimRefKey(ref), pv.Name, err)
		}
	}
	if claim != nil && claim.UID != ref.UID {
		return nil, nil
	}
	return claim, nil
}

// getClaimFromAPI reads a claim from the API server; nil when it does not
// exist.
func (b *Binder) getClaimFromAPI(ctx context.Context, namespace, name string) (*corev1.PersistentVolumeClaim, error) {
	claim, err := b.client.CoreV1().PersistentVolumeClaims(namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	klog.FromContext(ctx).V(4).Info("Read claim from the API server", "pvc", klog.KObj(claim), "claimUID", claim.UID)
	return claim, nil
}

// volumeExistsInAPI reports whether the API server has a volume of that
// name.
func (b *Binder) volumeExistsInAPI(ctx context.Context, name string) (bool, error) {
	_, err := b.client.CoreV1().PersistentVolumes().Get(ctx, name, metav1.GetOptions{})
	return found(err)
}

// classExistsInAPI reports whether the API server has a StorageClass of
// that name.
func (b *Binder) classExistsInAPI(ctx context.Context, name string) (bool, error) {
	_, err := b.client.StorageV1().StorageClasses().Get(ctx, name, metav1.GetOptions{})
	return found(err)
}

// found turns the error of a Get into whether the object exists: NotFound
// is false without an error.
func found(err error) (bool, error) {
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	return err == nil, err
}

// release sets phase Released (unless already Released or Failed) and then
// applies the reclaim policy:
//
//   - Delete: nothing more; the provisioner deletes Released volumes of its
//     driver (CSI DeleteVolume, then the PV object). The binder never calls
//     the driver and never touches the PV's finalizers. A static in-tree
//     volume of the migrated plugin that the provisioner does not delete
//     gets a Warning saying so (see reportUndeletableInTree).
//   - Retain: the volume stays Released until an administrator clears its
//     claimRef (or only the UID in it).
//   - Recycle: not supported for CSI volumes; phase Failed with a Warning.
//   - anything else: phase Failed with a Warning.
func (b *Binder) release(ctx context.Context, pv *corev1.PersistentVolume) error {
	if pv.Status.Phase != corev1.VolumeReleased && pv.Status.Phase != corev1.VolumeFailed {
		var err error
		if pv, err = b.updateVolumePhase(ctx, pv, corev1.VolumeReleased, ""); err != nil {
			return err
		}
	}
	switch pv.Spec.PersistentVolumeReclaimPolicy {
	case corev1.PersistentVolumeReclaimDelete:
		klog.FromContext(ctx).V(4).Info("Volume is released", "policy", pv.Spec.PersistentVolumeReclaimPolicy)
		b.reportUndeletableInTree(pv)
		return nil
	case corev1.PersistentVolumeReclaimRetain:
		klog.FromContext(ctx).V(4).Info("Volume is released", "policy", pv.Spec.PersistentVolumeReclaimPolicy)
		return nil
	case corev1.PersistentVolumeReclaimRecycle:
		return b.updateVolumePhaseWithEvent(ctx, pv, corev1.VolumeFailed, corev1.EventTypeWarning, reasonVolumeFailedRecycle, msgRecycleUnsupported)
	default:
		return b.updateVolumePhaseWithEvent(ctx, pv, corev1.VolumeFailed, corev1.EventTypeWarning, reasonVolumeUnknownReclaimPolicy, msgUnknownReclaimPolicy)
	}
}

// unbindVolume undoes the volume side of a binding whose claim is bound to
// another volume. A binding made by a controller is removed entirely (claimRef
// and bound-by-controller); a volume the user pre-bound keeps its claimRef
// without the UID, so it stays reserved for that claim name. Then the volume
// becomes Available.
func (b *Binder) unbindVolume(ctx context.Context, pv *corev1.PersistentVolume) error {
	clone := pv.DeepCopy()
	if metav1.HasAnnotation(clone.ObjectMeta, storagehelpers.AnnBoundByController) {
		clone.Spec.ClaimRef = nil
		delete(clone.Annotations, storagehelpers.AnnBoundByController)
		if len(clone.Annotations) == 0 {
			clone.Annotations = nil
		}
	} else {
		clone.Spec.ClaimRef.UID = ""
	}
	updated, err := b.updateVolume(ctx, clone, "unbind")
	if err != nil {
		return err
	}
	_, err = b.updateVolumePhase(ctx, updated, corev1.VolumeAvailable, "")
	return err
}
