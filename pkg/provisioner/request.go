package provisioner

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/kubernetes-csi/csi-lib-utils/accessmodes"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"sigs.k8s.io/sig-storage-lib-external-provisioner/v13/controller"

	"github.com/kube-storage/csi-provisioner/pkg/inflight"
	"github.com/kube-storage/csi-provisioner/pkg/refgrant"
)

// Parameter keys and data source kinds.
const (
	prefixedFSTypeKey   = reservedPrefix + "fstype"
	deprecatedFSTypeKey = "fstype" // matched case-insensitively
	pvcNameKey          = reservedPrefix + "pvc/name"
	pvcNamespaceKey     = reservedPrefix + "pvc/namespace"
	pvNameKey           = reservedPrefix + "pv/name"

	kindVolumeSnapshot = "VolumeSnapshot"
	kindClaim          = "PersistentVolumeClaim"
	snapshotAPIGroup   = "snapshot.storage.k8s.io"
)

// plan is a CreateVolume request and what the PV is made of besides the
// driver's answer.
type plan struct {
	req    *csi.CreateVolumeRequest
	fsType string
	refs   secretRefs
	// vacName is the VolumeAttributesClass passed on, "" for none.
	vacName string
	// topologyCached is true when the requirements came from the cache.
	topologyCached bool
	// cloneOf names the source claim of a clone, "" for none.
	cloneOf string
	// snapshot names the VolumeSnapshot restored from, "" for none.
	snapshot string
	// sourceNamespace is the namespace of cloneOf or snapshot: the claim's,
	// or another one under the CrossNamespaceVolumeDataSource feature.
	sourceNamespace string
	// class is the class the request was built from: the claim's, or its
	// translation to CSI when migrated (a class of the migrated in-tree
	// plugin, see WithInTreeMigration).
	class    *storagev1.StorageClass
	migrated bool
}

// prepare validates claim and class and builds the CreateVolume request for
// them, with selected the scheduler's node ("" for none). It never writes.
// With check set (CheckProvision), it also records no event.
//
// Its state on error is upstream's: ProvisioningFinished for a request that
// cannot be valid (claim selector, a size above the largest int64 bytes,
// unknown reserved parameter, two fsType keys, unsupported access modes,
// data sources or capabilities, a VolumeAttributesClass of another
// driver); ProvisioningNoChange for what may resolve by itself or by a
// change elsewhere (secret references and secrets, the
// VolumeAttributesClass lookup, topology lookups);
// ProvisioningReschedule when the selected Node or its CSINode does not
// exist. A data source of another kind gives an *controller.IgnoredError
// (an external populator provisions the claim). A class of the migrated
// in-tree plugin is translated first (plan.class).
func (p *Provisioner) prepare(ctx context.Context, claim *corev1.PersistentVolumeClaim, class *storagev1.StorageClass, selected string, check bool) (*plan, controller.ProvisioningState, error) {
	logger := klog.FromContext(ctx).WithValues("pvc", klog.KObj(claim))
	if class == nil {
		return nil, controller.ProvisioningFinished, errors.New("storage class was nil")
	}
	class, migrated, err := p.csiClass(logger, class)
	if err != nil {
		return nil, controller.ProvisioningFinished, err
	}
	source, err := p.checkDataSource(claim, check)
	if err != nil {
		return nil, controller.ProvisioningFinished, err
	}
	var cloneOf, snapshot string
	switch source.kind {
	case kindClaim:
		cloneOf = source.name
		if !p.caps.CloneVolume {
			return nil, controller.ProvisioningFinished, errors.New("CSI driver does not support clone operations: controller CLONE_VOLUME capability is not reported")
		}
	case kindVolumeSnapshot:
		snapshot = source.name
		if !p.caps.CreateDeleteSnapshot {
			return nil, controller.ProvisioningFinished, errors.New("CSI driver does not support snapshot restore: controller CREATE_DELETE_SNAPSHOT capability is not reported")
		}
		if p.cfg.snapshots == nil {
			return nil, controller.ProvisioningFinished, errNoSnapshotClient
		}
	}
	vacName, err := p.attributesClassOf(claim)
	if err != nil {
		return nil, controller.ProvisioningFinished, err
	}
	if err := p.checkCapabilities(vacName != ""); err != nil {
		return nil, controller.ProvisioningFinished, err
	}
	if claim.Spec.Selector != nil {
		return nil, controller.ProvisioningFinished, errors.New("claim Selector is not supported")
	}
	if claim.UID == "" {
		return nil, controller.ProvisioningFinished, errors.New("corrupted PVC object, it is missing UID")
	}
	storage := claim.Spec.Resources.Requests[corev1.ResourceStorage]
	if storage.Cmp(*resource.NewQuantity(math.MaxInt64, resource.DecimalSI)) > 0 {
		// Quantity.Value() would give 0 (the driver's default size) or
		// a negative size; upstream sends that.
		return nil, controller.ProvisioningFinished, fmt.Errorf("requested size %s is more than the %d bytes a CSI CreateVolume request can carry", storage.String(), int64(math.MaxInt64))
	}
	pvName := p.VolumeName(claim)

	fsType, err := p.fsType(logger, class.Parameters)
	if err != nil {
		return nil, controller.ProvisioningFinished, err
	}
	params, err := stripReserved(class.Parameters)
	if err != nil {
		return nil, controller.ProvisioningFinished, fmt.Errorf("failed to strip CSI Parameters of prefixed keys: %w", err)
	}
	caps, err := p.volumeCapabilities(claim, class, fsType)
	if err != nil {
		return nil, controller.ProvisioningFinished, err
	}
	refs, err := resolveSecretRefs(logger, class.Parameters, pvName, claim)
	if err != nil {
		return nil, controller.ProvisioningNoChange, err
	}

	pl := &plan{
		fsType: fsType, refs: refs, vacName: vacName, cloneOf: cloneOf, snapshot: snapshot, sourceNamespace: source.namespace,
		class: class, migrated: migrated,
	}
	requirement, cached := p.topologies.get(claim.UID)
	if cached {
		pl.topologyCached = true
		logger.V(4).Info("Using the topology of the previous CreateVolume")
	} else if requirement, err = p.topologyRequirement(claim, class, selected); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, controller.ProvisioningReschedule, err
		}
		return nil, controller.ProvisioningNoChange, fmt.Errorf("error generating accessibility requirements: %w", err)
	}

	secrets, err := secretData(ctx, p.client, refs.provisioner)
	if err != nil {
		return nil, controller.ProvisioningNoChange, err
	}
	var mutable map[string]string
	if vacName != "" {
		vac, err := p.client.StorageV1().VolumeAttributesClasses().Get(ctx, vacName, metav1.GetOptions{})
		if err != nil {
			return nil, controller.ProvisioningNoChange, fmt.Errorf("get VolumeAttributesClass %q: %w", vacName, err)
		}
		if vac.DriverName != p.name {
			return nil, controller.ProvisioningFinished, fmt.Errorf("VAC %s referenced in PVC is for driver %s which does not match driver name %s", vacName, vac.DriverName, p.name)
		}
		mutable = maps.Clone(vac.Parameters)
	}
	if p.cfg.extraCreateMetadata {
		params[pvcNameKey] = claim.Name
		params[pvcNamespaceKey] = claim.Namespace
		params[pvNameKey] = pvName
	}
	pl.req = &csi.CreateVolumeRequest{
		Name:                      pvName,
		CapacityRange:             &csi.CapacityRange{RequiredBytes: storage.Value()},
		VolumeCapabilities:        caps,
		Parameters:                params,
		Secrets:                   secrets,
		AccessibilityRequirements: requirement,
		MutableParameters:         mutable,
	}
	if cloneOf != "" {
		src, err := p.cloneContentSource(ctx, claim, class, source.namespace, cloneOf)
		if err != nil {
			return nil, controller.ProvisioningNoChange, fmt.Errorf("error getting handle for DataSource Type %s by Name %s: %w", kindClaim, cloneOf, err)
		}
		pl.req.VolumeContentSource = src
	}
	if snapshot != "" {
		src, err := p.snapshotContentSource(ctx, claim, class, source.namespace, snapshot)
		if err != nil {
			return nil, controller.ProvisioningNoChange, fmt.Errorf("error getting handle for DataSource Type %s by Name %s: %w", kindVolumeSnapshot, snapshot, err)
		}
		pl.req.VolumeContentSource = src
	}
	return pl, controller.ProvisioningNoChange, nil
}

// sourceRef is the data source a claim names: spec.dataSource when set,
// else spec.dataSourceRef (upstream's order). namespace is set only for a
// dataSourceRef into another namespace.
type sourceRef struct {
	group, kind, name string
	namespace         string
}

// crossNamespace reports whether the source is in another namespace than
// its claim.
func (r sourceRef) crossNamespace() bool { return r.namespace != "" }

// sourceRefOf returns the claim's data source; false when it names none.
func sourceRefOf(claim *corev1.PersistentVolumeClaim) (sourceRef, bool) {
	var r sourceRef
	var group *string
	switch ds, ref := claim.Spec.DataSource, claim.Spec.DataSourceRef; {
	case ds != nil:
		r.kind, r.name, group = ds.Kind, ds.Name, ds.APIGroup
	case ref != nil:
		r.kind, r.name, group = ref.Kind, ref.Name, ref.APIGroup
		if ref.Namespace != nil && *ref.Namespace != claim.Namespace {
			r.namespace = *ref.Namespace
		}
	default:
		return r, false
	}
	if group != nil {
		r.group = *group
	}
	return r, true
}

// grantRef is the reference a ReferenceGrant must allow for r.
func (r sourceRef) grantRef() refgrant.Reference {
	return refgrant.Reference{Namespace: r.namespace, Group: r.group, Kind: r.kind, Name: r.name}
}

// sourceKey returns the key (namespace/name) of claim's data source when
// it is of kind, "" otherwise: one of the claim's namespace or, under the
// CrossNamespaceVolumeDataSource feature, of any namespace through its
// dataSourceRef.
func (p *Provisioner) sourceKey(claim *corev1.PersistentVolumeClaim, kind string) string {
	ref, ok := sourceRefOf(claim)
	switch {
	case !ok || ref.kind != kind || ref.name == "":
		return ""
	case !ref.crossNamespace():
		return claim.Namespace + "/" + ref.name
	case p.cfg.grants != nil:
		return ref.namespace + "/" + ref.name
	}
	return ""
}

// keepsSourceOf reports whether claim, pending as a clone or restore, may
// keep its data source from being deleted (the cloning protection, the
// snapshot's source protection). A source of its own namespace always may,
// as upstream. One of another namespace only while a ReferenceGrant
// allows the claim to read it, or once a CreateVolume for it may have
// started in this process (the in-flight finalizer alone is no proof: the
// claim's user may add it): a claim of any namespace could otherwise keep
// a claim or snapshot it may not read from being deleted, for ever. When
// the grants cannot be read, it may, to be safe. After a restart a create
// that started before it keeps the source only while the grant allows it;
// upstream never protects a source of another namespace.
func (p *Provisioner) keepsSourceOf(claim *corev1.PersistentVolumeClaim) bool {
	ref, ok := sourceRefOf(claim)
	if !ok || !ref.crossNamespace() {
		return true
	}
	if inflight.Has(claim) && p.attempts.state(claim.UID).sent() {
		return true
	}
	if p.cfg.grants == nil {
		return false
	}
	allowed, err := p.cfg.grants.Allows(claim.Namespace, ref.grantRef())
	return err != nil || allowed
}

// dataSource is the claim's data source this provisioner provisions from:
// kind kindClaim or kindVolumeSnapshot in namespace, or the zero value for
// none.
type dataSource struct{ kind, namespace, name string }

// checkDataSource accepts a claim without a data source, returns a clone's
// or restore's source and rejects what cannot be one. A source in another
// namespace needs the CrossNamespaceVolumeDataSource feature
// ([WithReferenceGrants]) and a ReferenceGrant there. Another kind belongs
// to an external populator: the claim is ignored, with upstream's Normal
// event (not in check mode).
func (p *Provisioner) checkDataSource(claim *corev1.PersistentVolumeClaim, check bool) (dataSource, error) {
	ref, ok := sourceRefOf(claim)
	if !ok {
		return dataSource{}, nil
	}
	namespace := claim.Namespace
	if ref.crossNamespace() {
		// A claim being deleted whose create this process started only
		// needs CreateVolume's answer to let its volume go (the PV is
		// released at once): a grant revoked meanwhile must not keep it
		// for ever. The in-flight finalizer alone is no proof: the claim's
		// user may set it, and would then get another namespace's data
		// copied without a grant.
		if p.cfg.grants == nil || claim.DeletionTimestamp == nil || !inflight.Has(claim) || !p.attempts.state(claim.UID).inFlight() {
			if err := p.checkGrant(claim, ref); err != nil {
				return dataSource{}, err
			}
		}
		namespace = ref.namespace
	}
	kind, name, group := ref.kind, ref.name, ref.group
	if name == "" {
		return dataSource{}, fmt.Errorf("the PVC source not found for PVC %s", claim.Name)
	}
	switch kind {
	case kindVolumeSnapshot:
		if group != snapshotAPIGroup {
			return dataSource{}, fmt.Errorf("the PVC source does not belong to the right APIGroup. Expected %s, Got %s", snapshotAPIGroup, group)
		}
		return dataSource{kindVolumeSnapshot, namespace, name}, nil
	case kindClaim:
		return dataSource{kindClaim, namespace, name}, nil
	}
	if !check {
		p.recorder.Event(claim, corev1.EventTypeNormal, reasonProvisioning, msgPopulator)
	}
	return dataSource{}, &controller.IgnoredError{
		Reason: fmt.Sprintf("data source (%s) is not handled by the provisioner, assuming an external populator will provision it", kind),
	}
}

// checkGrant accepts a source in another namespace when the feature is on
// and a ReferenceGrant there allows it; upstream's messages.
func (p *Provisioner) checkGrant(claim *corev1.PersistentVolumeClaim, ref sourceRef) error {
	if p.cfg.grants == nil {
		return errors.New("dataSourceRef namespace specified but the CrossNamespaceVolumeDataSource feature is disabled")
	}
	allowed, err := p.cfg.grants.Allows(claim.Namespace, ref.grantRef())
	if err != nil {
		return err
	}
	if !allowed {
		return fmt.Errorf("accessing %s/%s of %s dataSource from %s/%s isn't allowed", ref.namespace, ref.name, ref.kind, claim.Namespace, claim.Name)
	}
	return nil
}

// attributesClassOf returns the VolumeAttributesClass the claim names, ""
// for none or with the gate off. It fails, before the capability check
// since no driver helps with that, when the API server does not serve the
// classes.
func (p *Provisioner) attributesClassOf(claim *corev1.PersistentVolumeClaim) (string, error) {
	if !p.cfg.volumeAttributesClass || claim.Spec.VolumeAttributesClassName == nil || *claim.Spec.VolumeAttributesClassName == "" {
		return "", nil
	}
	name := *claim.Spec.VolumeAttributesClassName
	if p.cfg.vacUnserved {
		return "", fmt.Errorf("VolumeAttributesClass %q cannot be read: the API server does not serve storage.k8s.io/v1 VolumeAttributesClasses (Kubernetes before v1.34 serves v1beta1 at most); create the claim without volumeAttributesClassName", name)
	}
	return name, nil
}

// checkCapabilities fails when the driver cannot serve the request at all;
// upstream's messages.
func (p *Provisioner) checkCapabilities(modify bool) error {
	switch {
	case !p.caps.ControllerService:
		return errors.New("CSI driver does not support dynamic provisioning: plugin CONTROLLER_SERVICE capability is not reported")
	case !p.caps.CreateDeleteVolume:
		return errors.New("CSI driver does not support dynamic provisioning: controller CREATE_DELETE_VOLUME capability is not reported")
	case modify && !p.caps.ModifyVolume:
		return errors.New("CSI driver does not support VolumeAttributesClass: controller MODIFY_VOLUME capability is not reported")
	}
	return nil
}

// fsType returns the filesystem type of the class: the value of
// csi.storage.k8s.io/fstype or of the deprecated "fstype" key (any case,
// with a logged warning), else the default. Both keys are an error.
func (p *Provisioner) fsType(logger klog.Logger, params map[string]string) (string, error) {
	var fsType string
	found := 0
	for _, k := range slices.Sorted(maps.Keys(params)) {
		deprecated := strings.EqualFold(k, deprecatedFSTypeKey)
		if deprecated {
			logger.Info("Deprecated StorageClass parameter, use its replacement", "parameter", k, "replacement", prefixedFSTypeKey)
		}
		if deprecated || k == prefixedFSTypeKey {
			fsType = params[k]
			found++
		}
	}
	if found > 1 {
		return "", fmt.Errorf("fstype specified in parameters with both \"fstype\" and %q keys", prefixedFSTypeKey)
	}
	if fsType == "" {
		fsType = p.cfg.defaultFSType
	}
	return fsType, nil
}

// stripReserved returns a copy of params without the reserved-prefix keys
// the provisioner understands; any other reserved key is an error.
// Deprecated keys without the prefix stay, as upstream.
func stripReserved(params map[string]string) (map[string]string, error) {
	out := make(map[string]string, len(params))
	for _, k := range slices.Sorted(maps.Keys(params)) {
		if !strings.HasPrefix(k, reservedPrefix) {
			out[k] = params[k]
			continue
		}
		if !knownReservedKeys[k] {
			return nil, fmt.Errorf("found unknown parameter key %q with reserved namespace %s", k, reservedPrefix)
		}
	}
	return out, nil
}

// volumeCapabilities returns one capability per access mode of the claim,
// in order: Block for a block claim, otherwise Mount with fsType and the
// class's mount options. The access mode mapping is csi-lib-utils', which
// maps ReadWriteOnce to SINGLE_NODE_MULTI_WRITER and ReadWriteOncePod to
// SINGLE_NODE_SINGLE_WRITER when the driver has that capability.
func (p *Provisioner) volumeCapabilities(claim *corev1.PersistentVolumeClaim, class *storagev1.StorageClass, fsType string) ([]*csi.VolumeCapability, error) {
	block := isBlock(claim)
	caps := make([]*csi.VolumeCapability, 0, len(claim.Spec.AccessModes))
	for _, m := range claim.Spec.AccessModes {
		mode, err := accessmodes.ToCSIAccessMode([]corev1.PersistentVolumeAccessMode{m}, p.caps.SingleNodeMultiWriter)
		if err != nil {
			return nil, err
		}
		c := &csi.VolumeCapability{AccessMode: &csi.VolumeCapability_AccessMode{Mode: mode}}
		if block {
			c.AccessType = &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}
		} else {
			c.AccessType = &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{
				FsType: fsType, MountFlags: slices.Clone(class.MountOptions),
			}}
		}
		caps = append(caps, c)
	}
	return caps, nil
}

func isBlock(claim *corev1.PersistentVolumeClaim) bool {
	return claim.Spec.VolumeMode != nil && *claim.Spec.VolumeMode == corev1.PersistentVolumeBlock
}
