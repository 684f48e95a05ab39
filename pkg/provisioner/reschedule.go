package provisioner

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	storagehelpers "k8s.io/component-helpers/storage/volume"

	"github.com/kube-storage/csi-provisioner/pkg/inflight"
)

func (c libraryCoreV1) PersistentVolumeClaims(namespace string) typedcorev1.PersistentVolumeClaimInterface {
	return libraryClaims{PersistentVolumeClaimInterface: c.CoreV1Interface.PersistentVolumeClaims(namespace), attempts: c.attempts}
}

// libraryClaims is the provisioning library's claim client. The library
// writes a claim only to reschedule it: an Update that removes
// selected-node after the driver could not create the volume on that node
// (RESOURCE_EXHAUSTED) or the node is gone. When this process knows that
// no CreateVolume for the claim is in flight (a final answer, or none sent
// since the claim was seen without the finalizer), the same Update also
// removes the in-flight finalizer: the claim goes back to the scheduler,
// and the next Provision adds the finalizer again before its CreateVolume.
//
// Why: if the claim were deleted after a restart (or a change of leader),
// the new process would know nothing of that final answer and keep the
// finalizer, and without a selected node no CreateVolume can be sent to
// find out: the claim would stay Terminating.
type libraryClaims struct {
	typedcorev1.PersistentVolumeClaimInterface
	attempts *ledger
}

func (c libraryClaims) Update(ctx context.Context, claim *corev1.PersistentVolumeClaim, opts metav1.UpdateOptions) (*corev1.PersistentVolumeClaim, error) {
	if inflight.Has(claim) && claim.Spec.VolumeName == "" &&
		!metav1.HasAnnotation(claim.ObjectMeta, storagehelpers.AnnSelectedNode) && c.attempts.state(claim.UID).idle() {
		claim = claim.DeepCopy()
		inflight.Remove(claim)
	}
	return c.PersistentVolumeClaimInterface.Update(ctx, claim, opts)
}
