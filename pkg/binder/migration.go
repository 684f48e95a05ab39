package binder

import (
	"context"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	storagehelpers "k8s.io/component-helpers/storage/volume"
)

// annealMigrated does for a volume the migrated in-tree plugin provisioned
// what kube-controller-manager's binder does for it with migration on
// (updateVolumeMigrationAnnotationsAndFinalizers): it names the driver in
// pv.kubernetes.io/migrated-to and removes the in-tree deletion finalizer
// kubernetes.io/pv-controller, which only kube-controller-manager's deleter
// removes. Without it, a volume provisioned before the migration stays
// Terminating forever once the provisioner has deleted it through the
// driver, on a cluster where that binder does not run. One update, only
// when something changes; other volumes are returned as they are.
func (b *Binder) annealMigrated(ctx context.Context, pv *corev1.PersistentVolume) (*corev1.PersistentVolume, error) {
	if b.cfg.inTree == "" || pv.Annotations[storagehelpers.AnnDynamicallyProvisioned] != b.cfg.inTree {
		return pv, nil
	}
	stale := pv.Annotations[storagehelpers.AnnMigratedTo] != b.driver
	finalizer := slices.Contains(pv.Finalizers, storagehelpers.PVDeletionInTreeProtectionFinalizer)
	if !stale && !finalizer {
		return pv, nil
	}
	clone := pv.DeepCopy()
	metav1.SetMetaDataAnnotation(&clone.ObjectMeta, storagehelpers.AnnMigratedTo, b.driver)
	clone.Finalizers = slices.DeleteFunc(clone.Finalizers, func(f string) bool {
		return f == storagehelpers.PVDeletionInTreeProtectionFinalizer
	})
	return b.updateVolume(ctx, clone, "migrated to "+b.driver)
}

// reportUndeletableInTree posts a Warning on a Released in-tree volume of
// the migrated plugin, reclaim policy Delete, that no provisioner deletes:
// a static one (without pv.kubernetes.io/provisioned-by) whose
// pv.kubernetes.io/migrated-to does not name the driver or the plugin,
// which the provisioning library never hands to Delete, as upstream. A
// volume another provisioner made is that provisioner's to delete: the
// advice would have two delete it. kube-controller-manager, whose in-tree plugin is gone, would
// mark it Failed; it stays Released here, so that naming the driver in
// migrated-to, as the event suggests, has the provisioner delete it.
func (b *Binder) reportUndeletableInTree(pv *corev1.PersistentVolume) {
	if !b.undeletableInTree(pv) {
		return
	}
	b.recorder.Event(pv, corev1.EventTypeWarning, reasonVolumeFailedDelete, fmt.Sprintf(msgInTreeNotDeleted,
		b.cfg.inTree, storagehelpers.AnnDynamicallyProvisioned, storagehelpers.AnnMigratedTo, b.driver))
}

// undeletableInTree reports whether pv is an in-tree volume of the migrated
// plugin that no provisioner deletes (see reportUndeletableInTree).
func (b *Binder) undeletableInTree(pv *corev1.PersistentVolume) bool {
	return b.cfg.inTree != "" && pv.Spec.CSI == nil &&
		!metav1.HasAnnotation(pv.ObjectMeta, storagehelpers.AnnDynamicallyProvisioned) &&
		!b.ownsProvisioner(pv.Annotations[storagehelpers.AnnMigratedTo])
}
