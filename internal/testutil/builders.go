package testutil

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// PVCBuilder builds a PersistentVolumeClaim. The zero claim built by
// [NewPVC] is ReadWriteOnce, Filesystem, 1Gi, with no class.
type PVCBuilder struct{ c *corev1.PersistentVolumeClaim }

// NewPVC starts a claim namespace/name.
func NewPVC(namespace, name string) *PVCBuilder {
	fs := corev1.PersistentVolumeFilesystem
	return &PVCBuilder{c: &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, ResourceVersion: "1"},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources: corev1.VolumeResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			},
			VolumeMode: &fs,
		},
		Status: corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimPending},
	}}
}

// UID sets metadata.uid.
func (b *PVCBuilder) UID(uid string) *PVCBuilder { b.c.UID = types.UID(uid); return b }

// RV sets metadata.resourceVersion.
func (b *PVCBuilder) RV(rv string) *PVCBuilder { b.c.ResourceVersion = rv; return b }

// Class sets spec.storageClassName.
func (b *PVCBuilder) Class(class string) *PVCBuilder { b.c.Spec.StorageClassName = &class; return b }

// Size sets the storage request.
func (b *PVCBuilder) Size(q string) *PVCBuilder {
	b.c.Spec.Resources.Requests[corev1.ResourceStorage] = resource.MustParse(q)
	return b
}

// AccessModes replaces spec.accessModes.
func (b *PVCBuilder) AccessModes(modes ...corev1.PersistentVolumeAccessMode) *PVCBuilder {
	b.c.Spec.AccessModes = modes
	return b
}

// Block makes the claim a raw block claim.
func (b *PVCBuilder) Block() *PVCBuilder {
	m := corev1.PersistentVolumeBlock
	b.c.Spec.VolumeMode = &m
	return b
}

// VolumeName sets spec.volumeName (a claim pre-bound to, or bound to, a PV).
func (b *PVCBuilder) VolumeName(pv string) *PVCBuilder { b.c.Spec.VolumeName = pv; return b }

// Annotation sets one annotation.
func (b *PVCBuilder) Annotation(k, v string) *PVCBuilder {
	if b.c.Annotations == nil {
		b.c.Annotations = map[string]string{}
	}
	b.c.Annotations[k] = v
	return b
}

// Label sets one label.
func (b *PVCBuilder) Label(k, v string) *PVCBuilder {
	if b.c.Labels == nil {
		b.c.Labels = map[string]string{}
	}
	b.c.Labels[k] = v
	return b
}

// Finalizers appends finalizers.
func (b *PVCBuilder) Finalizers(f ...string) *PVCBuilder {
	b.c.Finalizers = append(b.c.Finalizers, f...)
	return b
}

// Selector sets spec.selector to match the given labels.
func (b *PVCBuilder) Selector(labels map[string]string) *PVCBuilder {
	b.c.Spec.Selector = &metav1.LabelSelector{MatchLabels: labels}
	return b
}

// DataSource sets spec.dataSource and spec.dataSourceRef.
func (b *PVCBuilder) DataSource(apiGroup *string, kind, name string) *PVCBuilder {
	b.c.Spec.DataSource = &corev1.TypedLocalObjectReference{APIGroup: apiGroup, Kind: kind, Name: name}
	b.c.Spec.DataSourceRef = &corev1.TypedObjectReference{APIGroup: apiGroup, Kind: kind, Name: name}
	return b
}

// Phase sets status.phase.
func (b *PVCBuilder) Phase(p corev1.PersistentVolumeClaimPhase) *PVCBuilder {
	b.c.Status.Phase = p
	return b
}

// Deleted sets a deletionTimestamp.
func (b *PVCBuilder) Deleted() *PVCBuilder {
	now := metav1.Now()
	b.c.DeletionTimestamp = &now
	return b
}

// Obj returns the claim.
func (b *PVCBuilder) Obj() *corev1.PersistentVolumeClaim { return b.c }

// PVBuilder builds a PersistentVolume. The volume built by [NewPV] is a CSI
// volume of the given driver, ReadWriteOnce, Filesystem, 1Gi, reclaim policy
// Delete, phase Available.
type PVBuilder struct{ v *corev1.PersistentVolume }

// NewPV starts a CSI volume named name of driver.
func NewPV(name, driver string) *PVBuilder {
	fs := corev1.PersistentVolumeFilesystem
	return &PVBuilder{v: &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: "1"},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
			VolumeMode:                    &fs,
			PersistentVolumeSource: corev1.PersistentVolumeSource{
				CSI: &corev1.CSIPersistentVolumeSource{Driver: driver, VolumeHandle: "handle-" + name},
			},
		},
		Status: corev1.PersistentVolumeStatus{Phase: corev1.VolumeAvailable},
	}}
}

// UID sets metadata.uid.
func (b *PVBuilder) UID(uid string) *PVBuilder { b.v.UID = types.UID(uid); return b }

// RV sets metadata.resourceVersion.
func (b *PVBuilder) RV(rv string) *PVBuilder { b.v.ResourceVersion = rv; return b }

// Class sets spec.storageClassName.
func (b *PVBuilder) Class(class string) *PVBuilder { b.v.Spec.StorageClassName = class; return b }

// Size sets spec.capacity.
func (b *PVBuilder) Size(q string) *PVBuilder {
	b.v.Spec.Capacity[corev1.ResourceStorage] = resource.MustParse(q)
	return b
}

// AccessModes replaces spec.accessModes.
func (b *PVBuilder) AccessModes(modes ...corev1.PersistentVolumeAccessMode) *PVBuilder {
	b.v.Spec.AccessModes = modes
	return b
}

// Block makes the volume a raw block volume.
func (b *PVBuilder) Block() *PVBuilder {
	m := corev1.PersistentVolumeBlock
	b.v.Spec.VolumeMode = &m
	return b
}

// ReclaimPolicy sets spec.persistentVolumeReclaimPolicy.
func (b *PVBuilder) ReclaimPolicy(p corev1.PersistentVolumeReclaimPolicy) *PVBuilder {
	b.v.Spec.PersistentVolumeReclaimPolicy = p
	return b
}

// ClaimRef points spec.claimRef at namespace/name with uid ("" for a
// reference by name only).
func (b *PVBuilder) ClaimRef(namespace, name, uid string) *PVBuilder {
	b.v.Spec.ClaimRef = &corev1.ObjectReference{
		Kind: "PersistentVolumeClaim", APIVersion: "v1",
		Namespace: namespace, Name: name, UID: types.UID(uid),
	}
	return b
}

// BoundTo points spec.claimRef at claim, with its UID.
func (b *PVBuilder) BoundTo(claim *corev1.PersistentVolumeClaim) *PVBuilder {
	return b.ClaimRef(claim.Namespace, claim.Name, string(claim.UID))
}

// Annotation sets one annotation.
func (b *PVBuilder) Annotation(k, v string) *PVBuilder {
	if b.v.Annotations == nil {
		b.v.Annotations = map[string]string{}
	}
	b.v.Annotations[k] = v
	return b
}

// Label sets one label.
func (b *PVBuilder) Label(k, v string) *PVBuilder {
	if b.v.Labels == nil {
		b.v.Labels = map[string]string{}
	}
	b.v.Labels[k] = v
	return b
}

// Finalizers appends finalizers.
func (b *PVBuilder) Finalizers(f ...string) *PVBuilder {
	b.v.Finalizers = append(b.v.Finalizers, f...)
	return b
}

// NodeAffinity requires label key to be one of values.
func (b *PVBuilder) NodeAffinity(key string, values ...string) *PVBuilder {
	b.v.Spec.NodeAffinity = &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{
		NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{
			Key: key, Operator: corev1.NodeSelectorOpIn, Values: values,
		}}}},
	}}
	return b
}

// Phase sets status.phase.
func (b *PVBuilder) Phase(p corev1.PersistentVolumePhase) *PVBuilder { b.v.Status.Phase = p; return b }

// Deleted sets a deletionTimestamp.
func (b *PVBuilder) Deleted() *PVBuilder {
	now := metav1.Now()
	b.v.DeletionTimestamp = &now
	return b
}

// NotCSI replaces the CSI source with a hostPath source (a volume of no CSI
// driver).
func (b *PVBuilder) NotCSI() *PVBuilder {
	b.v.Spec.PersistentVolumeSource = corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/tmp/" + b.v.Name}}
	return b
}

// Obj returns the volume.
func (b *PVBuilder) Obj() *corev1.PersistentVolume { return b.v }

// SCBuilder builds a StorageClass. The class built by [NewSC] has reclaim
// policy Delete and binding mode Immediate.
type SCBuilder struct{ s *storagev1.StorageClass }

// NewSC starts a class named name whose provisioner is provisioner.
func NewSC(name, provisioner string) *SCBuilder {
	del := corev1.PersistentVolumeReclaimDelete
	imm := storagev1.VolumeBindingImmediate
	return &SCBuilder{s: &storagev1.StorageClass{
		ObjectMeta:        metav1.ObjectMeta{Name: name, ResourceVersion: "1", UID: types.UID("uid-sc-" + name)},
		Provisioner:       provisioner,
		ReclaimPolicy:     &del,
		VolumeBindingMode: &imm,
	}}
}

// Param sets one parameter.
func (b *SCBuilder) Param(k, v string) *SCBuilder {
	if b.s.Parameters == nil {
		b.s.Parameters = map[string]string{}
	}
	b.s.Parameters[k] = v
	return b
}

// ReclaimPolicy sets reclaimPolicy.
func (b *SCBuilder) ReclaimPolicy(p corev1.PersistentVolumeReclaimPolicy) *SCBuilder {
	b.s.ReclaimPolicy = &p
	return b
}

// WaitForFirstConsumer sets volumeBindingMode to WaitForFirstConsumer.
func (b *SCBuilder) WaitForFirstConsumer() *SCBuilder {
	m := storagev1.VolumeBindingWaitForFirstConsumer
	b.s.VolumeBindingMode = &m
	return b
}

// Default marks the class as the default class with the given annotation
// key (storageclass.kubernetes.io/is-default-class or its beta form).
func (b *SCBuilder) Default(key string) *SCBuilder {
	if b.s.Annotations == nil {
		b.s.Annotations = map[string]string{}
	}
	b.s.Annotations[key] = "true"
	return b
}

// Created sets metadata.creationTimestamp.
func (b *SCBuilder) Created(t time.Time) *SCBuilder {
	b.s.CreationTimestamp = metav1.NewTime(t)
	return b
}

// NoBindingMode clears volumeBindingMode (an invalid class for the binder).
func (b *SCBuilder) NoBindingMode() *SCBuilder { b.s.VolumeBindingMode = nil; return b }

// MountOptions sets mountOptions.
func (b *SCBuilder) MountOptions(o ...string) *SCBuilder { b.s.MountOptions = o; return b }

// AllowedTopology restricts the class to nodes where key is one of values.
func (b *SCBuilder) AllowedTopology(key string, values ...string) *SCBuilder {
	b.s.AllowedTopologies = append(b.s.AllowedTopologies, corev1.TopologySelectorTerm{
		MatchLabelExpressions: []corev1.TopologySelectorLabelRequirement{{Key: key, Values: values}},
	})
	return b
}

// Obj returns the class.
func (b *SCBuilder) Obj() *storagev1.StorageClass { return b.s }

// NewNode returns a node with the given labels.
func NewNode(name string, labels map[string]string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels, ResourceVersion: "1"}}
}

// NewCSINode returns a CSINode of node name on which driver reports the given
// topology keys.
func NewCSINode(name, driver string, topologyKeys ...string) *storagev1.CSINode {
	return &storagev1.CSINode{
		ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: "1"},
		Spec: storagev1.CSINodeSpec{Drivers: []storagev1.CSINodeDriver{{
			Name: driver, NodeID: name, TopologyKeys: topologyKeys,
		}}},
	}
}

// NewPod returns a pod in namespace that uses the given claims, scheduled to
// nodeName ("" for an unscheduled pod).
func NewPod(namespace, name, nodeName string, claims ...string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, ResourceVersion: "1"},
		Spec: corev1.PodSpec{
			NodeName:   nodeName,
			Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/pause:1"}},
		},
		Status: corev1.PodStatus{Phase: corev1.PodPending},
	}
	for _, c := range claims {
		p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{
			Name:         c,
			VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: c}},
		})
	}
	return p
}

// Created sets metadata.creationTimestamp.
func (b *PVCBuilder) Created(t time.Time) *PVCBuilder {
	b.c.CreationTimestamp = metav1.NewTime(t)
	return b
}

// VolumeAttributesClass sets spec.volumeAttributesClassName.
func (b *PVCBuilder) VolumeAttributesClass(name string) *PVCBuilder {
	b.c.Spec.VolumeAttributesClassName = &name
	return b
}

// VolumeAttributesClass sets spec.volumeAttributesClassName.
func (b *PVBuilder) VolumeAttributesClass(name string) *PVBuilder {
	b.v.Spec.VolumeAttributesClassName = &name
	return b
}
