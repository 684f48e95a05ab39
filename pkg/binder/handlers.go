package binder

import (
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/component-helpers/storage/ephemeral"
	storagehelpers "k8s.io/component-helpers/storage/volume"

	"github.com/kube-storage/csi-provisioner/internal/volindex"
)

// Indexer names; prefixed because the informers are shared.
const (
	// indexUnboundByClass maps in-scope volumes without claimRef to their
	// class: the candidates for static binding.
	indexUnboundByClass = "csi-provisioner-binder/unbound-volume-by-class"
	// indexForeignUnboundByClass maps out-of-scope volumes without
	// claimRef to their class: static volumes kube-controller-manager's
	// binder would bind to a claim of that class.
	indexForeignUnboundByClass = "csi-provisioner-binder/foreign-unbound-volume-by-class"
	// indexPendingByClass maps claims that have neither bind-completed nor
	// spec.volumeName to their class: the claims a new Available volume may
	// satisfy.
	indexPendingByClass = "csi-provisioner-binder/pending-claim-by-class"
	// indexClaimByVolume maps claims that completed a binding
	// (bind-completed) to their spec.volumeName: the claims that still use a
	// volume.
	indexClaimByVolume = "csi-provisioner-binder/bound-claim-by-volume"
	// indexPodByClaim maps pods to "namespace/claimName" of each claim they
	// use, generic ephemeral volumes included.
	indexPodByClaim = "csi-provisioner-binder/pod-by-claim"
)

func (b *Binder) indexUnboundVolumeByClass(obj interface{}) ([]string, error) {
	pv, ok := obj.(*corev1.PersistentVolume)
	if !ok || pv.Spec.ClaimRef != nil || !b.volumeInScope(pv) {
		return nil, nil
	}
	return []string{storagehelpers.GetPersistentVolumeClass(pv)}, nil
}

func (b *Binder) indexForeignUnboundVolumeByClass(obj interface{}) ([]string, error) {
	pv, ok := obj.(*corev1.PersistentVolume)
	if !ok || pv.Spec.ClaimRef != nil || b.volumeInScope(pv) {
		return nil, nil
	}
	return []string{storagehelpers.GetPersistentVolumeClass(pv)}, nil
}

func indexPendingClaimByClass(obj interface{}) ([]string, error) {
	claim, ok := obj.(*corev1.PersistentVolumeClaim)
	if !ok || claim.Spec.VolumeName != "" || metav1.HasAnnotation(claim.ObjectMeta, storagehelpers.AnnBindCompleted) {
		return nil, nil
	}
	return []string{storagehelpers.GetPersistentVolumeClaimClass(claim)}, nil
}

// indexBoundClaimByVolume leaves out claims bound to the volume named after
// them (see WithUIDNamedVolumes); otherClaimBoundTo finds those by name.
func (b *Binder) indexBoundClaimByVolume(obj interface{}) ([]string, error) {
	claim, ok := obj.(*corev1.PersistentVolumeClaim)
	if !ok || claim.Spec.VolumeName == "" || !metav1.HasAnnotation(claim.ObjectMeta, storagehelpers.AnnBindCompleted) {
		return nil, nil
	}
	if uid, named := b.volumes.UIDOf(claim.Spec.VolumeName); named && uid == claim.UID {
		return nil, nil
	}
	return []string{claim.Spec.VolumeName}, nil
}

// indexPodByClaimKey uses only the pod fields the caller promises to keep
// in the shared cache: metadata, spec.volumes, spec.nodeName, status.phase.
func indexPodByClaimKey(obj interface{}) ([]string, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return nil, nil
	}
	var keys []string
	for i := range pod.Spec.Volumes {
		v := &pod.Spec.Volumes[i]
		switch {
		case v.PersistentVolumeClaim != nil:
			keys = append(keys, pod.Namespace+"/"+v.PersistentVolumeClaim.ClaimName)
		case v.Ephemeral != nil:
			keys = append(keys, pod.Namespace+"/"+ephemeral.VolumeClaimName(pod, v))
		}
	}
	return keys, nil
}

// unwrap returns the object of a delete notification, tombstones included.
func unwrap(obj interface{}) interface{} {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		return t.Obj
	}
	return obj
}

func (b *Binder) onVolumeAdd(obj interface{}) {
	pv, ok := obj.(*corev1.PersistentVolume)
	if !ok || !b.volumeInScope(pv) {
		return
	}
	b.pvs.observe(pv.Name, pv)
	b.volumeQueue.Add(pv.Name)
	if pv.Spec.ClaimRef != nil {
		b.claimQueue.Add(claimRefKey(pv.Spec.ClaimRef))
	} else if pv.Status.Phase == corev1.VolumeAvailable {
		b.queuePendingClaims(storagehelpers.GetPersistentVolumeClass(pv))
	}
}

func (b *Binder) onVolumeUpdate(oldObj, newObj interface{}) {
	pv, ok := newObj.(*corev1.PersistentVolume)
	if !ok || !b.volumeInScope(pv) {
		return
	}
	old, _ := oldObj.(*corev1.PersistentVolume)
	if old == nil {
		old = &corev1.PersistentVolume{}
	}
	b.pvs.observe(pv.Name, pv)
	b.volumeQueue.Add(pv.Name)
	refChanged := !sameClaimRef(old.Spec.ClaimRef, pv.Spec.ClaimRef)
	if pv.Spec.ClaimRef != nil && (refChanged || old.Status.Phase != pv.Status.Phase) {
		b.claimQueue.Add(claimRefKey(pv.Spec.ClaimRef))
	}
	if refChanged && old.Spec.ClaimRef != nil {
		b.claimQueue.Add(claimRefKey(old.Spec.ClaimRef))
	}
	// A volume became available: static binding need not wait for the
	// resync.
	if pv.Spec.ClaimRef == nil && pv.Status.Phase == corev1.VolumeAvailable &&
		(old.Spec.ClaimRef != nil || old.Status.Phase != corev1.VolumeAvailable) {
		b.queuePendingClaims(storagehelpers.GetPersistentVolumeClass(pv))
	}
}

func (b *Binder) onVolumeDelete(obj interface{}) {
	pv, ok := unwrap(obj).(*corev1.PersistentVolume)
	if !ok {
		return
	}
	b.pvs.forget(pv.Name)
	b.recorder.Forget(pv.UID)
	if !b.volumeInScope(pv) {
		return
	}
	// The claim becomes Lost quickly (5-4).
	if pv.Spec.ClaimRef != nil {
		b.lost.add(pv.Name, pv.Spec.ClaimRef.UID)
		b.claimQueue.Add(claimRefKey(pv.Spec.ClaimRef))
	}
}

func (b *Binder) onClaimAdd(obj interface{}) {
	claim, ok := obj.(*corev1.PersistentVolumeClaim)
	if !ok {
		return
	}
	key := claimKey(claim)
	b.claims.observe(key, claim)
	b.gone.Added(claim.UID)
	b.claimQueue.Add(key)
	// Volumes that point at this name may belong to an earlier claim of the
	// same name, or may be waiting for this one.
	b.queueVolumesReferencing(claim)
}

func (b *Binder) onClaimUpdate(oldObj, newObj interface{}) {
	claim, ok := newObj.(*corev1.PersistentVolumeClaim)
	if !ok {
		return
	}
	if old, ok := oldObj.(*corev1.PersistentVolumeClaim); ok && old.UID != claim.UID {
		// A relist replaced a claim deleted while the watch was down by a
		// new one of the same name: the one's deletion and the other's
		// addition (which clears a gone record of its UID).
		b.onClaimDelete(old)
		b.onClaimAdd(claim)
		return
	}
	key := claimKey(claim)
	b.claims.observe(key, claim)
	b.claimQueue.Add(key)
	if old, ok := oldObj.(*corev1.PersistentVolumeClaim); ok {
		b.observeUnusedCondition(old, claim)
		if storagehelpers.IsDelayBindingProvisioning(old) && !storagehelpers.IsDelayBindingProvisioning(claim) {
			// Rescheduled: the wait for a pod starts again (see
			// forgetWaitForConsumer). Every removal comes through here, so
			// the syncs need not forget the wait themselves.
			b.forgetWaitForConsumer(claim)
		}
		if old.Spec.VolumeName != claim.Spec.VolumeName && claim.Spec.VolumeName != "" {
			b.volumeQueue.Add(claim.Spec.VolumeName)
		}
	}
}

func (b *Binder) onClaimDelete(obj interface{}) {
	claim, ok := unwrap(obj).(*corev1.PersistentVolumeClaim)
	if !ok {
		return
	}
	key := claimKey(claim)
	b.claims.forget(key)
	b.recorder.Forget(claim.UID)
	if uid, named := b.volumes.UIDOf(claim.Spec.VolumeName); named && uid == claim.UID {
		b.gone.Deleted(claim.UID)
	}
	// The volume becomes Released quickly (5-3).
	if claim.Spec.VolumeName != "" {
		b.volumeQueue.Add(claim.Spec.VolumeName)
	}
	b.queueVolumesReferencing(claim)
}

// onClass queues the pending claims of a class that appeared, changed or
// disappeared and, when it is the driver's and default, the pending claims
// without a class, which may now take it.
func (b *Binder) onClass(obj interface{}) {
	if class, ok := unwrap(obj).(*storagev1.StorageClass); ok {
		b.queuePendingClaims(class.Name)
		if b.ownsClass(class) && isDefaultClass(class) {
			b.queuePendingClaims("")
		}
	}
}

// onClassUpdate is onClass, and also queues the claims without a class when
// a class, of any provisioner, stops being default: an older default class
// of the driver may now be the one the claims get.
func (b *Binder) onClassUpdate(oldObj, obj interface{}) {
	b.onClass(obj)
	old, okOld := oldObj.(*storagev1.StorageClass)
	class, ok := obj.(*storagev1.StorageClass)
	if okOld && ok && isDefaultClass(old) && !isDefaultClass(class) {
		b.queuePendingClaims("")
	}
}

// onClassDelete is onClass, and also queues the claims without a class when
// the class was default, for the same reason as onClassUpdate.
func (b *Binder) onClassDelete(obj interface{}) {
	b.onClass(obj)
	if class, ok := unwrap(obj).(*storagev1.StorageClass); ok && isDefaultClass(class) {
		b.queuePendingClaims("")
	}
}

// onPod queues the claims of a pod waiting to be scheduled, so that
// WaitForPodScheduled is reported without waiting for the resync.
func (b *Binder) onPod(obj interface{}) {
	pod, ok := obj.(*corev1.Pod)
	if !ok || pod.Spec.NodeName != "" || podTerminated(pod) {
		return
	}
	keys, _ := indexPodByClaimKey(pod)
	for _, k := range keys {
		b.claimQueue.Add(k)
	}
}

func (b *Binder) queuePendingClaims(class string) {
	objs, err := b.pvcInformer.GetIndexer().ByIndex(indexPendingByClass, class)
	if err != nil {
		return
	}
	for _, o := range objs {
		if c, ok := o.(*corev1.PersistentVolumeClaim); ok {
			b.claimQueue.Add(claimKey(c))
		}
	}
}

func (b *Binder) queueVolumesReferencing(claim *corev1.PersistentVolumeClaim) {
	for _, pv := range b.volumes.Volumes(claim.Namespace, claim.Name, claim.UID) {
		if b.volumeInScope(pv) {
			b.volumeQueue.Add(pv.Name)
		}
	}
}

// podTerminated reports whether a pod will never run again: finished, or
// being deleted.
func podTerminated(pod *corev1.Pod) bool {
	return pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed || pod.DeletionTimestamp != nil
}

func claimKey(c *corev1.PersistentVolumeClaim) string { return volindex.Key(c.Namespace, c.Name) }

func claimRefKey(ref *corev1.ObjectReference) string { return volindex.Key(ref.Namespace, ref.Name) }

func sameClaimRef(a, b *corev1.ObjectReference) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Namespace == b.Namespace && a.Name == b.Name && a.UID == b.UID
}
