package provisioner

import (
	"context"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	storagehelpers "k8s.io/component-helpers/storage/volume"
	"k8s.io/klog/v2"

	"github.com/kube-storage/csi-provisioner/pkg/inflight"
)

func (c libraryCoreV1) PersistentVolumeClaims(namespace string) typedcorev1.PersistentVolumeClaimInterface {
	return libraryClaims{PersistentVolumeClaimInterface: c.CoreV1Interface.PersistentVolumeClaims(namespace), libraryHooks: c.libraryHooks}
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
	*libraryHooks
}

func (c libraryClaims) Update(ctx context.Context, claim *corev1.PersistentVolumeClaim, opts metav1.UpdateOptions) (*corev1.PersistentVolumeClaim, error) {
	var seen string // the selected node the library's copy had
	noted := false
	if !metav1.HasAnnotation(claim.ObjectMeta, storagehelpers.AnnSelectedNode) {
		seen, noted = c.reschedules.take(claim.UID)
	}
	updated, err := c.PersistentVolumeClaimInterface.Update(ctx, c.releaseIdle(claim), opts)
	if !apierrors.IsConflict(err) || !noted {
		return updated, err
	}
	retry, ok := c.rebase(ctx, claim, seen)
	if !ok {
		return nil, err
	}
	return c.PersistentVolumeClaimInterface.Update(ctx, c.releaseIdle(retry), opts)
}

// releaseIdle returns claim, or a copy without the in-flight finalizer when
// the claim goes back to the scheduler with nothing in flight.
func (c libraryClaims) releaseIdle(claim *corev1.PersistentVolumeClaim) *corev1.PersistentVolumeClaim {
	if inflight.Has(claim) && claim.Spec.VolumeName == "" &&
		!metav1.HasAnnotation(claim.ObjectMeta, storagehelpers.AnnSelectedNode) && c.attempts.state(claim.UID).idle() {
		claim = claim.DeepCopy()
		inflight.Remove(claim)
	}
	return claim
}

// rebase applies the library's reschedule (selected-node removed) to the
// live claim when the live claim differs from the library's copy only in
// that annotation and the in-flight finalizer, and its selected node is
// still seen, the one the library's copy had when Provision answered
// ProvisioningReschedule: a node selected since (by hand, or by the
// scheduler after another reschedule) is not the one the driver refused.
// The library writes from the copy it started provisioning with, and when the binder is off
// (--enable-binder=false, --node-deployment) the provisioner adds the
// finalizer in Provision, after that copy was taken: the write always
// conflicted, and the library, having kept the claim, called CreateVolume
// again on the node that had just answered RESOURCE_EXHAUSTED (another
// Warning, another failure counted). Any other change since the copy makes
// rebase refuse, and the conflict goes back to the library, which retries.
func (c libraryClaims) rebase(ctx context.Context, claim *corev1.PersistentVolumeClaim, seen string) (*corev1.PersistentVolumeClaim, bool) {
	live, err := c.Get(ctx, claim.Name, metav1.GetOptions{})
	if err != nil || live.UID != claim.UID {
		return nil, false
	}
	if node, ok := live.Annotations[storagehelpers.AnnSelectedNode]; !ok || node != seen {
		return nil, false
	}
	retry := live.DeepCopy()
	delete(retry.Annotations, storagehelpers.AnnSelectedNode)
	if !equalButInflight(claim, retry) {
		return nil, false
	}
	klog.FromContext(ctx).V(4).Info("Rescheduling the live claim: the library's copy lacks only the in-flight finalizer", "pvc", klog.KObj(claim))
	return retry, true
}

// rescheduleNotes holds, per claim UID, the selected node of the library's
// copy of a claim for which Provision answered ProvisioningReschedule,
// until the library's reschedule Update takes it (see libraryClaims.rebase),
// or the claim is deleted. The library makes that Update right after
// Provision returns, whenever its copy has selected-node, which is when a
// note is made. Safe for concurrent use; a nil *rescheduleNotes holds
// nothing.
type rescheduleNotes struct {
	mu    sync.Mutex
	nodes map[types.UID]string
}

func newRescheduleNotes() *rescheduleNotes {
	return &rescheduleNotes{nodes: map[types.UID]string{}}
}

// note records the selected node of claim, the library's copy, if it has
// one.
func (n *rescheduleNotes) note(claim *corev1.PersistentVolumeClaim) {
	node, ok := claim.Annotations[storagehelpers.AnnSelectedNode]
	if n == nil || !ok {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.nodes[claim.UID] = node
}

// take returns and drops the note of the claim.
func (n *rescheduleNotes) take(uid types.UID) (string, bool) {
	if n == nil {
		return "", false
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	node, ok := n.nodes[uid]
	delete(n.nodes, uid)
	return node, ok
}
