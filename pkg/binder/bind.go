package binder

import (
	"context"
	"fmt"
	"reflect"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	storagehelpers "k8s.io/component-helpers/storage/volume"
	"k8s.io/klog/v2"

	"github.com/kube-storage/csi-provisioner/pkg/inflight"
)

// bind binds pv and claim with up to four writes, in this order, each
// skipped when it would change nothing:
//
//  1. volume: claimRef (with the claim's UID) and, when the binder chose the
//     volume, bound-by-controller;
//  2. volume status: phase Bound;
//  3. claim: spec.volumeName, bound-by-controller when the binder set
//     volumeName, bind-completed, and the in-flight finalizer removed;
//  4. claim status: phase Bound, access modes, capacity (only when the phase
//     changes) and current volume attributes class.
//
// A claim being deleted is gone once its last finalizer is: write 3
// removes the in-flight finalizer, or the provisioner's guard removed it
// before. bind then stops without an error (see claimGone).
//
// The volume comes first because its claimRef is the reservation every
// binder honours. bind stops at the first failed write and rolls nothing
// back: every state between two writes is one that syncClaim and syncVolume
// recognise and finish. pv must be unreserved or reserved for claim.
func (b *Binder) bind(ctx context.Context, pv *corev1.PersistentVolume, claim *corev1.PersistentVolumeClaim) error {
	logger := klog.FromContext(ctx)
	logger.V(4).Info("Binding", "pvc", klog.KObj(claim), "pv", klog.KObj(pv))

	var err error
	// 1. Reservation. Taking a volume not yet reserved for this claim goes
	// through reserveMu; completing one already reserved (a claimRef by name
	// only gets the UID) does not need to.
	if storagehelpers.IsVolumeBoundToClaim(pv, claim) {
		pv, err = b.writeReservation(ctx, pv, claim)
	} else {
		pv, err = b.reserve(ctx, pv, claim)
	}
	if err != nil {
		return err
	}

	// 2. Volume phase.
	if pv, err = b.updateVolumePhase(ctx, pv, corev1.VolumeBound, ""); err != nil {
		return err
	}

	// 3. Claim spec and metadata.
	deleting := claim.DeletionTimestamp != nil
	if claim, err = b.bindClaimToVolume(ctx, claim, pv); err != nil {
		return claimGone(logger, deleting, pv, err)
	}
	if deleting && len(claim.Finalizers) == 0 {
		// The write removed the last finalizer of a claim being deleted
		// (deleted while its CreateVolume ran): the API server deleted it.
		return claimGone(logger, deleting, pv, nil)
	}

	// 4. Claim status.
	_, err = b.updateClaimStatus(ctx, claim, corev1.ClaimBound, pv)
	return claimGone(logger, deleting, pv, err)
}

// claimGone returns err of a write of a claim being deleted (deleting),
// nil when err is nil or says that the claim is gone: its last finalizer
// went (in the bind write, or the provisioner's guard removed the
// in-flight finalizer first, as it does once the PV exists). Its volume is
// then released like that of any claim that went; nothing is to be retried
// or logged as an error.
func claimGone(logger klog.Logger, deleting bool, pv *corev1.PersistentVolume, err error) error {
	if !deleting || (err != nil && !apierrors.IsNotFound(err)) {
		return err
	}
	logger.V(2).Info("Claim deleted once its volume was provisioned", "pv", klog.KObj(pv))
	return nil
}

// bindClaimToVolume is step 3 of bind.
func (b *Binder) bindClaimToVolume(ctx context.Context, claim *corev1.PersistentVolumeClaim, pv *corev1.PersistentVolume) (*corev1.PersistentVolumeClaim, error) {
	clone := claim.DeepCopy()
	dirty := false
	if clone.Spec.VolumeName != pv.Name {
		clone.Spec.VolumeName = pv.Name
		metav1.SetMetaDataAnnotation(&clone.ObjectMeta, storagehelpers.AnnBoundByController, annBoundByControllerValue)
		dirty = true
	}
	if !metav1.HasAnnotation(clone.ObjectMeta, storagehelpers.AnnBindCompleted) {
		metav1.SetMetaDataAnnotation(&clone.ObjectMeta, storagehelpers.AnnBindCompleted, annBoundByControllerValue)
		dirty = true
	}
	// The volume this driver provisioned for the claim records the claim's
	// UID: no CreateVolume for this claim can leak any more (see package
	// inflight). A bind to any other volume leaves the finalizer: a create may
	// still be in flight, and the provisioner's guard removes it once that
	// create has ended.
	if b.provisionedFor(pv, clone) && inflight.Remove(clone) {
		dirty = true
	}
	if !dirty {
		return claim, nil
	}
	return b.updateClaim(ctx, clone, "bind to volume "+pv.Name)
}

// claimStatusFor returns the status claim should have in phase, with the
// volume it is bound to (nil for none), and whether it differs from the
// current one. The rules are upstream's: access modes follow the volume;
// capacity is set only when the phase changes (a later difference may be a
// resize in progress), from the pre-resize-capacity annotation when the
// volume has one; the current attributes class is set only on Pending →
// Bound; without a volume, all three are cleared.
func claimStatusFor(claim *corev1.PersistentVolumeClaim, phase corev1.PersistentVolumeClaimPhase, pv *corev1.PersistentVolume) (corev1.PersistentVolumeClaimStatus, bool) {
	st := *claim.Status.DeepCopy()
	dirty := false
	if st.Phase != phase {
		st.Phase = phase
		dirty = true
	}
	if pv == nil {
		// As kube-controller-manager: the access modes and the capacity
		// were the volume's; the current VolumeAttributesClass stays,
		// as the record of what the volume was last modified to.
		if st.AccessModes != nil || st.Capacity != nil {
			st.AccessModes, st.Capacity = nil, nil
			dirty = true
		}
		return st, dirty
	}
	if !reflect.DeepEqual(st.AccessModes, pv.Spec.AccessModes) {
		st.AccessModes = append([]corev1.PersistentVolumeAccessMode(nil), pv.Spec.AccessModes...)
		dirty = true
	}
	if claim.Status.Phase != phase {
		volumeCap, hasCap := pv.Spec.Capacity[corev1.ResourceStorage]
		claimCap, claimHasCap := claim.Status.Capacity[corev1.ResourceStorage]
		if pre, ok := pv.Annotations[annPreResizeCapacity]; ok {
			q, err := resource.ParseQuantity(pre)
			if err != nil {
				q = volumeCap
			}
			if st.Capacity == nil {
				st.Capacity = corev1.ResourceList{}
			}
			st.Capacity[corev1.ResourceStorage] = q
			dirty = true
		} else if hasCap && (!claimHasCap || volumeCap.Cmp(claimCap) != 0) {
			st.Capacity = pv.Spec.Capacity.DeepCopy()
			dirty = true
		}
	}
	if claim.Status.Phase == corev1.ClaimPending && phase == corev1.ClaimBound &&
		!reflect.DeepEqual(st.CurrentVolumeAttributesClassName, pv.Spec.VolumeAttributesClassName) {
		st.CurrentVolumeAttributesClassName = pv.Spec.VolumeAttributesClassName
		dirty = true
	}
	return st, dirty
}

// updateClaimStatus writes the claim status for phase (see claimStatusFor)
// if it changes anything. On the transition to Bound it records the binding
// latency and forgets the claim's earlier events.
func (b *Binder) updateClaimStatus(ctx context.Context, claim *corev1.PersistentVolumeClaim, phase corev1.PersistentVolumeClaimPhase, pv *corev1.PersistentVolume) (*corev1.PersistentVolumeClaim, error) {
	st, dirty := claimStatusFor(claim, phase, pv)
	if !dirty {
		return claim, nil
	}
	if phase == corev1.ClaimBound {
		b.addUnusedCondition(claim, &st)
	}
	clone := claim.DeepCopy()
	clone.Status = st
	out, err := b.updateClaimStatusWrite(ctx, clone, "phase "+string(phase))
	if err != nil {
		return nil, err
	}
	if phase == corev1.ClaimBound && claim.Status.Phase != corev1.ClaimBound {
		b.recorder.Forget(claim.UID)
		if pv != nil {
			b.recorder.Forget(pv.UID)
		}
		// A Lost claim bound again is no new binding: it was counted
		// when first bound, and its age would be one huge sample.
		if claim.Status.Phase != corev1.ClaimLost {
			latency := b.cfg.clock.Since(claim.CreationTimestamp.Time)
			b.metrics.bindingLatency.WithLabelValues(storagehelpers.GetPersistentVolumeClaimClass(claim)).Observe(latency.Seconds())
		}
	}
	return out, nil
}

// updateClaimStatusWithEvent changes the claim's phase and reports the event,
// both only if the phase changes.
func (b *Binder) updateClaimStatusWithEvent(ctx context.Context, claim *corev1.PersistentVolumeClaim, phase corev1.PersistentVolumeClaimPhase,
	pv *corev1.PersistentVolume, eventtype, reason, message string) error {
	if claim.Status.Phase == phase {
		return nil
	}
	if _, err := b.updateClaimStatus(ctx, claim, phase, pv); err != nil {
		return err
	}
	b.recorder.Event(claim, eventtype, reason, message)
	return nil
}

// updateVolumePhase sets the volume's phase and message, if the phase
// changes (otherwise the message is left alone, as upstream does).
func (b *Binder) updateVolumePhase(ctx context.Context, pv *corev1.PersistentVolume, phase corev1.PersistentVolumePhase, message string) (*corev1.PersistentVolume, error) {
	if pv.Status.Phase == phase {
		return pv, nil
	}
	clone := pv.DeepCopy()
	clone.Status.Phase = phase
	clone.Status.Message = message
	return b.updateVolumeStatus(ctx, clone, "phase "+string(phase))
}

// updateVolumePhaseWithEvent is updateVolumePhase plus an event, reported
// only when the phase changes.
func (b *Binder) updateVolumePhaseWithEvent(ctx context.Context, pv *corev1.PersistentVolume, phase corev1.PersistentVolumePhase, eventtype, reason, message string) error {
	if pv.Status.Phase == phase {
		return nil
	}
	if _, err := b.updateVolumePhase(ctx, pv, phase, message); err != nil {
		return err
	}
	b.recorder.Event(pv, eventtype, reason, message)
	return nil
}

// The four write primitives. Each stores what the API server returned in the
// write cache, counts the write, and logs one line at V(2).

func (b *Binder) updateVolume(ctx context.Context, pv *corev1.PersistentVolume, why string) (*corev1.PersistentVolume, error) {
	out, err := b.client.CoreV1().PersistentVolumes().Update(ctx, pv, metav1.UpdateOptions{FieldManager: FieldManager})
	b.metrics.countWrite(resourceVolumes, verbUpdate, err)
	if err != nil {
		return nil, fmt.Errorf("update volume %s (%s): %w", pv.Name, why, err)
	}
	b.pvs.store(out.Name, out)
	klog.FromContext(ctx).V(2).Info("Updated volume", "pv", klog.KObj(out), "change", why, "resourceVersion", out.ResourceVersion)
	return out, nil
}

func (b *Binder) updateVolumeStatus(ctx context.Context, pv *corev1.PersistentVolume, why string) (*corev1.PersistentVolume, error) {
	out, err := b.client.CoreV1().PersistentVolumes().UpdateStatus(ctx, pv, metav1.UpdateOptions{FieldManager: FieldManager})
	b.metrics.countWrite(resourceVolumes, verbUpdateStatus, err)
	if err != nil {
		return nil, fmt.Errorf("update status of volume %s (%s): %w", pv.Name, why, err)
	}
	b.pvs.store(out.Name, out)
	klog.FromContext(ctx).V(2).Info("Updated volume status", "pv", klog.KObj(out), "change", why, "resourceVersion", out.ResourceVersion)
	return out, nil
}

func (b *Binder) updateClaim(ctx context.Context, claim *corev1.PersistentVolumeClaim, why string) (*corev1.PersistentVolumeClaim, error) {
	out, err := b.client.CoreV1().PersistentVolumeClaims(claim.Namespace).Update(ctx, claim, metav1.UpdateOptions{FieldManager: FieldManager})
	b.metrics.countWrite(resourceClaims, verbUpdate, err)
	if err != nil {
		return nil, fmt.Errorf("update claim %s (%s): %w", claimKey(claim), why, err)
	}
	b.claims.store(claimKey(out), out)
	klog.FromContext(ctx).V(2).Info("Updated claim", "pvc", klog.KObj(out), "change", why, "resourceVersion", out.ResourceVersion)
	return out, nil
}

func (b *Binder) updateClaimStatusWrite(ctx context.Context, claim *corev1.PersistentVolumeClaim, why string) (*corev1.PersistentVolumeClaim, error) {
	out, err := b.client.CoreV1().PersistentVolumeClaims(claim.Namespace).UpdateStatus(ctx, claim, metav1.UpdateOptions{FieldManager: FieldManager})
	b.metrics.countWrite(resourceClaims, verbUpdateStatus, err)
	if err != nil {
		return nil, fmt.Errorf("update status of claim %s (%s): %w", claimKey(claim), why, err)
	}
	b.claims.store(claimKey(out), out)
	klog.FromContext(ctx).V(2).Info("Updated claim status", "pvc", klog.KObj(out), "change", why, "resourceVersion", out.ResourceVersion)
	return out, nil
}

// provisionedFor reports whether pv is the volume this driver provisioned
// for claim: provisioned by the driver, with the claim's UID in its claimRef.
func (b *Binder) provisionedFor(pv *corev1.PersistentVolume, claim *corev1.PersistentVolumeClaim) bool {
	return b.ownsProvisioner(pv.Annotations[storagehelpers.AnnDynamicallyProvisioned]) &&
		pv.Spec.ClaimRef != nil && pv.Spec.ClaimRef.UID == claim.UID
}
