package inflight

import (
	"slices"

	corev1 "k8s.io/api/core/v1"
)

// Finalizer marks a claim for which a CreateVolume may be in flight or may
// have succeeded without a PersistentVolume yet.
//
// Contract:
//   - It is added before the first CreateVolume for the claim is sent, either
//     by the binder in the same write that hands the claim to this driver, or
//     by the provisioner right before the call.
//   - It is removed once a PersistentVolume whose claimRef carries the claim's
//     UID exists (the binder removes it in the write that binds the claim; the
//     provisioner's own guard does so when the binder is off), or once the
//     driver has answered with a final error for a claim that is being
//     deleted, so no volume can exist.
//   - The API server refuses new finalizers on an object being deleted, so a
//     claim that is already being deleted can never start a new CreateVolume.
const Finalizer = "csi-provisioner.kube-storage.io/provisioning"

// AnnVolumeName records on a claim the name of the volume its CreateVolume
// calls use. It is written with the finalizer ([Add]), in the same update, so
// that a later process (a restart, a new leader) repeats the very call whose
// answer may have been lost, even when it runs with another
// --volume-name-prefix or --volume-name-uuid-length: a call under a new name
// would create a second volume and leave the first one, which no PV records,
// in the driver.
const AnnVolumeName = "csi-provisioner.kube-storage.io/volume-name"

// Has reports whether the claim carries the finalizer.
func Has(claim *corev1.PersistentVolumeClaim) bool {
	return slices.Contains(claim.Finalizers, Finalizer)
}

// Add adds the finalizer to claim, which must be a copy the caller owns,
// and records volumeName in [AnnVolumeName] unless volumeName is empty. It
// reports whether the claim changed.
func Add(claim *corev1.PersistentVolumeClaim, volumeName string) bool {
	changed := false
	if volumeName != "" && claim.Annotations[AnnVolumeName] != volumeName {
		if claim.Annotations == nil {
			claim.Annotations = map[string]string{}
		}
		claim.Annotations[AnnVolumeName] = volumeName
		changed = true
	}
	if !Has(claim) {
		claim.Finalizers = append(claim.Finalizers, Finalizer)
		changed = true
	}
	return changed
}

// Remove removes the finalizer from claim, which must be a copy the caller
// owns, and with it [AnnVolumeName]: once no call can be in flight the name
// has served, and a bound claim without it shares its annotations with
// other claims in the sidecar's cache. It reports whether the claim
// changed.
func Remove(claim *corev1.PersistentVolumeClaim) bool {
	i := slices.Index(claim.Finalizers, Finalizer)
	if i < 0 {
		return false
	}
	claim.Finalizers = slices.Delete(slices.Clone(claim.Finalizers), i, i+1)
	if len(claim.Finalizers) == 0 {
		claim.Finalizers = nil
	}
	if _, ok := claim.Annotations[AnnVolumeName]; ok {
		delete(claim.Annotations, AnnVolumeName)
		if len(claim.Annotations) == 0 {
			claim.Annotations = nil
		}
	}
	return true
}
