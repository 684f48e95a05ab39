package provisioner

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	storagehelpers "k8s.io/component-helpers/storage/volume"
	"k8s.io/klog/v2"

	"github.com/kube-storage/csi-provisioner/pkg/inflight"
)

// guardQueueName names the guard's workqueue in the workqueue metrics.
const guardQueueName = "inflight_guard"

// RunGuard runs the in-flight finalizer guard with the given number of
// workers (at least one) until ctx is done, and returns after its workers
// have stopped. The shared informer factory must be started by the caller;
// the guard waits for the provisioner's informers to sync. Without a
// recorder given to New, RunGuard also posts the provisioner's events. In
// node deployment it also bounds the provisioner's background waits and
// event retries (see background): when ctx ends it ends them and returns
// after they have returned, and none starts after that.
//
// The guard watches claims that carry the in-flight finalizer and are
// annotated for this driver (or were, when this process sent a
// CreateVolume for them: see guards), and the PVs that point to them, and
// removes the finalizer when no CreateVolume for the claim can leak any
// more:
//
//   - the PV provisioned for the claim exists (its claimRef carries the
//     claim's UID, and it is named after the claim or annotated as
//     provisioned by this driver), and the claim is bound, or being
//     deleted, or this product's binder is disabled. With the binder on, the
//     binder removes the finalizer in the write that binds the claim, so the
//     guard normally writes nothing; it still cleans up when another binder
//     (kube-controller-manager) bound the claim;
//   - or, for a claim that is being deleted or is bound to another volume,
//     this process knows that no CreateVolume for it is in flight: it saw
//     a final answer to the last one, or it saw the claim without the
//     finalizer and sent none since.
//
// A claim bound to another volume while its create may still be in flight
// keeps the finalizer and gets a Warning event saying what to check, and
// so does a late-binding claim deleted without a selected node whose
// create this process knows nothing of (see libraryClaims for how a
// reschedule normally avoids that), and a deleted claim whose class is
// gone while its create may have been in flight.
func (p *Provisioner) RunGuard(ctx context.Context, workers int) {
	logger := klog.FromContext(ctx).WithName("inflight-guard")
	ctx = klog.NewContext(ctx, logger)
	if p.broadcaster != nil {
		p.broadcaster.StartStructuredLogging(3)
		p.broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: p.client.CoreV1().Events("")})
		defer p.broadcaster.Shutdown()
	}
	p.bg.start(ctx)
	defer p.bg.stop()
	queue := p.newQueue(guardQueueName)
	defer queue.ShutDown()

	claimReg, err := p.claimInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj interface{}) { p.enqueueClaim(queue, obj) },
		UpdateFunc: func(old, obj interface{}) { p.claimUpdated(queue, old, obj) },
		DeleteFunc: p.forgetClaim,
	})
	if err != nil {
		logger.Error(err, "Cannot watch claims; the in-flight guard does not run")
		return
	}
	defer func() { _ = p.claimInf.RemoveEventHandler(claimReg) }()
	volumeReg, err := p.volumeInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj interface{}) { enqueueClaimOf(queue, obj) },
		UpdateFunc: func(_, obj interface{}) { enqueueClaimOf(queue, obj) },
		DeleteFunc: func(obj interface{}) { enqueueClaimOf(queue, obj) },
	})
	if err != nil {
		logger.Error(err, "Cannot watch volumes; the in-flight guard does not run")
		return
	}
	defer func() { _ = p.volumeInf.RemoveEventHandler(volumeReg) }()
	// A class deleted after its claim: the claim did not change, but the
	// guard now has a Warning for it (see the class-gone case of guardSync).
	classReg, err := p.classInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		DeleteFunc: func(obj interface{}) {
			if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = tomb.Obj
			}
			class, ok := obj.(*storagev1.StorageClass)
			if !ok {
				return
			}
			for _, o := range p.claimInf.GetStore().List() {
				if c, ok := o.(*corev1.PersistentVolumeClaim); ok && c.DeletionTimestamp != nil && inflight.Has(c) &&
					storagehelpers.GetPersistentVolumeClaimClass(c) == class.Name {
					p.enqueueClaim(queue, c)
				}
			}
		},
	})
	if err != nil {
		logger.Error(err, "Cannot watch classes; the in-flight guard does not run")
		return
	}
	defer func() { _ = p.classInf.RemoveEventHandler(classReg) }()

	if !cache.WaitForCacheSync(ctx.Done(), p.HasSynced, claimReg.HasSynced, volumeReg.HasSynced) {
		return
	}
	logger.V(2).Info("Starting the in-flight finalizer guard", "workers", workers)
	runQueue(ctx, queue, workers, "In-flight guard", p.guardSync)
	logger.V(2).Info("Stopped the in-flight finalizer guard")
}

// claimOfKey returns the informer's claim with key namespace/name, or nil
// (and no error) when it is gone or key is not a claim key: there is
// nothing to sync then, and retrying cannot help.
func (p *Provisioner) claimOfKey(key string) (*corev1.PersistentVolumeClaim, error) {
	namespace, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil, nil
	}
	claim, err := p.claims.PersistentVolumeClaims(namespace).Get(name)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	return claim, err
}

// guardSync applies the guard's rules (see RunGuard) to the claim with
// key namespace/name.
func (p *Provisioner) guardSync(ctx context.Context, key string) error {
	logger := klog.FromContext(ctx)
	claim, err := p.claimOfKey(key)
	if claim == nil || err != nil {
		return err
	}
	if !inflight.Has(claim) || !p.guards(claim) {
		return nil
	}
	if p.node != nil && !p.nodeGuards(claim) {
		return nil
	}
	logger = logger.WithValues("pvc", klog.KObj(claim))
	deleting, bound := claim.DeletionTimestamp != nil, claim.Spec.VolumeName != ""

	if pv := p.provisionedVolume(logger, claim); pv != nil {
		if !bound && !deleting && p.cfg.binderEnabled {
			logger.V(5).Info("Leaving the in-flight finalizer to the binder", "pv", klog.KObj(pv))
			return nil
		}
		if err := p.removeInflight(ctx, claim); err != nil {
			return err
		}
		logger.V(2).Info("Removed the in-flight finalizer: the volume is recorded in its PV", "pv", klog.KObj(pv), "bound", bound, "deleting", deleting)
		return nil
	}
	if !deleting && !bound {
		return nil
	}
	released, err := p.releaseIdle(ctx, claim)
	if err != nil {
		return err
	}
	if released {
		logger.V(2).Info("Removed the in-flight finalizer: no CreateVolume is in flight", "bound", bound, "deleting", deleting)
		return nil
	}
	switch {
	case bound && (claim.Spec.VolumeName != p.VolumeName(claim) || p.cachedVolume(claim.Spec.VolumeName) != nil):
		// Bound to a volume that is not the one this driver's create
		// makes (another name, or a PV of that name that does not
		// record it: another provisioner's with the same prefix).
		p.recorder.Event(claim, corev1.EventTypeWarning, reasonProvisioningFailed, fmt.Sprintf(
			"the claim was bound to volume %s while a CreateVolume for it may have been in progress; finalizer %s stays so that a volume named %s of driver %s cannot leak: delete that volume in the storage backend if it exists, then remove the finalizer",
			claim.Spec.VolumeName, inflight.Finalizer, p.VolumeName(claim), p.name))
	case deleting && !p.annotatedForUs(claim):
		// Handed to another provisioner: the library never provisions
		// the claim again, so no CreateVolume answer will release it.
		p.recorder.Event(claim, corev1.EventTypeWarning, reasonProvisioningFailed, fmt.Sprintf(
			"the claim is being deleted, and was handed to another provisioner while a CreateVolume for it may have been in progress; finalizer %s stays so that a volume named %s of driver %s cannot leak: delete that volume in the storage backend if it exists, then remove the finalizer",
			inflight.Finalizer, p.VolumeName(claim), p.name))
	case deleting && !bound && p.classMissing(claim) && (p.attempts.state(claim.UID) == attemptUnknown || p.attempts.state(claim.UID) == attemptSent):
		// The library needs the class to send the CreateVolume whose
		// answer would release the claim (the class's parameters and
		// secrets): it retries for ever, with only the binder's "not
		// found" on the claim, which does not say why it stays.
		p.recorder.Event(claim, corev1.EventTypeWarning, reasonProvisioningFailed, fmt.Sprintf(
			"the claim is being deleted, a CreateVolume for it may have been in progress, and its StorageClass %s no longer exists, so the provisioner cannot ask the driver again; finalizer %s stays so that a volume named %s of driver %s cannot leak: recreate the class, or delete that volume in the storage backend if it exists, then remove the finalizer",
			storagehelpers.GetPersistentVolumeClaimClass(claim), inflight.Finalizer, p.VolumeName(claim), p.name))
	case deleting && !bound && p.attempts.state(claim.UID) == attemptUnknown && p.waitsForNode(claim):
		// The library never provisions a late-binding claim without a
		// selected node, so no CreateVolume answer will release it.
		p.recorder.Event(claim, corev1.EventTypeWarning, reasonProvisioningFailed, fmt.Sprintf(
			"the claim is being deleted without a selected node, and a CreateVolume for it may have been in progress before this provisioner started; finalizer %s stays so that a volume named %s cannot leak: delete that volume in the storage backend if it exists, then remove the finalizer",
			inflight.Finalizer, p.VolumeName(claim)))
	}
	logger.V(4).Info("Keeping the in-flight finalizer: no PV records the volume yet", "bound", bound, "deleting", deleting)
	return nil
}

// classMissing reports whether the StorageClass claim names is not in the
// informer.
func (p *Provisioner) classMissing(claim *corev1.PersistentVolumeClaim) bool {
	name := storagehelpers.GetPersistentVolumeClaimClass(claim)
	if name == "" {
		return false
	}
	_, err := p.classes.Get(name)
	return apierrors.IsNotFound(err)
}

// waitsForNode reports whether claim is of a WaitForFirstConsumer class and
// has no selected node: the library does not provision it until the
// scheduler selects one.
func (p *Provisioner) waitsForNode(claim *corev1.PersistentVolumeClaim) bool {
	if metav1.HasAnnotation(claim.ObjectMeta, storagehelpers.AnnSelectedNode) {
		return false
	}
	delay, err := storagehelpers.IsDelayBindingMode(claim, p.classes)
	return err == nil && delay
}

// provisionedVolume returns the PV that records the volume provisioned for
// claim (a CSI volume of the driver, or an in-tree one of the migrated
// plugin), nil if there is none in the informer.
func (p *Provisioner) provisionedVolume(logger klog.Logger, claim *corev1.PersistentVolumeClaim) *corev1.PersistentVolume {
	for _, pv := range p.volumes.Volumes(claim.Namespace, claim.Name, claim.UID) {
		if pv.Spec.ClaimRef.UID != claim.UID {
			continue
		}
		if src, err := p.csiVolume(logger, pv); err != nil || src == nil {
			continue
		}
		by := pv.Annotations[storagehelpers.AnnDynamicallyProvisioned]
		if pv.Name == p.VolumeName(claim) || by == p.name || (p.cfg.inTree != "" && by == p.cfg.inTree) {
			return pv
		}
	}
	return nil
}

// enqueueClaim queues a claim of this driver that carries the finalizer,
// and feeds the ledger: a pending claim seen without the finalizer has had
// no CreateVolume yet; a bound one without it needs no record. In node
// deployment it ignores the claims that another node may send CreateVolume
// for (see nodeGuards).
func (p *Provisioner) enqueueClaim(queue workqueue.TypedInterface[string], obj interface{}) {
	claim, ok := obj.(*corev1.PersistentVolumeClaim)
	if !ok {
		return
	}
	if p.node != nil && !p.nodeGuards(claim) {
		return
	}
	if !inflight.Has(claim) {
		switch {
		case claim.Spec.VolumeName != "":
			p.attempts.forget(claim.UID)
		case claim.DeletionTimestamp == nil && (p.annotatedForUs(claim) || !annotatedForAny(claim)):
			p.attempts.observeClean(claim.UID)
		}
		return
	}
	if !p.guards(claim) {
		return
	}
	if key, err := cache.MetaNamespaceKeyFunc(claim); err == nil {
		queue.Add(key)
	}
}

// guards reports whether the in-flight finalizer on claim is this
// process's to remove: the claim is annotated for this driver, or this
// process sent a CreateVolume for it before it was handed to another
// provisioner (kube-controller-manager rewrites the annotations when the
// class is recreated with another provisioner). Nobody else removes the
// finalizer of such a claim, and it would keep the claim from being
// deleted for ever.
func (p *Provisioner) guards(claim *corev1.PersistentVolumeClaim) bool {
	return p.annotatedForUs(claim) || p.attempts.state(claim.UID).sent()
}

func annotatedForAny(claim *corev1.PersistentVolumeClaim) bool {
	_, ga := claim.Annotations[storagehelpers.AnnStorageProvisioner]
	_, beta := claim.Annotations[storagehelpers.AnnBetaStorageProvisioner]
	return ga || beta
}

// claimUpdated queues the claim as enqueueClaim does. An update from one
// UID to another is a relist's report of a claim deleted while the watch
// was down and created again under its name: the old one is forgotten.
func (p *Provisioner) claimUpdated(queue workqueue.TypedInterface[string], oldObj, obj interface{}) {
	old, okOld := oldObj.(*corev1.PersistentVolumeClaim)
	if claim, ok := obj.(*corev1.PersistentVolumeClaim); ok && okOld && old.UID != claim.UID {
		p.forgetClaim(old)
	}
	p.enqueueClaim(queue, obj)
}

// forgetClaim drops what the provisioner knows about a deleted claim.
func (p *Provisioner) forgetClaim(obj interface{}) {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	if claim, ok := obj.(*corev1.PersistentVolumeClaim); ok {
		p.attempts.forget(claim.UID)
		p.synced.forget(claim.UID)
		p.reschedules.take(claim.UID)
		p.topologies.drop(claim.UID)
		p.node.forget(claim.UID)
	}
}

func enqueueClaimOf(queue workqueue.TypedInterface[string], obj interface{}) {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	pv, ok := obj.(*corev1.PersistentVolume)
	if !ok || pv.Spec.ClaimRef == nil {
		return
	}
	queue.Add(pv.Spec.ClaimRef.Namespace + "/" + pv.Spec.ClaimRef.Name)
}
