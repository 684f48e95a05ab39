package binder

import (
	"context"
	"strings"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/labels"
	storagehelpers "k8s.io/component-helpers/storage/volume"
	"k8s.io/klog/v2"
)

// Retroactive default class (reference §1.1 A.3a). The DefaultStorageClass
// admission plugin gives a new claim without a class the default class, but
// a claim created while no class was default keeps no class at all
// (spec.storageClassName nil, no beta annotation) and waits. Once a class
// becomes default, kube-controller-manager's binder sets such a claim's
// class to it when no static volume matches. This binder does the same when
// the default class's provisioner is the driver, so that a cluster without
// kube-controller-manager's binder behaves alike; a default class of another
// provisioner leaves the claim to others. An explicit class "" is a class
// and is never changed.

const (
	annDefaultClass     = "storageclass.kubernetes.io/is-default-class"
	annBetaDefaultClass = "storageclass.beta.kubernetes.io/is-default-class"
)

func isDefaultClass(class *storagev1.StorageClass) bool {
	return class.Annotations[annDefaultClass] == "true" || class.Annotations[annBetaDefaultClass] == "true"
}

// defaultClass returns the class the admission plugin would give a new
// claim: of the classes marked default, the newest, and of those created
// in the same second, the one with the lowest name. Nil when none is.
func (b *Binder) defaultClass() *storagev1.StorageClass {
	classes, err := b.scLister.List(labels.Everything())
	if err != nil {
		return nil
	}
	var best *storagev1.StorageClass
	for _, c := range classes {
		if !isDefaultClass(c) {
			continue
		}
		if best == nil || c.CreationTimestamp.After(best.CreationTimestamp.Time) ||
			(c.CreationTimestamp.Equal(&best.CreationTimestamp) && strings.Compare(c.Name, best.Name) < 0) {
			best = c
		}
	}
	return best
}

// ourDefaultClassFor returns the driver's default class when claim has no
// class at all, else nil.
func (b *Binder) ourDefaultClassFor(claim *corev1.PersistentVolumeClaim) *storagev1.StorageClass {
	if storagehelpers.PersistentVolumeClaimHasClass(claim) {
		return nil
	}
	if class := b.defaultClass(); b.ownsClass(class) {
		return class
	}
	return nil
}

// assignDefaultClass sets the claim's class to class; the update event
// syncs the claim again, now as a claim of that class.
func (b *Binder) assignDefaultClass(ctx context.Context, claim *corev1.PersistentVolumeClaim, class *storagev1.StorageClass) error {
	clone := claim.DeepCopy()
	clone.Spec.StorageClassName = &class.Name
	if _, err := b.updateClaim(ctx, clone, "default storage class "+class.Name); err != nil {
		return err
	}
	klog.FromContext(ctx).V(2).Info("Gave a claim without a class the default storage class", "pvc", klog.KObj(claim), "storageClass", class.Name)
	return nil
}
