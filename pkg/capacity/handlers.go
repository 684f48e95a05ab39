package capacity

import (
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/client-go/tools/cache"
	storagehelpers "k8s.io/component-helpers/storage/volume"
	"k8s.io/klog/v2"
)

// annSelectedNode is the annotation with which the scheduler selects a
// node for a claim with delayed binding.
const annSelectedNode = storagehelpers.AnnSelectedNode

// Event handlers. They only queue keys and recompute the desired items; all
// API writes happen in the sync functions.

// onTopologyChange handles the addition and deletion of classes, nodes and
// CSINodes.
func (c *Controller) onTopologyChange(any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.started {
		c.refreshLocked()
	}
}

func (c *Controller) onClassUpdate(oldObj, newObj any) {
	o, ok1 := oldObj.(*storagev1.StorageClass)
	n, ok2 := newObj.(*storagev1.StorageClass)
	if ok1 && ok2 && o.ResourceVersion == n.ResourceVersion {
		return
	}
	c.onTopologyChange(newObj)
}

// onNodeUpdate recomputes only when labels changed: nodes update their
// status often, and only labels make segments.
func (c *Controller) onNodeUpdate(oldObj, newObj any) {
	o, ok1 := oldObj.(*corev1.Node)
	n, ok2 := newObj.(*corev1.Node)
	if ok1 && ok2 && maps.Equal(o.Labels, n.Labels) {
		return
	}
	c.onTopologyChange(newObj)
}

// onCSINodeUpdate recomputes only when the driver's topology keys changed.
func (c *Controller) onCSINodeUpdate(oldObj, newObj any) {
	o, ok1 := oldObj.(*storagev1.CSINode)
	n, ok2 := newObj.(*storagev1.CSINode)
	if ok1 && ok2 {
		oldKeys, oldInstalled := topologyKeys(o, c.driverName)
		newKeys, newInstalled := topologyKeys(n, c.driverName)
		if oldInstalled == newInstalled && slices.Equal(oldKeys, newKeys) {
			return
		}
	}
	c.onTopologyChange(newObj)
}

// onObject handles an added or updated CSIStorageCapacity: it ends the
// record of an object this controller wrote once that version arrives,
// queues the object when it is obsolete, and queues its item when the item
// has more than one object.
func (c *Controller) onObject(obj any) {
	csc, ok := obj.(*storagev1.CSIStorageCapacity)
	if !ok {
		return
	}
	key, forItem := itemKeyOf(csc)
	c.mu.Lock()
	defer c.mu.Unlock()
	if forItem {
		c.deliveredLocked(key, csc)
	}
	if !c.started {
		return
	}
	if !forItem || !c.isDesiredLocked(key) {
		c.queue.Add(objectKey(csc.Name))
		return
	}
	if objs, _ := c.objInformer.GetIndexer().ByIndex(indexByItem, key); len(objs) > 1 {
		c.queue.Add(key)
	}
}

// onObjectDelete ends the record of a deleted object and queues its item,
// so that it is created again, when the item has no object left.
func (c *Controller) onObjectDelete(obj any) {
	if tombstone, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tombstone.Obj
	}
	csc, ok := obj.(*storagev1.CSIStorageCapacity)
	if !ok {
		return
	}
	key, forItem := itemKeyOf(csc)
	if !forItem {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.forgetWrittenLocked(key, csc.Name)
	if names, writing := c.writing[key]; writing {
		c.writing[key] = append(names, csc.Name)
	}
	if !c.started || !c.isDesiredLocked(key) || c.written[key] != nil {
		return
	}
	if objs, _ := c.objInformer.GetIndexer().ByIndex(indexByItem, key); len(objs) == 0 {
		c.logger.V(2).Info("CSIStorageCapacity deleted; creating it again", "csiStorageCapacity", klog.KObj(csc))
		c.queue.Add(key)
	}
}

// onVolume handles a new PersistentVolume: provisioning used capacity.
func (c *Controller) onVolume(obj any) {
	if pv, ok := obj.(*corev1.PersistentVolume); ok {
		c.queueForVolume(pv, "added")
	}
}

// onVolumeUpdate handles a PersistentVolume being deleted.
func (c *Controller) onVolumeUpdate(oldObj, newObj any) {
	o, ok1 := oldObj.(*corev1.PersistentVolume)
	n, ok2 := newObj.(*corev1.PersistentVolume)
	if ok1 && ok2 && o.DeletionTimestamp == nil && n.DeletionTimestamp != nil {
		c.queueForVolume(n, "deleting")
	}
}

// onVolumeDelete handles a deleted PersistentVolume: deletion freed capacity.
func (c *Controller) onVolumeDelete(obj any) {
	if tombstone, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tombstone.Obj
	}
	if pv, ok := obj.(*corev1.PersistentVolume); ok {
		c.queueForVolume(pv, "deleted")
	}
}

// onClaimUpdate handles a claim handed back to the scheduler: its
// selected-node annotation removed while it is still unbound, which the
// provisioning library does when the driver could not create the volume
// on that node (RESOURCE_EXHAUSTED) or the node is gone. The published
// capacity that led the scheduler there may be stale, so the items of the
// claim's class are refreshed at once, as upstream's provision wrapper
// refreshes them after a failed provisioning; otherwise the scheduler
// could pick the same node again until the next poll.
func (c *Controller) onClaimUpdate(oldObj, newObj any) {
	o, ok1 := oldObj.(*corev1.PersistentVolumeClaim)
	n, ok2 := newObj.(*corev1.PersistentVolumeClaim)
	if !ok1 || !ok2 || n.Spec.VolumeName != "" {
		return
	}
	_, had := o.Annotations[annSelectedNode]
	_, has := n.Annotations[annSelectedNode]
	if !had || has {
		return
	}
	class := storagehelpers.GetPersistentVolumeClaimClass(n)
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.started {
		return
	}
	queued := 0
	for key, it := range c.desired {
		if it.class == class {
			c.queue.Add(key)
			queued++
		}
	}
	if queued > 0 {
		c.logger.V(4).Info("Claim rescheduled; refreshing capacity", "pvc", klog.KObj(n), "storageClass", class,
			"previousNode", o.Annotations[annSelectedNode], "items", queued)
	}
}

// queueForVolume queues the items whose capacity pv's creation or deletion
// may have changed, when pv is a volume of this driver: with node affinity,
// the items of every class whose segment the affinity allows (the storage
// of a segment is shared by all classes: a volume of one class leaves less
// for the others); without, the items of pv's class, as upstream does.
func (c *Controller) queueForVolume(pv *corev1.PersistentVolume, event string) {
	if pv.Spec.CSI == nil || pv.Spec.CSI.Driver != c.driverName {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.started {
		return
	}
	placed := pv.Spec.NodeAffinity != nil && pv.Spec.NodeAffinity.Required != nil && len(pv.Spec.NodeAffinity.Required.NodeSelectorTerms) > 0
	queued := 0
	for key, it := range c.desired {
		if (placed || it.class == pv.Spec.StorageClassName) && compatible(it.segment, pv.Spec.NodeAffinity) {
			c.queue.Add(key)
			queued++
		}
	}
	c.logger.V(4).Info("Volume changed; refreshing capacity", "pv", klog.KObj(pv), "event", event, "items", queued)
}
