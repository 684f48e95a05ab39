package binder

import (
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	storagehelpers "k8s.io/component-helpers/storage/volume"
	csitrans "k8s.io/csi-translation-lib"
)

// Scope. The binder writes only objects in its scope:
//
//   - a volume is in scope when spec.csi.driver is the driver, or its
//     pv.kubernetes.io/provisioned-by annotation names the driver, or, with
//     in-tree migration ([WithInTreeMigration]), the in-tree plugin, or its
//     in-tree volume source is that plugin's;
//   - a claim is in scope when its StorageClass's provisioner is the driver
//     (or the migrated in-tree plugin),
//     when its spec.volumeName names a volume in scope, when a volume in
//     scope is pre-bound to it (claimRef), or when it matches an unbound
//     static volume in scope (whatever its class: a claim of another
//     provisioner's class is matched as kube-controller-manager's binder
//     matches it before handing it to that provisioner); a claim with no
//     class at all (nil, not "") also when the default class names the
//     driver (see defaultclass.go).
//
// The one exception is the ProvisioningFailed event on a claim whose class
// does not exist and that no static volume fits, not even another
// driver's: nobody else would report it.

// volumeInScope reports whether pv belongs to the driver: a CSI volume of
// the driver, one provisioned by it or, with in-tree migration, a volume of
// the migrated in-tree plugin.
func (b *Binder) volumeInScope(pv *corev1.PersistentVolume) bool {
	if pv.Spec.CSI != nil && pv.Spec.CSI.Driver == b.driver {
		return true
	}
	if b.ownsProvisioner(pv.Annotations[storagehelpers.AnnDynamicallyProvisioned]) {
		return true
	}
	if b.cfg.inTree == "" || pv.Spec.CSI != nil {
		return false
	}
	plugin, err := csitrans.New().GetInTreePluginNameFromSpec(pv, nil)
	return err == nil && plugin == b.cfg.inTree
}

// ownsProvisioner reports whether a provisioner name is the driver's, or,
// with in-tree migration, its in-tree plugin's.
func (b *Binder) ownsProvisioner(name string) bool {
	return name == b.driver || (b.cfg.inTree != "" && name == b.cfg.inTree)
}

// ownsClass reports whether class (nil for none) names the driver, or the
// in-tree plugin it migrates, as provisioner.
func (b *Binder) ownsClass(class *storagev1.StorageClass) bool {
	return class != nil && b.ownsProvisioner(class.Provisioner)
}

// classOf returns the claim's class object, or nil when the claim has class
// "" or its class does not exist.
func (b *Binder) classOf(claim *corev1.PersistentVolumeClaim) *storagev1.StorageClass {
	name := storagehelpers.GetPersistentVolumeClaimClass(claim)
	if name == "" {
		return nil
	}
	class, err := b.scLister.Get(name)
	if err != nil {
		return nil // listers fail only with NotFound
	}
	return class
}

// classIsOurs reports whether the claim's class exists and names the driver
// as provisioner.
func (b *Binder) classIsOurs(claim *corev1.PersistentVolumeClaim) bool {
	return b.ownsClass(b.classOf(claim))
}

// getClaim returns the newest known copy of a claim, or nil. Never modify it.
func (b *Binder) getClaim(namespace, name string) *corev1.PersistentVolumeClaim {
	c, err := b.pvcLister.PersistentVolumeClaims(namespace).Get(name)
	if err != nil {
		c = nil
	}
	return b.claims.newest(namespace+"/"+name, c)
}

// getVolume returns the newest known copy of a volume, or nil. Never modify
// it.
func (b *Binder) getVolume(name string) *corev1.PersistentVolume {
	pv, err := b.pvLister.Get(name)
	if err != nil {
		pv = nil
	}
	return b.pvs.newest(name, pv)
}

// volumesReferencing returns the newest copies of the in-scope volumes whose
// claimRef names the claim (namespace and name; any UID, except that
// volumes named after an earlier claim's UID may be left out, see
// volindex.Index.Volumes), sorted by name.
func (b *Binder) volumesReferencing(claim *corev1.PersistentVolumeClaim) []*corev1.PersistentVolume {
	key := claimKey(claim)
	names := map[string]bool{}
	for _, pv := range b.volumes.Volumes(claim.Namespace, claim.Name, claim.UID) {
		names[pv.Name] = true
	}
	for _, pv := range b.pvs.snapshot() {
		if pv.Spec.ClaimRef != nil && claimRefKey(pv.Spec.ClaimRef) == key {
			names[pv.Name] = true
		}
	}
	return b.collectVolumes(names, func(pv *corev1.PersistentVolume) bool {
		return pv.Spec.ClaimRef != nil && claimRefKey(pv.Spec.ClaimRef) == key
	})
}

// unboundVolumesOfClass returns the newest copies of the in-scope volumes
// without claimRef whose class is class, sorted by name.
func (b *Binder) unboundVolumesOfClass(class string) []*corev1.PersistentVolume {
	names := map[string]bool{}
	if objs, err := b.pvInformer.GetIndexer().ByIndex(indexUnboundByClass, class); err == nil {
		for _, o := range objs {
			names[o.(*corev1.PersistentVolume).Name] = true
		}
	}
	for _, pv := range b.pvs.snapshot() {
		if pv.Spec.ClaimRef == nil && storagehelpers.GetPersistentVolumeClass(pv) == class {
			names[pv.Name] = true
		}
	}
	return b.collectVolumes(names, func(pv *corev1.PersistentVolume) bool {
		return pv.Spec.ClaimRef == nil && storagehelpers.GetPersistentVolumeClass(pv) == class
	})
}

// collectVolumes looks up the newest copy of each named volume and keeps
// those in scope that still satisfy keep.
func (b *Binder) collectVolumes(names map[string]bool, keep func(*corev1.PersistentVolume) bool) []*corev1.PersistentVolume {
	out := make([]*corev1.PersistentVolume, 0, len(names))
	for name := range names {
		if pv := b.getVolume(name); pv != nil && b.volumeInScope(pv) && keep(pv) {
			out = append(out, pv)
		}
	}
	slices.SortFunc(out, func(x, y *corev1.PersistentVolume) int { return strings.Compare(x.Name, y.Name) })
	return out
}

// unscheduledPods returns the names, sorted, of the pods that use the claim
// and wait to be scheduled.
func (b *Binder) unscheduledPods(claim *corev1.PersistentVolumeClaim) []string {
	objs, err := b.podIndexer.ByIndex(indexPodByClaim, claimKey(claim))
	if err != nil {
		return nil
	}
	var names []string
	for _, o := range objs {
		pod, ok := o.(*corev1.Pod)
		if ok && pod.Spec.NodeName == "" && !podTerminated(pod) {
			names = append(names, pod.Name)
		}
	}
	slices.Sort(names)
	return names
}
