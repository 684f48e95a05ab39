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

// Has reports whether the claim carries the finalizer.
func Has(claim *corev1.PersistentVolumeClaim) bool {
	return slices.Contains(claim.Finalizers, Finalizer)
}

// Add adds the finalizer to claim, which must be a copy the caller owns. It
// reports whether the claim changed.
func Add(claim *corev1.PersistentVolumeClaim) bool {
	if Has(claim) {
		return false
	}
	claim.Finalizers = append(claim.Finalizers, Finalizer)
	return true
}

// Remove removes the finalizer from claim, which must be a copy the caller
// owns. It reports whether the claim changed.
func Remove(claim *corev1.PersistentVolumeClaim) bool {
	i := slices.Index(claim.Finalizers, Finalizer)
	if i < 0 {
		return false
	}
	claim.Finalizers = slices.Delete(slices.Clone(claim.Finalizers), i, i+1)
	if len(claim.Finalizers) == 0 {
		claim.Finalizers = nil
	}
	return true
}
