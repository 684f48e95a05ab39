package binder

// Event reasons and messages. Reasons and messages that upstream's
// persistentvolume-binder also posts are spelled exactly as upstream, so that
// tooling and documentation written for it keep working.
const (
	reasonFailedBinding              = "FailedBinding"
	reasonVolumeMismatch             = "VolumeMismatch"
	reasonWaitForFirstConsumer       = "WaitForFirstConsumer"
	reasonWaitForPodScheduled        = "WaitForPodScheduled"
	reasonExternalProvisioning       = "ExternalProvisioning"
	reasonProvisioningFailed         = "ProvisioningFailed"
	reasonClaimLost                  = "ClaimLost"
	reasonClaimMisbound              = "ClaimMisbound"
	reasonVolumeFailedRecycle        = "VolumeFailedRecycle"
	reasonVolumeUnknownReclaimPolicy = "VolumeUnknownReclaimPolicy"
	reasonVolumeFailedDelete         = "VolumeFailedDelete"
	// Ours: upstream has no such guard.
	reasonVolumeStillInUse = "VolumeStillInUse"
	// Ours: with kube-controller-manager's binder alone nobody waits for
	// it, that binder binds the volume itself.
	reasonExternalBinding = "ExternalBinding"

	msgNoVolumeNoClass       = "no persistent volumes available for this claim and no storage class is set"
	msgAlreadyBound          = "volume %q already bound to a different claim."
	msgCannotBindRequested   = "Cannot bind to requested volume %q: %s"
	msgVolumeModeMismatchPV  = "Cannot bind PersistentVolume to requested PersistentVolumeClaim %q due to incompatible volumeMode."
	msgVolumeModeMismatchPVC = "Cannot bind PersistentVolume %q to requested PersistentVolumeClaim due to incompatible volumeMode."
	msgWaitForFirstConsumer  = "waiting for first consumer to be created before binding"
	msgWaitForPod            = "waiting for pod %s to be scheduled"
	msgWaitForPods           = "waiting for pods %s to be scheduled"
	msgExternalProvisioning  = "Waiting for a volume to be created either by the external provisioner '%s' or manually by the system administrator. If volume creation is delayed, please verify that the provisioner is running and correctly registered."
	msgClassNotFound         = "storageclass.storage.k8s.io %q not found"
	msgClaimLostReference    = "Bound claim has lost reference to PersistentVolume. Data on the volume is lost!"
	msgClaimLostVolume       = "Bound claim has lost its PersistentVolume. Data on the volume is lost!"
	msgClaimMisbound         = "Two claims are bound to the same volume, this one is bound incorrectly"
	msgRecycleUnsupported    = "Recycle failed: recycling is not supported for CSI volumes; delete the volume or change its reclaim policy to Delete or Retain"
	msgUnknownReclaimPolicy  = "Volume has unrecognized PersistentVolumeReclaimPolicy"
	msgVolumeStillInUse      = "Not releasing or unbinding the volume: its claimRef names claim %s, but claim %s, which was bound to it before the claimRef changed, still uses it (spec.volumeName); point spec.claimRef back at that claim, or delete that claim once its data is no longer needed"

	// Ours: kube-controller-manager hands such a claim to the provisioner
	// again (ExternalProvisioning), which provisions nothing while the
	// volume exists.
	msgProvisionedMismatch = "Cannot bind to volume %q, provisioned for this claim: %s"

	// Ours (reasonExternalBinding).
	msgExternalBinding = "volume %q, of another driver or plugin than %s, fits the claim: kube-controller-manager's persistentvolume-binder binds it, and nothing is provisioned while it fits (as upstream); with that binder off the claim waits"

	// Ours: upstream posts no event for a claim whose spec.volumeName names
	// no volume (with msgCannotBindRequested).
	msgRequestedVolumeMissing = "the volume does not exist"

	// Ours: kube-controller-manager marks such a volume Failed
	// (VolumeFailedDelete) with "error getting deleter volume plugin for volume ...".
	msgInTreeNotDeleted = "Not deleting the volume: it is a static volume of the in-tree plugin %[1]s, which CSI migration replaced, and the provisioner deletes an in-tree volume only when its annotation %[2]s or %[3]s names %[1]s or %[4]s; annotate it %[3]s=%[4]s to have it deleted through %[4]s, or delete the volume and this PersistentVolume by hand"
)

// Annotations the binder reads or writes that component-helpers does not
// name.
const (
	// annPreResizeCapacity on a volume holds the claim capacity to report
	// while a resize is pending (written by external-resizer).
	annPreResizeCapacity = "volume.alpha.kubernetes.io/pre-resize-capacity"
	// annBoundByControllerValue is the value written for bound-by-controller
	// and bind-completed; only their presence matters.
	annBoundByControllerValue = "yes"
)
