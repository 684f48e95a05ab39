package provisioner

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// persistentVolume returns the PV that records vol, created for claim in
// class with pl, holding capacityBytes. The library adds the claimRef, the
// pv.kubernetes.io/provisioned-by annotation, the storage class name and
// its finalizer before it saves the PV.
//
// The deletion-secret annotations are always set, to "" when the class
// names no provisioner secret, so that Delete never falls back to a class
// that may have changed; the controller-modify annotations only when that
// secret is configured.
func (p *Provisioner) persistentVolume(claim *corev1.PersistentVolumeClaim, class *storagev1.StorageClass, pl *plan, vol *csi.Volume, capacityBytes int64) *corev1.PersistentVolume {
	attrs := map[string]string{volumeAttributeIdentity: p.cfg.identity}
	maps.Copy(attrs, vol.GetVolumeContext())

	source := &corev1.CSIPersistentVolumeSource{
		Driver:                     p.name,
		VolumeHandle:               vol.GetVolumeId(),
		ReadOnly:                   p.readOnly(pl.req.GetVolumeCapabilities()),
		VolumeAttributes:           attrs,
		ControllerPublishSecretRef: pl.refs.controllerPublish,
		NodeStageSecretRef:         pl.refs.nodeStage,
		NodePublishSecretRef:       pl.refs.nodePublish,
		ControllerExpandSecretRef:  pl.refs.controllerExpand,
		NodeExpandSecretRef:        pl.refs.nodeExpand,
	}
	if !isBlock(claim) {
		source.FSType = pl.fsType
	}

	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{
			Name:        pl.req.GetName(),
			Annotations: map[string]string{annDeletionSecretName: "", annDeletionSecretNS: ""},
		},
		Spec: corev1.PersistentVolumeSpec{
			AccessModes:            slices.Clone(claim.Spec.AccessModes),
			MountOptions:           slices.Clone(class.MountOptions),
			Capacity:               corev1.ResourceList{corev1.ResourceStorage: *resource.NewQuantity(capacityBytes, resource.BinarySI)},
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: source},
		},
	}
	if ref := pl.refs.provisioner; ref != nil {
		pv.Annotations[annDeletionSecretName] = ref.Name
		pv.Annotations[annDeletionSecretNS] = ref.Namespace
	}
	if ref := pl.refs.controllerModify; ref != nil {
		pv.Annotations[annModifySecretName] = ref.Name
		pv.Annotations[annModifySecretNS] = ref.Namespace
	}
	if class.ReclaimPolicy != nil {
		pv.Spec.PersistentVolumeReclaimPolicy = *class.ReclaimPolicy
	}
	if p.caps.VolumeAccessibility {
		pv.Spec.NodeAffinity = nodeAffinity(vol.GetAccessibleTopology())
	}
	if claim.Spec.VolumeMode != nil {
		mode := *claim.Spec.VolumeMode
		pv.Spec.VolumeMode = &mode
	}
	if pl.vacName != "" {
		name := pl.vacName
		pv.Spec.VolumeAttributesClassName = &name
	}
	return pv
}

// readOnly is --controller-publish-readonly: a volume requested with the
// single access mode MULTI_NODE_READER_ONLY is published read-only.
func (p *Provisioner) readOnly(caps []*csi.VolumeCapability) bool {
	return p.cfg.controllerPublishReadOnly && len(caps) == 1 &&
		caps[0].GetAccessMode().GetMode() == csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY
}

// maxRecordBytes bounds the protobuf size of a PV built here (see
// recordable). etcd refuses a request over its default --max-request-bytes,
// 1.5 MiB: measured, a PV of 1,566,836 bytes was saved and one of
// 1,597,556 was not. 16 KiB are left for the library's claimRef,
// annotations and finalizer and the API server's metadata. Managed fields
// need no room: for a volume_context of tens of thousands of keys the API
// server stored the PV without them (measured with 60,000 keys).
const maxRecordBytes = 1536*1024 - 16*1024

// recordable returns why the API server would refuse pv, which records a
// driver's answer, or nil. Two answers of a driver that breaks CSI's rules
// make such a PV:
//   - accessible_topology segments whose key is not a label key or whose
//     value is not a label value (CSI requires both; the API server
//     validates the node affinity made of them);
//   - a volume_context too large for one etcd request (CSI allows 4 KiB).
func recordable(pv *corev1.PersistentVolume) error {
	if na := pv.Spec.NodeAffinity; na != nil && na.Required != nil {
		for _, term := range na.Required.NodeSelectorTerms {
			for _, req := range term.MatchExpressions {
				if msgs := validation.IsQualifiedName(req.Key); len(msgs) > 0 {
					return fmt.Errorf("accessible_topology segment key %q is not a label key: %s", req.Key, strings.Join(msgs, "; "))
				}
				for _, v := range req.Values {
					if msgs := validation.IsValidLabelValue(v); len(msgs) > 0 {
						return fmt.Errorf("accessible_topology segment %s=%q is not a label value: %s", req.Key, v, strings.Join(msgs, "; "))
					}
				}
			}
		}
	}
	if size := pv.Size(); size > maxRecordBytes {
		return fmt.Errorf("its PersistentVolume would take %d bytes, over the %d an API server with etcd's default request limit stores (CSI allows 4 KiB of volume_context)", size, maxRecordBytes)
	}
	return nil
}
