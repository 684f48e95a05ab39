package provisioner

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	corelisters "k8s.io/client-go/listers/core/v1"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	storagehelpers "k8s.io/component-helpers/storage/volume"
	"k8s.io/klog/v2"
	"sigs.k8s.io/sig-storage-lib-external-provisioner/v13/controller"

	"github.com/kube-storage/csi-provisioner/internal/events"
	"github.com/kube-storage/csi-provisioner/internal/expiring"
	"github.com/kube-storage/csi-provisioner/internal/volindex"
	"github.com/kube-storage/csi-provisioner/pkg/csiclient"
	"github.com/kube-storage/csi-provisioner/pkg/inflight"
)

// Event reasons, upstream's strings.
const (
	reasonProvisioning       = "Provisioning"
	reasonProvisioningFailed = "ProvisioningFailed"
	reasonVolumeFailedDelete = "VolumeFailedDelete"
	reasonVolumeDelete       = "VolumeDelete" // a volume waiting for its detach (see ShouldDelete)
)

// Names of the indexers the provisioner adds to the shared informers.
const (
	indexAttachmentByVolume = "csi-provisioner.provisioner/volume-name"
)

// Annotations, attributes and messages, upstream's strings.
const (
	annAlphaSelectedNode    = "volume.alpha.kubernetes.io/selected-node"
	annDeletionSecretName   = "volume.kubernetes.io/provisioner-deletion-secret-name"
	annDeletionSecretNS     = "volume.kubernetes.io/provisioner-deletion-secret-namespace"
	annModifySecretName     = "volume.kubernetes.io/controller-modify-secret-name"
	annModifySecretNS       = "volume.kubernetes.io/controller-modify-secret-namespace"
	volumeAttributeIdentity = "storage.kubernetes.io/csiProvisionerIdentity"
	msgPopulator            = "Assuming an external populator will provision the volume"

	msgClaimDeletingNoInflight = "claim is being deleted and no CreateVolume was started for it: nothing to provision"
)

var (
	_ controller.Provisioner      = (*Provisioner)(nil)
	_ controller.Qualifier        = (*Provisioner)(nil)
	_ controller.BlockProvisioner = (*Provisioner)(nil)
	_ controller.DeletionGuard    = (*Provisioner)(nil)
)

// Provisioner creates and deletes the volumes of one CSI driver for
// sig-storage-lib-external-provisioner's ProvisionController. It is safe for
// concurrent use; the library calls it from many workers at once, never for
// the same claim (or volume) twice at the same time.
type Provisioner struct {
	client kubernetes.Interface
	driver csiclient.Driver
	caps   csiclient.Capabilities
	name   string
	cfg    config

	recorder    record.EventRecorder
	broadcaster record.EventBroadcaster // nil when the caller gave a recorder

	claims         corelisters.PersistentVolumeClaimLister
	classes        storagelisters.StorageClassLister
	classInf       cache.SharedIndexInformer
	nodes          corelisters.NodeLister       // nil without VolumeAccessibility
	csiNodes       storagelisters.CSINodeLister // nil without VolumeAccessibility
	claimInf       cache.SharedIndexInformer
	libraryClaims  *libraryInformer // claimInf as given to the library
	libraryVolumes *libraryInformer // volumeInf as given to the library
	volumeInf      cache.SharedIndexInformer
	volumes        *volindex.Index
	attachInf      cache.SharedIndexInformer // nil without PublishUnpublish
	hasSynced      []cache.InformerSynced
	topologies     *topologyCache
	attempts       *ledger
	reschedules    *rescheduleNotes
	finished       *finishedDeletions
	deleted        *expiring.Set[deletedVolume]
	goneHandles    *goneHandles
	handles        *handleRecords
	node           *nodeDeployment // nil without WithNodeDeployment
	synced         *syncedVersions
	bg             background
	// recheckSource queues a claim key in the running cloning protection
	// (nil while it does not run).
	recheckSource atomic.Pointer[func(string)]
}

// New returns a provisioner for driver. It registers the informers it reads
// on factory (PersistentVolumeClaims, PersistentVolumes, StorageClasses
// always; Nodes and CSINodes when the driver reports volume accessibility
// constraints and topology is not off (WithTopology), except in node
// deployment, which reads only its own node's static copies;
// VolumeAttachments when it reports PUBLISH_UNPUBLISH_VOLUME)
// and adds its indexers to them, so it must be called before factory is
// started. Invalid options are reported as one joined error.
func New(client kubernetes.Interface, driver csiclient.Driver, factory informers.SharedInformerFactory, opts ...Option) (*Provisioner, error) {
	if client == nil || driver == nil || factory == nil {
		return nil, errors.New("new provisioner: client, driver and informer factory are required")
	}
	caps := driver.Capabilities()
	if caps.DriverName == "" {
		return nil, errors.New("new provisioner: the driver reports no name")
	}
	if err := checkDriverName(caps.DriverName); err != nil {
		return nil, fmt.Errorf("new provisioner: %w", err)
	}
	cfg := defaultConfig()
	for _, opt := range opts {
		opt(&cfg)
	}
	if cfg.topologyOff {
		caps.VolumeAccessibility = false
	}
	if err := cfg.validate(caps.DriverName); err != nil {
		return nil, fmt.Errorf("new provisioner: %w", err)
	}

	p := &Provisioner{
		client:      client,
		driver:      driver,
		caps:        caps,
		name:        caps.DriverName,
		cfg:         cfg,
		topologies:  newTopologyCache(),
		attempts:    newLedger(),
		reschedules: newRescheduleNotes(),
		finished:    newFinishedDeletions(cfg.clock),
		deleted:     expiring.NewSet[deletedVolume](cfg.clock, deletedVolumeTTL),
		goneHandles: newGoneHandles(cfg.clock),
		synced:      newSyncedVersions(),
		handles:     newHandleRecords(cfg.clock),
	}
	if cfg.node != nil {
		node, err := newNodeDeployment(*cfg.node, caps.DriverName)
		if err != nil {
			return nil, fmt.Errorf("new provisioner: %w", err)
		}
		p.node = node
	}
	switch r := cfg.recorder.(type) {
	case *events.Deduplicator:
		p.recorder = r
	case nil:
		p.broadcaster = record.NewBroadcaster()
		p.recorder = events.NewDeduplicator(
			p.broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: EventSourceComponent}), 0)
	default:
		p.recorder = events.NewDeduplicator(r, 0)
	}

	claims := factory.Core().V1().PersistentVolumeClaims()
	volumes := factory.Core().V1().PersistentVolumes()
	classes := factory.Storage().V1().StorageClasses()
	p.claims, p.classes = claims.Lister(), classes.Lister()
	p.claimInf, p.volumeInf = claims.Informer(), volumes.Informer()
	p.classInf = classes.Informer()
	p.libraryClaims = &libraryInformer{SharedIndexInformer: p.claimInf, skip: func(old, cur interface{}) bool {
		return inflightOnly(old, cur) || p.synced.alreadySynced(old, cur)
	}}
	p.libraryVolumes = &libraryInformer{SharedIndexInformer: p.volumeInf}
	p.hasSynced = append(p.hasSynced, p.claimInf.HasSynced, p.volumeInf.HasSynced, classes.Informer().HasSynced)
	volumeIndex, err := volindex.Add(p.volumeInf, p.UIDNamePrefix())
	if err != nil {
		return nil, fmt.Errorf("new provisioner: %w", err)
	}
	p.volumes = volumeIndex
	if err := p.trackHandles(); err != nil {
		return nil, fmt.Errorf("new provisioner: %w", err)
	}
	switch {
	case caps.VolumeAccessibility && p.node != nil:
		p.nodes, p.csiNodes = p.node.nodes, p.node.csiNodes
	case caps.VolumeAccessibility:
		nodes, csiNodes := factory.Core().V1().Nodes(), factory.Storage().V1().CSINodes()
		p.nodes, p.csiNodes = nodes.Lister(), csiNodes.Lister()
		p.hasSynced = append(p.hasSynced, nodes.Informer().HasSynced, csiNodes.Informer().HasSynced)
	}
	if caps.CloneVolume {
		if err := p.claimInf.AddIndexers(cache.Indexers{indexClaimByCloneSource: p.claimByCloneSource}); err != nil {
			return nil, fmt.Errorf("new provisioner: add clone source indexer: %w", err)
		}
		if err := p.watchCloneSources(); err != nil {
			return nil, fmt.Errorf("new provisioner: watch clone sources: %w", err)
		}
	}
	if cfg.snapshotInf != nil {
		if err := p.watchSnapshots(cfg.snapshotInf); err != nil {
			return nil, fmt.Errorf("new provisioner: watch snapshots: %w", err)
		}
	}
	if p.node != nil && p.node.GetCapacity != nil {
		if err := p.watchFreedCapacity(); err != nil {
			return nil, fmt.Errorf("new provisioner: watch volume deletions: %w", err)
		}
	}
	if caps.PublishUnpublish {
		p.attachInf = factory.Storage().V1().VolumeAttachments().Informer()
		p.hasSynced = append(p.hasSynced, p.attachInf.HasSynced)
		if err := p.attachInf.AddIndexers(cache.Indexers{indexAttachmentByVolume: attachmentByVolume}); err != nil {
			return nil, fmt.Errorf("new provisioner: add volume attachment indexer: %w", err)
		}
		if err := p.watchDetaches(); err != nil {
			return nil, fmt.Errorf("new provisioner: watch volume attachments: %w", err)
		}
	}
	return p, nil
}

// HasSynced reports whether every informer the provisioner reads has synced.
func (p *Provisioner) HasSynced() bool {
	for _, synced := range p.hasSynced {
		if !synced() {
			return false
		}
	}
	return true
}

// Identity is the value of the storage.kubernetes.io/csiProvisionerIdentity
// volume attribute of the PVs this provisioner creates.
func (p *Provisioner) Identity() string { return p.cfg.identity }

// VolumeName returns the name of the PV and of the CSI volume for claim:
// "<prefix>-<uid>", where the UID is whole, or without dashes and cut to
// the configured length; or, for a claim that carries the in-flight
// finalizer, the name recorded with it (inflight.AnnVolumeName), so that a
// process with other flags repeats the calls of the one before; once this
// process sent a CreateVolume for the claim, the name of that call. It is the
// library's VolumeName hook, so the library's "PV already exists" check
// looks for the name this provisioner uses.
func (p *Provisioner) VolumeName(claim *corev1.PersistentVolumeClaim) string {
	if name, ok := p.attempts.pinned(claim.UID); ok {
		return name // a CreateVolume of this process used it (see ledger.pin)
	}
	uid := string(claim.UID)
	if n := p.cfg.volumeNameUUIDLength; n >= 0 {
		uid = strings.ReplaceAll(uid, "-", "")
		uid = uid[:min(n, len(uid))]
	}
	name := p.cfg.volumeNamePrefix + "-" + uid
	if recorded := claim.Annotations[inflight.AnnVolumeName]; recorded != "" && recorded != name &&
		inflight.Has(claim) && namesUID(recorded, claim.UID) {
		return recorded
	}
	return name
}

// minRecordedUIDLength is the fewest characters of the claim's UID a
// recorded volume name must end in to be used.
const minRecordedUIDLength = 8

// namesUID reports whether name is a volume name that VolumeName could have
// made for a claim of uid, with some prefix: it ends in "-" and the whole
// UID, or in "-" and at least minRecordedUIDLength characters from the
// start of the UID without dashes. Anybody who may edit the claim may set
// the annotation: a name tied to the claim's own UID cannot be the name of
// another claim's volume (a claim restored from a backup with its
// annotations has a new UID), nor a name chosen to reach a volume in the
// backend, which CreateVolume would return for that name; and it must be a
// valid PV name, as every name the flags can make is. A shorter UID
// part (a --volume-name-uuid-length below 8) is not used; the configured
// name then applies, as before the annotation.
func namesUID(name string, uid types.UID) bool {
	if len(validation.IsDNS1123Subdomain(name)) > 0 {
		return false // no valid PV name (a path, say): never sent to the driver
	}
	if strings.HasSuffix(name, "-"+string(uid)) {
		return true
	}
	i := strings.LastIndex(name, "-")
	part := name[i+1:]
	return i > 0 && len(part) >= minRecordedUIDLength && strings.HasPrefix(strings.ReplaceAll(string(uid), "-", ""), part)
}

// UIDNamePrefix returns the prefix of the volume names that end in the
// full claim UID (see [Provisioner.VolumeName]); "" when names carry a
// truncated UID (--volume-name-uuid-length), which does not identify the
// claim.
func (p *Provisioner) UIDNamePrefix() string {
	if p.cfg.volumeNameUUIDLength >= 0 {
		return ""
	}
	return p.cfg.volumeNamePrefix
}

// SupportsBlock is always true, as upstream: CSI has no capability for raw
// block volumes, so a driver that lacks them fails CreateVolume instead.
func (p *Provisioner) SupportsBlock(context.Context) bool { return true }

// ShouldProvision reports whether the library should try to provision
// claim: it is annotated for this driver (volume.kubernetes.io/storage-provisioner,
// falling back to the beta key), not bound to a volume, and, if it is being
// deleted, carries the in-flight finalizer (a CreateVolume may be in flight
// and must be finished or failed; without the finalizer no create ever
// starts for a claim being deleted).
//
// Because the library is silent about some reasons not to provision, they
// are reported here, each once, as a Warning ProvisioningFailed event: the
// claim names no class, or its class names another provisioner. A class
// that does not exist is not reported here: the binder (this one, or
// kube-controller-manager's) already reports it on the claim, in the API
// server's words; true is returned, so the library keeps retrying until
// the class appears.
//
// Once ctx has ended (the sidecar stops) it returns false: the library's
// workers go on taking the claims left in their queue, and would post a
// Normal Provisioning event for each before Provision fails.
//
// The version of a claim it returns true for is remembered (see
// syncedVersions), so that its late update notification does not make the
// library sync it again.
func (p *Provisioner) ShouldProvision(ctx context.Context, claim *corev1.PersistentVolumeClaim) bool {
	if !p.shouldProvision(ctx, claim) {
		return false
	}
	p.synced.record(claim)
	return true
}

func (p *Provisioner) shouldProvision(ctx context.Context, claim *corev1.PersistentVolumeClaim) bool {
	logger := klog.FromContext(ctx)
	if ctx.Err() != nil || !p.annotatedForUs(claim) || claim.Spec.VolumeName != "" {
		return false
	}
	if claim.DeletionTimestamp != nil && !inflight.Has(claim) {
		logger.V(4).Info("Not provisioning a claim that is being deleted without the in-flight finalizer", "pvc", klog.KObj(claim))
		return false
	}
	// Before node deployment takes the claim: a node must not take a claim
	// that it then refuses.
	if msg := p.volumeNameTaken(claim); msg != "" {
		p.recorder.Event(claim, corev1.EventTypeWarning, reasonProvisioningFailed, msg)
		return false
	}
	if p.node != nil && !p.nodeShouldProvision(ctx, claim) {
		return false
	}
	className := storagehelpers.GetPersistentVolumeClaimClass(claim)
	class, err := p.classes.Get(className)
	switch {
	case apierrors.IsNotFound(err):
		if className == "" {
			p.recorder.Event(claim, corev1.EventTypeWarning, reasonProvisioningFailed, "the claim names no storage class")
		}
		logger.V(4).Info("Claim's class is missing", "pvc", klog.KObj(claim), "class", className)
		return true
	case err != nil:
		return true // the library reports its own lookup error
	case !p.ownsClass(class):
		p.recorder.Event(claim, corev1.EventTypeWarning, reasonProvisioningFailed,
			fmt.Sprintf("the claim is annotated for %s but its storageclass %q names provisioner %q", p.name, className, class.Provisioner))
		return false
	}
	return true
}

// volumeNameTaken returns why the claim cannot get its volume name, when a
// PV of that name records another claim; "" otherwise. With
// --volume-name-uuid-length two claims' UIDs can start alike; the library
// would skip the claim in silence (a PV of its name exists), and a
// CreateVolume of that name would return the other claim's volume.
func (p *Provisioner) volumeNameTaken(claim *corev1.PersistentVolumeClaim) string {
	name := p.VolumeName(claim)
	pv, ok := p.cachedVolume(name).(*corev1.PersistentVolume)
	if !ok || pv.Spec.ClaimRef == nil || pv.Spec.ClaimRef.UID == "" || pv.Spec.ClaimRef.UID == claim.UID {
		return ""
	}
	ref := pv.Spec.ClaimRef
	why := "a PersistentVolume of that name exists"
	if n := p.cfg.volumeNameUUIDLength; n >= 0 {
		why = fmt.Sprintf("--volume-name-uuid-length=%d keeps the first %d characters of the claim's UID, which another claim shares", n, n)
	}
	advice := "Delete this claim and create it again: it gets another UID"
	if claim.DeletionTimestamp != nil {
		advice = fmt.Sprintf("The claim is being deleted and keeps finalizer %s in case a CreateVolume for it ran: a driver answers a CreateVolume of that name with the volume of that name, which PersistentVolume %s records. Unless that volume is gone from the storage backend, nothing of this claim can leak: remove the finalizer",
			inflight.Finalizer, pv.Name)
	}
	return fmt.Sprintf("the volume name %s of this claim is taken: PersistentVolume %s records claim %s/%s (UID %s); %s. %s",
		name, pv.Name, ref.Namespace, ref.Name, ref.UID, why, advice)
}

// CheckProvision is the binder's ProvisionChecker: it returns nil when a
// CreateVolume for claim with class could be sent now, that is, the request
// builds (valid class parameters and claim, resolvable topology, secret
// references, existing secrets and VolumeAttributesClass) and nothing makes
// the provisioner skip the claim (a data source handled by a populator).
// It writes nothing, records no event and caches nothing; it reads the
// informers plus, as Provision does, the provisioner secret and the
// VolumeAttributesClass with live GETs.
func (p *Provisioner) CheckProvision(ctx context.Context, claim *corev1.PersistentVolumeClaim, class *storagev1.StorageClass) error {
	if p.node != nil {
		if err := p.nodeCheckProvision(claim); err != nil {
			return err
		}
	}
	if msg := p.volumeNameTaken(claim); msg != "" {
		return errors.New(msg)
	}
	selected, _ := selectedNode(claim)
	_, _, err := p.prepare(ctx, claim, class, selected, true)
	return err
}

// annotatedForUs reports whether claim asks this driver for a volume: its
// storage-provisioner annotation names the driver, or, with in-tree
// migration, names the migrated plugin while pv.kubernetes.io/migrated-to
// names the driver (as kube-controller-manager annotated claims before it
// wrote the driver's name, and as upstream accepts them).
func (p *Provisioner) annotatedForUs(claim *corev1.PersistentVolumeClaim) bool {
	provisioner, ok := claim.Annotations[storagehelpers.AnnStorageProvisioner]
	if !ok {
		provisioner = claim.Annotations[storagehelpers.AnnBetaStorageProvisioner]
	}
	return provisioner == p.name ||
		(p.cfg.inTree != "" && provisioner == p.cfg.inTree && claim.Annotations[storagehelpers.AnnMigratedTo] == p.name)
}

// selectedNode returns the node the scheduler picked for claim, read as the
// library reads it (with the alpha key as fallback).
func selectedNode(claim *corev1.PersistentVolumeClaim) (string, bool) {
	if n, ok := claim.Annotations[storagehelpers.AnnSelectedNode]; ok {
		return n, true
	}
	n, ok := claim.Annotations[annAlphaSelectedNode]
	return n, ok
}

func attachmentByVolume(obj interface{}) ([]string, error) {
	va, ok := obj.(*storagev1.VolumeAttachment)
	if !ok || va.Spec.Source.PersistentVolumeName == nil {
		return nil, nil
	}
	return []string{*va.Spec.Source.PersistentVolumeName}, nil
}

// checkDriverName fails for a driver name that no PV can carry in
// spec.csi.driver (the API server's rule: at most 63 characters, and a
// DNS-1123 subdomain once lowercased; CSI's own rule is nearly the same).
// With such a name every PV create would be refused, after CreateVolume
// made the volume, and the library retries the create in the background
// without a word on the claim.
func checkDriverName(name string) error {
	msgs := validation.IsDNS1123Subdomain(strings.ToLower(name))
	if len(name) > 63 {
		msgs = append(msgs, validation.MaxLenError(63))
	}
	if len(msgs) > 0 {
		return fmt.Errorf("the CSI driver reports the name %q, which no PersistentVolume can name (spec.csi.driver: %s): fix the name the driver's GetPluginInfo returns",
			name, strings.Join(msgs, "; "))
	}
	return nil
}
