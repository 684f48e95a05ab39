package provisioner

import (
	"context"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

const (
	// indexClaimByCloneSource maps a clone to "namespace/name" of its source
	// claim; claims that clone nothing take no entry.
	indexClaimByCloneSource = "csi-provisioner.provisioner/clone-source"
	// cloneProtectionQueueName names the workqueue in the workqueue metrics.
	cloneProtectionQueueName = "cloning_protection"
)

func (p *Provisioner) claimByCloneSource(obj interface{}) ([]string, error) {
	claim, ok := obj.(*corev1.PersistentVolumeClaim)
	if !ok {
		return nil, nil
	}
	if src := p.cloneSourceOf(claim); src != "" {
		return []string{src}, nil
	}
	return nil, nil
}

// RunCloneProtection runs the cloning protection with the given number of
// workers (at least one) until ctx is done, and returns after they stopped;
// it returns at once when the driver does not report CLONE_VOLUME. The
// shared informer factory must be started by the caller.
//
// It removes CloneFinalizer from a claim being deleted once no clone of it
// is pending (phase Pending, in its namespace, through dataSource or
// dataSourceRef). Upstream retries such a source with backoff while a clone
// is pending; here every change of a clone queues its source, so the
// finalizer goes as soon as the last clone is bound or deleted.
func (p *Provisioner) RunCloneProtection(ctx context.Context, workers int) {
	if !p.caps.CloneVolume {
		return
	}
	logger := klog.FromContext(ctx).WithName("cloning-protection")
	ctx = klog.NewContext(ctx, logger)
	queue := p.newQueue(cloneProtectionQueueName)
	defer queue.ShutDown()
	enqueue := func(obj interface{}) {
		if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = tomb.Obj
		}
		claim, ok := obj.(*corev1.PersistentVolumeClaim)
		if !ok {
			return
		}
		if claim.DeletionTimestamp != nil && slices.Contains(claim.Finalizers, CloneFinalizer) {
			queue.Add(claim.Namespace + "/" + claim.Name)
		}
		if src := p.cloneSourceOf(claim); src != "" {
			queue.Add(src)
		}
	}
	reg, err := p.claimInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj interface{}) { enqueue(obj) },
		DeleteFunc: enqueue,
	})
	if err != nil {
		logger.Error(err, "Cannot watch claims; the cloning protection does not run")
		return
	}
	defer func() { _ = p.claimInf.RemoveEventHandler(reg) }()
	if !cache.WaitForCacheSync(ctx.Done(), p.HasSynced, reg.HasSynced) {
		return
	}
	recheck := func(key string) { queue.Add(key) }
	p.recheckSource.Store(&recheck)
	defer p.recheckSource.Store(nil)
	logger.V(2).Info("Starting the cloning protection", "workers", workers)
	runQueue(ctx, queue, workers, "Cloning protection", p.cloneSourceSync)
}

// cloneSourceSync removes CloneFinalizer from the claim with key
// namespace/name when it is being deleted and no clone of it is pending.
func (p *Provisioner) cloneSourceSync(ctx context.Context, key string) error {
	claim, err := p.claimOfKey(key)
	if claim == nil || err != nil {
		return err
	}
	if claim.DeletionTimestamp == nil || !slices.Contains(claim.Finalizers, CloneFinalizer) {
		return nil
	}
	logger := klog.FromContext(ctx).WithValues("pvc", klog.KObj(claim))
	if pending := p.pendingClones(key); len(pending) > 0 {
		// The only explanation of a source left Terminating: at the
		// default verbosity (it runs when the source or a clone changes).
		logger.Info("Source claim is being deleted but keeps its cloning protection while clones of it are pending", "finalizer", CloneFinalizer, "clones", pending)
		return nil
	}
	clone := claim.DeepCopy()
	clone.Finalizers = slices.DeleteFunc(clone.Finalizers, func(f string) bool { return f == CloneFinalizer })
	if _, err := p.client.CoreV1().PersistentVolumeClaims(clone.Namespace).Update(ctx, clone, metav1.UpdateOptions{FieldManager: FieldManager}); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("remove finalizer %s: %w", CloneFinalizer, err)
	}
	logger.V(2).Info("Removed the cloning protection: no clone is pending")
	return nil
}

// pendingClones returns the keys (namespace/name), sorted, of the pending
// claims that clone the claim with key namespace/name and may keep it
// (keepsSourceOf).
func (p *Provisioner) pendingClones(key string) []string {
	objs, err := p.claimInf.GetIndexer().ByIndex(indexClaimByCloneSource, key)
	if err != nil {
		return nil
	}
	var names []string
	for _, o := range objs {
		if c, ok := o.(*corev1.PersistentVolumeClaim); ok && (c.Status.Phase == corev1.ClaimPending || c.Status.Phase == "") && p.keepsSourceOf(c) {
			names = append(names, c.Namespace+"/"+c.Name)
		}
	}
	slices.Sort(names)
	return names
}
