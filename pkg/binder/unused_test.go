package binder

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-storage/csi-provisioner/internal/testutil"
)

// TestUnusedCondition: once any claim shows that the cluster maintains the
// Unused condition, the write that makes a claim Bound carries it (True
// without a running pod, False with one), so kube-controller-manager has
// nothing to write; before that it is never added.
func TestUnusedCondition(t *testing.T) {
	c1 := claimB("c1").Class("fast").Obj()
	pv1 := volumeB("pv1").Class("fast").Obj()
	boundC1, boundPV1 := boundPair(c1, pv1)
	// A claim of another namespace, Bound, with the condition written by
	// kube-controller-manager.
	marker := testutil.NewPVC("elsewhere", "m").Class("other").Phase(corev1.ClaimBound).Obj()
	marker.Status.Conditions = []corev1.PersistentVolumeClaimCondition{{Type: corev1.PersistentVolumeClaimUnused, Status: corev1.ConditionTrue}}
	withCondition := func(c *corev1.PersistentVolumeClaim, status corev1.ConditionStatus, reason, msg string) *corev1.PersistentVolumeClaim {
		c = c.DeepCopy()
		c.Status.Conditions = append(c.Status.Conditions, corev1.PersistentVolumeClaimCondition{
			Type: corev1.PersistentVolumeClaimUnused, Status: status, Reason: reason, Message: msg, LastTransitionTime: metav1.NewTime(now),
		})
		return c
	}
	// The informers are loaded directly; the marker's update (the
	// controller adding the condition) goes through the claim handler as an
	// informer event would.
	markerBefore := marker.DeepCopy()
	markerBefore.Status.Conditions = nil
	seen := func(f *fixture) { f.binder.onClaimUpdate(markerBefore, marker) }
	// A condition that is only present (left from a time the feature was
	// on) or an update that leaves it alone proves nothing.
	present := func(f *fixture) {
		f.binder.onClaimAdd(marker)
		f.binder.onClaimUpdate(marker, marker)
	}
	running := testutil.NewPod(ns, "app", "node-1", "c1")
	running.Status.Phase = corev1.PodRunning
	done := testutil.NewPod(ns, "job", "node-1", "c1")
	done.Status.Phase = corev1.PodSucceeded
	runSyncCases(t, []syncCase{
		{
			name: "tracked, no pod: Unused=True", objects: objs(classFast(), c1, pv1, marker), sync: "pvc/c1", setup: seen, queued: []string{"pvc/elsewhere/m"},
			claims:  []*corev1.PersistentVolumeClaim{withCondition(boundC1, corev1.ConditionTrue, reasonUnusedNoPods, msgUnusedNoPods)},
			volumes: []*corev1.PersistentVolume{boundPV1}, actions: bindActions,
		},
		{
			name: "tracked, a finished pod only: Unused=True", objects: objs(classFast(), c1, pv1, marker, done), sync: "pvc/c1", setup: seen, queued: []string{"pvc/elsewhere/m"},
			claims:  []*corev1.PersistentVolumeClaim{withCondition(boundC1, corev1.ConditionTrue, reasonUnusedNoPods, msgUnusedNoPods)},
			volumes: []*corev1.PersistentVolume{boundPV1}, actions: bindActions,
		},
		{
			name: "tracked, a running pod: Unused=False", objects: objs(classFast(), c1, pv1, marker, running), sync: "pvc/c1", setup: seen, queued: []string{"pvc/elsewhere/m"},
			claims:  []*corev1.PersistentVolumeClaim{withCondition(boundC1, corev1.ConditionFalse, reasonUnusedInUse, msgUnusedInUse)},
			volumes: []*corev1.PersistentVolume{boundPV1}, actions: bindActions,
		},
		{
			name: "not tracked: no condition", objects: objs(classFast(), c1, pv1, running), sync: "pvc/c1",
			claims: []*corev1.PersistentVolumeClaim{boundC1}, volumes: []*corev1.PersistentVolume{boundPV1}, actions: bindActions,
		},
		{
			name: "a condition only present: not tracked", objects: objs(classFast(), c1, pv1, marker), sync: "pvc/c1", setup: present,
			queued: []string{"pvc/elsewhere/m"},
			claims: []*corev1.PersistentVolumeClaim{boundC1}, volumes: []*corev1.PersistentVolume{boundPV1}, actions: bindActions,
		},
	})
}
