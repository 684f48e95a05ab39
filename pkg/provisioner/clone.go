package provisioner

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/kube-storage/csi-provisioner/pkg/inflight"
)

// Cloning. A claim whose data source is another claim of its namespace is
// provisioned with CreateVolume's content source naming the volume of that
// claim, under upstream's rules and with its messages: the driver reports
// CLONE_VOLUME; the source claim is Bound, not being deleted and has a
// class; the clone has a class and asks for at least the source's request;
// the source's PV (read from the API server) is a CSI volume of the class's
// driver, bound to the source claim and Bound, with the clone's volume mode.
// Classes may differ.
//
// Before the first CreateVolume the source claim gets CloneFinalizer, so it
// cannot go while the driver copies it; RunCloneProtection removes the
// finalizer from a source being deleted once no clone of it is pending.
// Beyond upstream, a clone whose CreateVolume has started (it carries the
// in-flight finalizer) may go on after its source started being deleted
// (the source keeps CloneFinalizer until then): refusing it would leave
// both claims waiting for each other.

// CloneFinalizer is upstream's finalizer on the source claim of a clone.
const CloneFinalizer = "provisioner.storage.kubernetes.io/cloning-protection"

// errSourceInvalid is upstream's answer for every defect of the source PV.
var errSourceInvalid = errors.New("claim in dataSource not bound or invalid")

// cloneSourceOf returns the key (namespace/name) of the claim that claim
// clones, "" when its data source is not a claim.
func (p *Provisioner) cloneSourceOf(claim *corev1.PersistentVolumeClaim) string {
	return p.sourceKey(claim, kindClaim)
}

// cloneContentSource checks the clone and its source claim (namespace,
// source) and returns the content source naming the source's volume.
func (p *Provisioner) cloneContentSource(ctx context.Context, claim *corev1.PersistentVolumeClaim, class *storagev1.StorageClass, namespace, source string) (*csi.VolumeContentSource, error) {
	logger := klog.FromContext(ctx)
	src, err := p.claims.PersistentVolumeClaims(namespace).Get(source)
	if err != nil {
		return nil, fmt.Errorf("error getting PVC %s (namespace %q) from api server: %w", source, claim.Namespace, err)
	}
	if src.Status.Phase != corev1.ClaimBound {
		return nil, fmt.Errorf("the PVC DataSource %s must have a status of Bound.  Got %s", source, src.Status.Phase)
	}
	started := slices.Contains(src.Finalizers, CloneFinalizer) && inflight.Has(claim)
	if src.DeletionTimestamp != nil && !started {
		return nil, fmt.Errorf("the PVC DataSource %s is currently being deleted", source)
	}
	if src.Spec.StorageClassName == nil {
		return nil, fmt.Errorf("the source PVC (%s) storageclass cannot be empty", src.Name)
	}
	if claim.Spec.StorageClassName == nil {
		return nil, fmt.Errorf("the requested PVC (%s) storageclass cannot be empty", claim.Name)
	}
	want, have := claim.Spec.Resources.Requests[corev1.ResourceStorage], src.Spec.Resources.Requests[corev1.ResourceStorage]
	if want.Value() < have.Value() {
		return nil, fmt.Errorf("error, new PVC request must be greater than or equal in size to the specified PVC data source, requested %v but source is %v", want.Value(), have.Value())
	}
	if src.Spec.VolumeName == "" {
		return nil, fmt.Errorf("volume name is empty in source PVC %s", src.Name)
	}
	pv, err := p.client.CoreV1().PersistentVolumes().Get(ctx, src.Spec.VolumeName, metav1.GetOptions{})
	var volume *corev1.CSIPersistentVolumeSource
	if err == nil {
		volume = pv.Spec.CSI
		if volume == nil { // an in-tree volume of the migrated plugin
			volume, _ = p.csiVolume(logger, pv)
		}
	}
	var why string
	switch {
	case err != nil:
		why = err.Error()
	case volume == nil:
		why = "not a CSI volume"
	case volume.Driver != class.Provisioner:
		why = fmt.Sprintf("handled by driver %s, not by %s of class %s", volume.Driver, class.Provisioner, class.Name)
	case pv.Spec.ClaimRef == nil:
		why = "not bound"
	case pv.Spec.ClaimRef.UID != src.UID || pv.Spec.ClaimRef.Namespace != src.Namespace || pv.Spec.ClaimRef.Name != src.Name:
		why = "bound to another claim"
	case pv.Status.Phase != corev1.VolumeBound:
		why = fmt.Sprintf("in phase %s, not Bound", pv.Status.Phase)
	}
	if why != "" {
		logger.Info("Source volume of a clone cannot be used", "pvc", klog.KObj(claim), "sourcePVC", klog.KObj(src), "pv", src.Spec.VolumeName, "reason", why)
		return nil, errSourceInvalid
	}
	block := claim.Spec.VolumeMode != nil && *claim.Spec.VolumeMode == corev1.PersistentVolumeBlock
	srcBlock := pv.Spec.VolumeMode != nil && *pv.Spec.VolumeMode == corev1.PersistentVolumeBlock
	switch {
	case srcBlock && !block:
		return nil, errors.New("the source PVC and destination PVCs must have the same volume mode for cloning.  Source is Block, but new PVC requested Filesystem")
	case block && !srcBlock:
		return nil, errors.New("the source PVC and destination PVCs must have the same volume mode for cloning.  Source is Filesystem, but new PVC requested Block")
	}
	return &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{
		Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: volume.VolumeHandle},
	}}, nil
}

// protectCloneSource adds CloneFinalizer to the source claim (namespace,
// name) unless it has it; after a conflict it tries once more on the API
// server's copy.
func (p *Provisioner) protectCloneSource(ctx context.Context, namespace, name string) error {
	src, err := p.claims.PersistentVolumeClaims(namespace).Get(name)
	if err == nil {
		err = p.addCloneFinalizer(ctx, src)
	}
	if apierrors.IsConflict(err) {
		if src, err = p.client.CoreV1().PersistentVolumeClaims(namespace).Get(ctx, name, metav1.GetOptions{}); err == nil {
			err = p.addCloneFinalizer(ctx, src)
		}
	}
	if err != nil {
		return fmt.Errorf("add finalizer %s to the clone source %s/%s: %w", CloneFinalizer, namespace, name, err)
	}
	return nil
}

func (p *Provisioner) addCloneFinalizer(ctx context.Context, src *corev1.PersistentVolumeClaim) error {
	if slices.Contains(src.Finalizers, CloneFinalizer) {
		return nil
	}
	clone := src.DeepCopy()
	clone.Finalizers = append(clone.Finalizers, CloneFinalizer)
	if _, err := p.client.CoreV1().PersistentVolumeClaims(src.Namespace).Update(ctx, clone, metav1.UpdateOptions{FieldManager: FieldManager}); err != nil {
		return err
	}
	klog.FromContext(ctx).V(2).Info("Protected the source of a clone", "sourcePVC", klog.KObj(src))
	return nil
}
