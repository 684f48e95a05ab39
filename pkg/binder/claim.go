package binder

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	storagehelpers "k8s.io/component-helpers/storage/volume"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/kube-storage/csi-provisioner/pkg/inflight"
)

// syncClaim brings one claim, "namespace/name", towards Bound. It is
// idempotent; an error means "retry later" and leaves a state the next sync
// continues from.
func (b *Binder) syncClaim(ctx context.Context, key string) (result, error) {
	namespace, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		klog.FromContext(ctx).Error(err, "Dropping malformed claim key")
		return result{}, nil
	}
	claim := b.getClaim(namespace, name)
	if claim == nil {
		klog.FromContext(ctx).V(4).Info("Claim is gone")
		return result{}, nil
	}
	// Only the presence of bind-completed counts, not its value.
	if !metav1.HasAnnotation(claim.ObjectMeta, storagehelpers.AnnBindCompleted) {
		if claim.Spec.VolumeName == "" {
			return b.syncPendingClaim(ctx, claim)
		}
		return result{}, b.syncPreboundClaim(ctx, claim)
	}
	return result{}, b.syncBoundClaim(ctx, claim)
}

// syncPendingClaim handles a claim that has neither bind-completed nor
// spec.volumeName (reference §1.1 A): bind it to a matching static volume,
// hand it to this driver's provisioner, or report why it waits.
func (b *Binder) syncPendingClaim(ctx context.Context, claim *corev1.PersistentVolumeClaim) (result, error) {
	logger := klog.FromContext(ctx)
	className := storagehelpers.GetPersistentVolumeClaimClass(claim)
	class := b.classOf(claim)
	ours := b.ownsClass(class)

	// Delayed binding comes from the class alone. A claim with a selected
	// node is to be provisioned: it never takes an unbound static volume
	// (seed bug 1), only one pre-bound to it. Nor does a claim being
	// deleted (its in-flight finalizer may keep it for a whole
	// CreateVolume): it would take a volume from a live claim only for the
	// volume to be Released, and reclaimed, when it goes. A volume
	// pre-bound to it (the one provisioned for it) is still bound, so the
	// finalizer can go.
	//
	// A claim of another provisioner's class (kubernetes.io/no-provisioner
	// for static volumes, typically) takes an unbound static volume of this
	// driver in that class too, as kube-controller-manager's binder binds
	// it before handing the claim to that provisioner. A class without a
	// binding mode is reported only when it is ours; another provisioner's
	// is then left to its binder, with only volumes pre-bound to the claim
	// as candidates.
	delay, matchUnbound := false, class == nil
	if class != nil {
		d, err := storagehelpers.IsDelayBindingMode(claim, b.scLister)
		switch {
		case err == nil:
			delay, matchUnbound = d, true
		case ours:
			return result{}, fmt.Errorf("sync claim %s: %w", claimKey(claim), err)
		}
	}
	selected := storagehelpers.IsDelayBindingProvisioning(claim)

	// Candidates: volumes in scope pre-bound to the claim and unbound
	// volumes in scope of the class.
	candidates := func() []*corev1.PersistentVolume {
		pvs := b.volumesReferencing(claim)
		if matchUnbound {
			pvs = append(pvs, b.unboundVolumesOfClass(className)...)
		}
		return pvs
	}
	pv, err := b.matchAndReserve(ctx, claim, candidates, delay || selected || claim.DeletionTimestamp != nil)
	if err != nil {
		return result{}, err
	}
	if pv != nil {
		return result{}, b.bind(ctx, pv, claim)
	}
	if ours || b.ourDefaultClassFor(claim) != nil {
		// As kube-controller-manager's binder, which matches a claim
		// against every volume: one that fits is bound before the claim
		// is handed to a provisioner or given the default class. That
		// binder binds a volume out of this driver's scope; a claim it
		// has not bound within the provisioning grace (it is off, say)
		// gets one ExternalBinding event.
		if foreign := b.foreignVolumeFitting(claim, className, delay || selected || claim.DeletionTimestamp != nil); foreign != nil {
			logger.V(2).Info("A volume of another driver or plugin fits the claim: leaving it to kube-controller-manager's binder", "pv", klog.KObj(foreign), "class", className)
			if age := b.cfg.clock.Since(claim.CreationTimestamp.Time); age < b.cfg.grace {
				return result{requeueAfter: b.cfg.grace - age}, nil
			}
			b.recorder.Event(claim, corev1.EventTypeNormal, reasonExternalBinding, fmt.Sprintf(msgExternalBinding, foreign.Name, b.driver))
			return result{}, nil
		}
	}
	if def := b.ourDefaultClassFor(claim); def != nil {
		return result{}, b.assignDefaultClass(ctx, claim, def)
	}

	switch {
	case ours && delay && !selected:
		b.reportWaitForConsumer(claim)
		_, err := b.updateClaimStatus(ctx, claim, corev1.ClaimPending, nil)
		return result{}, err
	case ours:
		// The volume provisioned for the claim, if it does not fit, is
		// never bound, and the provisioning library provisions nothing
		// while it exists: say why instead of waiting for a volume "to be
		// created" (kube-controller-manager's message).
		for _, pv := range b.volumesReferencing(claim) {
			if !b.provisionedFor(pv, claim) {
				continue
			}
			if err := checkVolumeSatisfyClaim(pv, claim); err != nil {
				b.recorder.Event(claim, corev1.EventTypeWarning, reasonVolumeMismatch, fmt.Sprintf(msgProvisionedMismatch, pv.Name, err))
				_, err := b.updateClaimStatus(ctx, claim, corev1.ClaimPending, nil)
				return result{}, err
			}
		}
		return b.handToProvisioner(ctx, claim, class)
	case className == "" && len(b.volumesReferencing(claim)) > 0:
		// In scope through a volume pre-bound to it that does not fit.
		b.recorder.Event(claim, corev1.EventTypeNormal, reasonFailedBinding, msgNoVolumeNoClass)
		_, err := b.updateClaimStatus(ctx, claim, corev1.ClaimPending, nil)
		return result{}, err
	case class == nil:
		// Its class does not exist, or it has none, and no volume of this
		// driver fits: nobody's. Say why it waits, once among binders
		// (see unowned.go).
		return b.reportUnowned(ctx, claim, className)
	default:
		logger.V(5).Info("Claim is not in scope", "class", className)
		return result{}, nil
	}
}

// foreignVolumeFitting returns a volume out of scope that fits claim as
// kube-controller-manager's binder would match it, or nil: one pre-bound to
// the claim by claimRef (any class), or, unless skipUnbound, an unbound one
// of class className. Such a claim is that binder's to bind, as upstream,
// where the claim is never handed to a provisioner while a volume fits.
func (b *Binder) foreignVolumeFitting(claim *corev1.PersistentVolumeClaim, className string, skipUnbound bool) *corev1.PersistentVolume {
	var candidates []*corev1.PersistentVolume
	for _, pv := range b.volumes.Volumes(claim.Namespace, claim.Name, claim.UID) {
		if !b.volumeInScope(pv) {
			candidates = append(candidates, pv)
		}
	}
	if !skipUnbound {
		if objs, err := b.pvInformer.GetIndexer().ByIndex(indexForeignUnboundByClass, className); err == nil {
			for _, o := range objs {
				candidates = append(candidates, o.(*corev1.PersistentVolume))
			}
		}
	}
	if len(candidates) == 0 {
		return nil
	}
	pv, err := findBestMatch(claim, candidates, skipUnbound)
	if err != nil {
		return nil
	}
	return pv
}

// handToProvisioner sets the storage-provisioner annotations (both keys) to
// the driver (also for a class of the migrated in-tree plugin, as
// kube-controller-manager v1.37 does, without pv.kubernetes.io/migrated-to
// on the claim), with the in-flight finalizer in the same write when the
// provisioning check passes. A claim that stays unbound longer than the
// provisioning grace gets one ExternalProvisioning event.
func (b *Binder) handToProvisioner(ctx context.Context, claim *corev1.PersistentVolumeClaim, class *storagev1.StorageClass) (result, error) {
	logger := klog.FromContext(ctx)
	if claim.DeletionTimestamp != nil {
		logger.V(4).Info("Claim is being deleted, not handing it to the provisioner")
		return result{}, nil
	}
	if claim.Annotations[storagehelpers.AnnStorageProvisioner] != b.driver ||
		claim.Annotations[storagehelpers.AnnBetaStorageProvisioner] != b.driver {
		clone := claim.DeepCopy()
		metav1.SetMetaDataAnnotation(&clone.ObjectMeta, storagehelpers.AnnStorageProvisioner, b.driver)
		metav1.SetMetaDataAnnotation(&clone.ObjectMeta, storagehelpers.AnnBetaStorageProvisioner, b.driver)
		why := "hand to provisioner"
		if err := b.checkProvision(ctx, claim, class); err != nil {
			logger.V(2).Info("Handing the claim to the provisioner without the in-flight finalizer", "pvc", klog.KObj(claim), "reason", err.Error())
		} else if inflight.Add(clone, b.volumeName(clone)) {
			why += " with in-flight finalizer"
		}
		updated, err := b.updateClaim(ctx, clone, why)
		if err != nil {
			return result{}, err
		}
		claim = updated
	}
	age := b.cfg.clock.Since(claim.CreationTimestamp.Time)
	if age < b.cfg.grace {
		return result{requeueAfter: b.cfg.grace - age}, nil
	}
	b.recorder.Event(claim, corev1.EventTypeNormal, reasonExternalProvisioning, fmt.Sprintf(msgExternalProvisioning, b.driver))
	return result{}, nil
}

// volumeName is the name the provisioner's CreateVolume for claim uses, ""
// without a [ProvisionChecker].
func (b *Binder) volumeName(claim *corev1.PersistentVolumeClaim) string {
	if b.cfg.checker == nil {
		return ""
	}
	return b.cfg.checker.VolumeName(claim)
}

func (b *Binder) checkProvision(ctx context.Context, claim *corev1.PersistentVolumeClaim, class *storagev1.StorageClass) error {
	if b.cfg.checker == nil {
		return nil
	}
	return b.cfg.checker.CheckProvision(ctx, claim, class)
}

// reportWaitForConsumer reports why a delayed-binding claim waits: for a pod
// to be scheduled, or for a first pod at all.
func (b *Binder) reportWaitForConsumer(claim *corev1.PersistentVolumeClaim) {
	reason, message := b.waitForConsumer(claim)
	b.recorder.Event(claim, corev1.EventTypeNormal, reason, message)
}

// forgetWaitForConsumer forgets the wait reportWaitForConsumer posted for
// claim, if that is the claim's last event. The claim handler calls it when
// the provisioner rescheduled the claim (selected-node removed: the driver
// had no room there): the wait starts again and is posted again, as
// kube-controller-manager posts it at every sync, instead of being dropped
// as a repetition for RefreshInterval.
func (b *Binder) forgetWaitForConsumer(claim *corev1.PersistentVolumeClaim) {
	reason, message := b.waitForConsumer(claim)
	if b.recorder.Repeats(claim, corev1.EventTypeNormal, reason, message) {
		b.recorder.Forget(claim.UID)
	}
}

func (b *Binder) waitForConsumer(claim *corev1.PersistentVolumeClaim) (reason, message string) {
	pods := b.unscheduledPods(claim)
	switch len(pods) {
	case 0:
		return reasonWaitForFirstConsumer, msgWaitForFirstConsumer
	case 1:
		return reasonWaitForPodScheduled, fmt.Sprintf(msgWaitForPod, pods[0])
	default:
		return reasonWaitForPodScheduled, fmt.Sprintf(msgWaitForPods, strings.Join(pods, ","))
	}
}

// syncPreboundClaim handles a claim with spec.volumeName but without
// bind-completed (reference §1.1 B): the user pre-bound it, or a binding
// stopped after its third write.
func (b *Binder) syncPreboundClaim(ctx context.Context, claim *corev1.PersistentVolumeClaim) error {
	logger := klog.FromContext(ctx)
	pv := b.getVolume(claim.Spec.VolumeName)
	if pv == nil {
		if !b.classIsOurs(claim) {
			return nil
		}
		// Upstream says nothing here, and the provisioner skips a claim
		// with spec.volumeName: without this event the claim would wait
		// with no explanation at all. A volume created just before the
		// claim may not be cached yet (the watches are not ordered): say
		// it is missing only when the API server agrees. Once that is said
		// (and until the Warning is due again), a resync asks no more: a
		// namespace's claims naming volumes that do not exist would
		// otherwise cost one read each at every resync, out of the budget
		// every other claim's binding shares.
		missing := fmt.Sprintf(msgCannotBindRequested, claim.Spec.VolumeName, msgRequestedVolumeMissing)
		if b.recorder.Repeats(claim, corev1.EventTypeWarning, reasonFailedBinding, missing) {
			_, err := b.updateClaimStatus(ctx, claim, corev1.ClaimPending, nil)
			return err
		}
		exists, err := b.volumeExistsInAPI(ctx, claim.Spec.VolumeName)
		if err != nil {
			return fmt.Errorf("get volume %s requested by claim %s: %w", claim.Spec.VolumeName, claimKey(claim), err)
		}
		if exists {
			logger.V(4).Info("Requested volume is not cached yet", "pv", claim.Spec.VolumeName)
		} else {
			logger.V(4).Info("Requested volume does not exist yet", "pv", claim.Spec.VolumeName)
			b.recorder.Event(claim, corev1.EventTypeWarning, reasonFailedBinding, missing)
		}
		_, err = b.updateClaimStatus(ctx, claim, corev1.ClaimPending, nil)
		return err
	}
	if !b.volumeInScope(pv) {
		logger.V(5).Info("Requested volume is not in scope", "pv", klog.KObj(pv))
		return nil
	}
	switch {
	case (pv.Spec.ClaimRef == nil || storagehelpers.IsVolumeBoundToClaim(pv, claim)) && b.claimUsing(pv, claim) != nil:
		// Beyond upstream: a volume whose claimRef was removed, or edited
		// to this claim by name, is still another claim's while that claim
		// is bound to it; taking it would hand over that claim's data.
		b.recorder.Event(claim, corev1.EventTypeWarning, reasonFailedBinding, fmt.Sprintf(msgAlreadyBound, pv.Name))
		_, err := b.updateClaimStatus(ctx, claim, corev1.ClaimPending, nil)
		return err
	case pv.Spec.ClaimRef == nil:
		if err := checkVolumeSatisfyClaim(pv, claim); err != nil {
			b.recorder.Event(claim, corev1.EventTypeWarning, reasonVolumeMismatch, fmt.Sprintf(msgCannotBindRequested, pv.Name, err))
			_, err := b.updateClaimStatus(ctx, claim, corev1.ClaimPending, nil)
			return err
		}
		return b.bind(ctx, pv, claim)
	case storagehelpers.IsVolumeBoundToClaim(pv, claim):
		return b.bind(ctx, pv, claim)
	case !metav1.HasAnnotation(claim.ObjectMeta, storagehelpers.AnnBoundByController):
		// The user asked for a volume someone else has: wait.
		b.recorder.Event(claim, corev1.EventTypeWarning, reasonFailedBinding, fmt.Sprintf(msgAlreadyBound, pv.Name))
		_, err := b.updateClaimStatus(ctx, claim, corev1.ClaimPending, nil)
		return err
	default:
		// A binder set volumeName to a volume claimed by another claim.
		b.recorder.Event(claim, corev1.EventTypeWarning, reasonFailedBinding, fmt.Sprintf(msgAlreadyBound, pv.Name))
		return fmt.Errorf("invalid binding of claim %s to volume %s: volume already claimed by %s",
			claimKey(claim), pv.Name, claimRefKey(pv.Spec.ClaimRef))
	}
}

// syncBoundClaim handles a claim with bind-completed (reference §1.2).
func (b *Binder) syncBoundClaim(ctx context.Context, claim *corev1.PersistentVolumeClaim) error {
	if claim.Spec.VolumeName == "" {
		if !b.classIsOurs(claim) {
			return nil
		}
		return b.updateClaimStatusWithEvent(ctx, claim, corev1.ClaimLost, nil, corev1.EventTypeWarning, reasonClaimLost, msgClaimLostReference)
	}
	pv := b.getVolume(claim.Spec.VolumeName)
	if pv == nil {
		// A claim of another class is in scope only if its volume was
		// this driver's (see lostVolumes).
		if !b.classIsOurs(claim) && !b.lost.boundTo(claim.Spec.VolumeName, claim.UID) {
			return nil
		}
		// Another binder (kube-controller-manager's, or a previous
		// leader) may have bound the claim to a volume the informer has
		// not delivered yet: the claim and volume watches are not
		// ordered. Lost would stop the kubelet from mounting the claim and
		// say its data is lost, so ask the API server first (seed bug 2,
		// for claims). The volume's add event queues the claim again.
		if claim.Status.Phase != corev1.ClaimLost {
			exists, err := b.volumeExistsInAPI(ctx, claim.Spec.VolumeName)
			if err != nil {
				return fmt.Errorf("get volume %s of claim %s: %w", claim.Spec.VolumeName, claimKey(claim), err)
			}
			if exists {
				klog.FromContext(ctx).V(4).Info("Volume of the bound claim is not cached yet", "pv", claim.Spec.VolumeName)
				return nil
			}
		}
		return b.updateClaimStatusWithEvent(ctx, claim, corev1.ClaimLost, nil, corev1.EventTypeWarning, reasonClaimLost, msgClaimLostVolume)
	}
	if !b.volumeInScope(pv) {
		return nil
	}
	switch {
	case pv.Spec.ClaimRef == nil:
		// Re-bind; the selector is not checked (3-3, 3-7). Beyond
		// upstream: while another claim is still bound to a volume whose
		// claimRef was removed, a Lost claim does not take it if that
		// claim is not Lost (it re-binds the volume), and a claim no
		// binder bound to it (its user set bind-completed) never does.
		trusted := boundByBinder(pv, claim)
		if user := b.claimUsing(pv, claim); user != nil &&
			(!trusted || claim.Status.Phase == corev1.ClaimLost && user.Status.Phase != corev1.ClaimLost) {
			b.recorder.Event(claim, corev1.EventTypeWarning, reasonFailedBinding, fmt.Sprintf(msgAlreadyBound, pv.Name))
			return nil
		}
		// A claim no binder bound to pv (its user set bind-completed)
		// takes it no more easily than a claim its user pre-bound to it.
		if !trusted {
			if err := checkVolumeSatisfyClaim(pv, claim); err != nil {
				b.recorder.Event(claim, corev1.EventTypeWarning, reasonVolumeMismatch, fmt.Sprintf(msgCannotBindRequested, pv.Name, err))
				return nil
			}
		}
		return b.bind(ctx, pv, claim)
	case pv.Spec.ClaimRef.UID == claim.UID:
		// Mostly nothing to do; fills in missing phases (3-5).
		return b.bind(ctx, pv, claim)
	case storagehelpers.IsVolumeBoundToClaim(pv, claim) && b.mayRebindByName(pv, claim):
		// The claimRef names this claim without a UID: someone removed
		// it by hand. Beyond upstream, which marks the claim Lost
		// (Misbound) though no other claim has the volume: re-bind. Not
		// while another claim is still bound to it (the claimRef was
		// moved here by name): that is Misbound, as upstream.
		return b.bind(ctx, pv, claim)
	default:
		// Beyond upstream: a claim that was Bound is recorded on the
		// volume first, so that it still keeps the volume once Lost.
		if err := b.recordBound(ctx, pv, claim); err != nil {
			return err
		}
		return b.updateClaimStatusWithEvent(ctx, claim, corev1.ClaimLost, nil, corev1.EventTypeWarning, reasonClaimMisbound, msgClaimMisbound)
	}
}

// mayRebindByName reports whether claim, which pv's claimRef names without
// a UID, may bind pv again: no other claim is still bound to it, or claim
// is Bound and the others are Lost (claimUsing returns one that is not Lost
// if there is one), as a claimRef that was removed altogether is re-bound
// by the claim that is not Lost.
func (b *Binder) mayRebindByName(pv *corev1.PersistentVolume, claim *corev1.PersistentVolumeClaim) bool {
	user := b.claimUsing(pv, claim)
	return user == nil || claim.Status.Phase == corev1.ClaimBound && user.Status.Phase == corev1.ClaimLost
}

// checkVolumeSatisfyClaim checks a volume requested by spec.volumeName
// against the claim. Selector, node affinity and phase are not checked, as
// upstream does not check them for a pre-bound claim.
func checkVolumeSatisfyClaim(pv *corev1.PersistentVolume, claim *corev1.PersistentVolumeClaim) error {
	if pv.DeletionTimestamp != nil {
		return fmt.Errorf("the volume is marked for deletion %q", pv.Name)
	}
	// Whole bytes rounded up, as kube-controller-manager's Value()
	// comparison, but without its int64 overflow: a request of 10E would
	// read as 0 bytes and fit any volume.
	request := claim.Spec.Resources.Requests[corev1.ResourceStorage].DeepCopy()
	capacity := pv.Spec.Capacity[corev1.ResourceStorage].DeepCopy()
	request.RoundUp(0)
	capacity.RoundUp(0)
	if capacity.Cmp(request) < 0 {
		return fmt.Errorf("requested PV is too small")
	}
	if storagehelpers.GetPersistentVolumeClass(pv) != storagehelpers.GetPersistentVolumeClaimClass(claim) {
		return fmt.Errorf("storageClassName does not match")
	}
	if ptr.Deref(claim.Spec.VolumeAttributesClassName, "") != ptr.Deref(pv.Spec.VolumeAttributesClassName, "") {
		return fmt.Errorf("volumeAttributesClassName does not match")
	}
	if storagehelpers.CheckVolumeModeMismatches(&claim.Spec, &pv.Spec) {
		return fmt.Errorf("incompatible volumeMode")
	}
	if !storagehelpers.CheckAccessModes(claim, pv) {
		return fmt.Errorf("incompatible accessMode")
	}
	return nil
}
