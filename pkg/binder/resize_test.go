package binder

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// resizing returns claim in the middle of an expansion and an attributes
// class change: request 2Gi, status capacity 1Gi, the resizer's allocated
// resources, statuses and condition, and a modification in progress.
func resizing(c *corev1.PersistentVolumeClaim) *corev1.PersistentVolumeClaim {
	c = c.DeepCopy()
	c.Spec.Resources.Requests[corev1.ResourceStorage] = resource.MustParse("2Gi")
	c.Spec.VolumeAttributesClassName = ptr.To("gold")
	c.Status.Capacity = corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}
	c.Status.AllocatedResources = corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("2Gi")}
	st := corev1.PersistentVolumeClaimNodeResizePending
	c.Status.AllocatedResourceStatuses = map[corev1.ResourceName]corev1.ClaimResourceStatus{corev1.ResourceStorage: st}
	c.Status.Conditions = []corev1.PersistentVolumeClaimCondition{{Type: corev1.PersistentVolumeClaimFileSystemResizePending, Status: corev1.ConditionTrue, LastTransitionTime: metav1.NewTime(now)}}
	c.Status.CurrentVolumeAttributesClassName = ptr.To("silver")
	c.Status.ModifyVolumeStatus = &corev1.ModifyVolumeStatus{TargetVolumeAttributesClassName: "gold", Status: corev1.PersistentVolumeClaimModifyVolumeInProgress}
	return c
}

// TestResizingClaimLeftToTheResizer: the fields the external-resizer and
// the kubelet own during an expansion or an attributes class change
// (status capacity of a bound claim, allocated resources and their
// statuses, resize conditions, modifyVolumeStatus) are never written by
// the binder, which sets a claim's capacity only when it becomes Bound (from
// the pre-resize annotation when present), as kube-controller-manager does.
// A raised request over a bound volume neither unbinds nor loses the claim.
func TestResizingClaimLeftToTheResizer(t *testing.T) {
	c1 := resizing(claimB("c1").Class("fast").VolumeName("pv1").Annotation(annBindCompleted, "yes").
		Annotation(annBoundByCtrl, "yes").Phase(corev1.ClaimBound).Obj())
	c1.Status.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}
	pvBound := volumeB("pv1").Class("fast").Size("2Gi").Annotation(annPreResizeCapacity, "1Gi").VolumeAttributesClass("silver").BoundTo(c1).Annotation(annBoundByCtrl, "yes").Phase(corev1.VolumeBound).Obj()
	pvNoUID := volumeB("pv1").Class("fast").Size("2Gi").VolumeAttributesClass("silver").ClaimRef(ns, "c1", "").Annotation(annBoundByCtrl, "yes").Phase(corev1.VolumeAvailable).Obj()
	pvUnbound := volumeB("pv1").Class("fast").Size("1Gi").VolumeAttributesClass("silver").Phase(corev1.VolumeBound).Obj()
	c1Lost := c1.DeepCopy()
	c1Lost.Status.Phase, c1Lost.Status.Capacity, c1Lost.Status.AccessModes = corev1.ClaimLost, nil, nil
	pvLostBack := pvBound.DeepCopy()
	c1LostRebound := c1Lost.DeepCopy()
	c1LostRebound.Status.Phase = corev1.ClaimBound
	c1LostRebound.Status.AccessModes = pvBound.Spec.AccessModes
	c1LostRebound.Status.Capacity = corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}
	cases := []syncCase{
		{name: "a settled claim while it resizes: nothing written", objects: objs(classFast(), c1, pvBound), sync: "pvc/c1"},
		{name: "its volume: nothing written", objects: objs(classFast(), c1, pvBound), sync: "pv/pv1"},
		{name: "the volume's claimRef UID removed: the volume only is written", objects: objs(classFast(), c1, pvNoUID), sync: "pvc/c1",
			volumes: []*corev1.PersistentVolume{boundVolume(pvNoUID, c1, true)}, actions: []string{"update pv/pv1", "status pv/pv1"}},
		{name: "the volume's claimRef removed, smaller than the raised request: re-bound, the claim untouched", objects: objs(classFast(), c1, pvUnbound), sync: "pvc/c1",
			volumes: []*corev1.PersistentVolume{boundVolume(pvUnbound, c1, true)}, actions: []string{"update pv/pv1"}},
		{name: "Lost claim re-bound: capacity from pre-resize annotation, resizer fields kept", objects: objs(classFast(), c1Lost, pvLostBack), sync: "pvc/c1",
			claims: []*corev1.PersistentVolumeClaim{c1LostRebound}, actions: []string{"status pvc/c1"}},
	}
	runSyncCases(t, cases)
}
