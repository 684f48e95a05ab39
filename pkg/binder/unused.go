package binder

import (
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The Unused condition. Since Kubernetes v1.37 (PersistentVolumeClaimUnusedSinceTime,
// beta and on by default) kube-controller-manager's pvc-protection
// controller writes an Unused condition into the status of every Bound
// claim that lacks it: one more write per volume right after the binder's
// own status write. Once the binder has seen another writer add or change
// that condition on any claim (so the cluster maintains it now: a
// condition merely present may be left over from a time the feature was
// on), it sets the condition itself in the write that makes a claim Bound,
// with the value and reason that controller would write; the controller
// then finds nothing to change. In a cluster that does not maintain the
// condition the binder never adds it, so no condition goes stale. A wrong
// guess (a pod the binder does not count) costs only the controller's
// correcting write.

// Reasons and messages of the Unused condition, kube-controller-manager's.
const (
	reasonUnusedNoPods = "NoPodsUsingPVC"
	msgUnusedNoPods    = "No pods are currently referencing this PVC"
	reasonUnusedInUse  = "PodUsingPVC"
	msgUnusedInUse     = "A pod is currently referencing this PVC"
)

// observeUnusedCondition notes that the cluster maintains the Unused
// condition when an update of a claim added or changed it. Until the
// binder writes the condition itself, every such update is another
// writer's.
func (b *Binder) observeUnusedCondition(old, claim *corev1.PersistentVolumeClaim) {
	if b.unusedTracked.Load() {
		return
	}
	if now := unusedCondition(claim.Status.Conditions); now != nil {
		if was := unusedCondition(old.Status.Conditions); was == nil || was.Status != now.Status {
			b.unusedTracked.Store(true)
		}
	}
}

func unusedCondition(conds []corev1.PersistentVolumeClaimCondition) *corev1.PersistentVolumeClaimCondition {
	for i := range conds {
		if conds[i].Type == corev1.PersistentVolumeClaimUnused {
			return &conds[i]
		}
	}
	return nil
}

func hasUnusedCondition(conds []corev1.PersistentVolumeClaimCondition) bool {
	return unusedCondition(conds) != nil
}

// addUnusedCondition adds the Unused condition to st, the status that makes
// claim Bound, when the cluster maintains it and st lacks it.
func (b *Binder) addUnusedCondition(claim *corev1.PersistentVolumeClaim, st *corev1.PersistentVolumeClaimStatus) {
	if !b.unusedTracked.Load() || hasUnusedCondition(st.Conditions) {
		return
	}
	cond := corev1.PersistentVolumeClaimCondition{
		Type: corev1.PersistentVolumeClaimUnused, Status: corev1.ConditionTrue,
		Reason: reasonUnusedNoPods, Message: msgUnusedNoPods,
		LastTransitionTime: metav1.NewTime(b.cfg.clock.Now()),
	}
	if b.claimInUse(claim) {
		cond.Status, cond.Reason, cond.Message = corev1.ConditionFalse, reasonUnusedInUse, msgUnusedInUse
	}
	st.Conditions = append(st.Conditions, cond)
}

// claimInUse reports whether a pod that has not finished references claim,
// as kube-controller-manager counts it for the Unused condition.
func (b *Binder) claimInUse(claim *corev1.PersistentVolumeClaim) bool {
	objs, err := b.podIndexer.ByIndex(indexPodByClaim, claimKey(claim))
	if err != nil {
		return false
	}
	return slices.ContainsFunc(objs, func(o interface{}) bool {
		pod, ok := o.(*corev1.Pod)
		return ok && pod.Status.Phase != corev1.PodSucceeded && pod.Status.Phase != corev1.PodFailed
	})
}
