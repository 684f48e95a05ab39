package provisioner

import (
	"maps"
	"slices"
	"sync"
	"time"

	snapv1 "github.com/kubernetes-csi/external-snapshotter/client/v8/apis/volumesnapshot/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/tools/cache"

	"github.com/kube-storage/csi-provisioner/pkg/inflight"
)

// Waits that end at once. The provisioning library retries a claim it
// could not provision with its backoff (--retry-interval-start, doubling up
// to --retry-interval-max, five minutes by default), whatever the claim
// waited for; upstream does the same. Four of those waits end with a
// change this provisioner sees in its caches, and then it hands the claim
// back to the library at once instead of leaving it to the backoff:
//
//   - a clone whose source claim was missing or not yet Bound, when the
//     source becomes Bound;
//   - a restore whose VolumeSnapshot was missing or not ready, when the
//     snapshot is ready (with [WithSnapshotInformer]);
//   - a claim whose data source is in another namespace, when a
//     ReferenceGrant of that namespace is created or changed;
//   - in node deployment, a claim this node declined for capacity, when a
//     volume of this node is deleted (nodewait.go).
//
// Likewise for a volume: a Released volume whose deletion was refused
// because a VolumeAttachment still named it is handed back when the last
// such attachment is gone.
//
// The library offers no way to queue an object from outside: it registers
// its event handlers on the informers it is given, so the provisioner gives
// it wrappers ([Provisioner.LibraryClaimsInformer],
// [Provisioner.LibraryVolumesInformer]) that keep those handlers, and
// passes them the object as an update. The library then syncs the object as
// after any other change of it; one it has nothing to do for costs it a
// cache read.

// libraryInformer is a shared informer as handed to the provisioning
// library: it remembers the handlers registered through it and, with skip,
// hides from them the updates skip reports (see [inflightOnly]).
type libraryInformer struct {
	cache.SharedIndexInformer
	// skip, when set, reports an informer update that the library's
	// handlers do not get.
	skip func(old, cur interface{}) bool

	mu       sync.Mutex
	handlers []cache.ResourceEventHandler
}

// skipping is a handler that does not pass on the updates skip reports.
type skipping struct {
	cache.ResourceEventHandler
	skip func(old, cur interface{}) bool
}

func (h skipping) OnUpdate(old, cur interface{}) {
	if !h.skip(old, cur) {
		h.ResourceEventHandler.OnUpdate(old, cur)
	}
}

// inflightOnly reports an update of a claim that only added or removed the
// in-flight finalizer. The library has nothing to do for it, but it syncs
// every claim it is told changed: the provisioner adds the finalizer in
// Provision when the binder did not (--enable-binder=false, or
// kube-controller-manager's binder handed the claim over first), and its
// guard removes it once the PV is saved, both before the claim is bound. So
// each such write made the library sync the claim once more, find its PV
// ("PersistentVolume already exists, skipping") and count that in
// controller_persistentvolumeclaim_provision_failed_total, after posting
// another Provisioning event: two failures per volume that upstream, which
// writes nothing to the claim, never counts. Any other change in the same
// update (the binder's hand-over or bind) is passed on.
func inflightOnly(old, cur interface{}) bool {
	o, ok1 := old.(*corev1.PersistentVolumeClaim)
	c, ok2 := cur.(*corev1.PersistentVolumeClaim)
	return ok1 && ok2 && inflight.Has(o) != inflight.Has(c) && equalButInflight(o, c)
}

// equalButInflight reports whether two versions of a claim are the same
// but for their resourceVersion, managedFields, in-flight finalizer and the
// volume name recorded with it.
func equalButInflight(a, b *corev1.PersistentVolumeClaim) bool {
	am, bm := a.ObjectMeta, b.ObjectMeta // shallow copies: only their own fields change
	am.ResourceVersion, bm.ResourceVersion = "", ""
	am.ManagedFields, bm.ManagedFields = nil, nil
	notInflight := func(f string) bool { return f == inflight.Finalizer }
	am.Finalizers = slices.DeleteFunc(slices.Clone(am.Finalizers), notInflight)
	bm.Finalizers = slices.DeleteFunc(slices.Clone(bm.Finalizers), notInflight)
	am.Annotations, bm.Annotations = withoutVolumeName(am.Annotations), withoutVolumeName(bm.Annotations)
	return equality.Semantic.DeepEqual(am, bm) && equality.Semantic.DeepEqual(a.Spec, b.Spec) && equality.Semantic.DeepEqual(a.Status, b.Status)
}

// withoutVolumeName returns annotations without inflight.AnnVolumeName: a
// copy if it is there, else annotations itself.
func withoutVolumeName(annotations map[string]string) map[string]string {
	if _, ok := annotations[inflight.AnnVolumeName]; !ok {
		return annotations
	}
	out := maps.Clone(annotations)
	delete(out, inflight.AnnVolumeName)
	if len(out) == 0 {
		return nil
	}
	return out
}

func (i *libraryInformer) remember(h cache.ResourceEventHandler) {
	i.mu.Lock()
	defer i.mu.Unlock()
	i.handlers = append(i.handlers, h)
}

// AddEventHandler and AddEventHandlerWithResyncPeriod are
// AddEventHandlerWithOptions, as in client-go's informer: the embedded
// informer's own methods would bypass remember.
func (i *libraryInformer) AddEventHandler(h cache.ResourceEventHandler) (cache.ResourceEventHandlerRegistration, error) {
	return i.AddEventHandlerWithOptions(h, cache.HandlerOptions{})
}

func (i *libraryInformer) AddEventHandlerWithResyncPeriod(h cache.ResourceEventHandler, resync time.Duration) (cache.ResourceEventHandlerRegistration, error) {
	return i.AddEventHandlerWithOptions(h, cache.HandlerOptions{ResyncPeriod: &resync})
}

func (i *libraryInformer) AddEventHandlerWithOptions(h cache.ResourceEventHandler, opts cache.HandlerOptions) (cache.ResourceEventHandlerRegistration, error) {
	registered := h
	if i.skip != nil {
		registered = skipping{ResourceEventHandler: h, skip: i.skip}
	}
	reg, err := i.SharedIndexInformer.AddEventHandlerWithOptions(registered, opts)
	if err == nil {
		i.remember(h)
	}
	return reg, err
}

// requeue passes obj to the remembered handlers as an update that changed
// nothing.
func (i *libraryInformer) requeue(obj interface{}) {
	i.mu.Lock()
	handlers := i.handlers
	i.mu.Unlock()
	for _, h := range handlers {
		h.OnUpdate(obj, obj)
	}
}

// LibraryClaimsInformer returns the claim informer to give the provisioning
// library (controller.ClaimsInformer): the shared one, through which the
// provisioner can queue a claim in the library when what it waited for
// changed. Give it to one controller only.
func (p *Provisioner) LibraryClaimsInformer() cache.SharedIndexInformer {
	return p.libraryClaims
}

// LibraryVolumesInformer is LibraryClaimsInformer for volumes
// (controller.VolumesInformer).
func (p *Provisioner) LibraryVolumesInformer() cache.SharedIndexInformer {
	return p.libraryVolumes
}

// watchDetaches registers attachmentDeleted on the VolumeAttachment
// informer.
func (p *Provisioner) watchDetaches() error {
	_, err := p.attachInf.AddEventHandler(cache.ResourceEventHandlerFuncs{DeleteFunc: p.attachmentDeleted})
	return err
}

// attachmentDeleted queues, in the library, a Released or Failed volume
// that the deleted VolumeAttachment named, once no other attachment names
// it: its deletion was refused while attached (checkDetached).
func (p *Provisioner) attachmentDeleted(obj interface{}) {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	names, _ := attachmentByVolume(obj)
	for _, name := range names {
		if left, err := p.attachInf.GetIndexer().ByIndex(indexAttachmentByVolume, name); err != nil || len(left) > 0 {
			continue
		}
		item, exists, err := p.volumeInf.GetStore().GetByKey(name)
		if err != nil || !exists {
			continue
		}
		if pv, ok := item.(*corev1.PersistentVolume); ok && (pv.Status.Phase == corev1.VolumeReleased || pv.Status.Phase == corev1.VolumeFailed) {
			p.libraryVolumes.requeue(pv)
		}
	}
}

// watchCloneSources registers cloneSourceChanged on the claim informer. It
// needs the clone-source index.
func (p *Provisioner) watchCloneSources() error {
	_, err := p.claimInf.AddEventHandler(cache.ResourceEventHandlerFuncs{UpdateFunc: p.cloneSourceChanged})
	return err
}

// cloneSourceChanged queues the pending clones of a claim in the library
// when the claim becomes Bound.
func (p *Provisioner) cloneSourceChanged(oldObj, newObj interface{}) {
	old, ok1 := oldObj.(*corev1.PersistentVolumeClaim)
	claim, ok2 := newObj.(*corev1.PersistentVolumeClaim)
	if !ok1 || !ok2 || old.Status.Phase == corev1.ClaimBound || claim.Status.Phase != corev1.ClaimBound {
		return
	}
	p.requeueClones(claim.Namespace + "/" + claim.Name)
}

// requeueClones queues the pending clones of the claim with key
// namespace/name.
func (p *Provisioner) requeueClones(key string) {
	objs, err := p.claimInf.GetIndexer().ByIndex(indexClaimByCloneSource, key)
	if err != nil {
		return
	}
	for _, obj := range objs {
		if clone, ok := obj.(*corev1.PersistentVolumeClaim); ok && waiting(clone) {
			p.libraryClaims.requeue(clone)
		}
	}
}

// watchSnapshots registers snapshotAdded and snapshotChanged on the
// snapshot informer.
func (p *Provisioner) watchSnapshots(inf cache.SharedIndexInformer) error {
	_, err := inf.AddEventHandler(cache.ResourceEventHandlerDetailedFuncs{
		AddFunc:    p.snapshotAdded,
		UpdateFunc: p.snapshotChanged,
	})
	return err
}

// snapshotAdded queues the pending restores of a snapshot created ready (a
// pre-provisioned one); at start the library syncs every claim anyway.
func (p *Provisioner) snapshotAdded(obj interface{}, isInInitialList bool) {
	if snap, ok := obj.(*snapv1.VolumeSnapshot); ok && !isInInitialList && snapshotReady(snap) {
		p.requeueRestores(snap.Namespace + "/" + snap.Name)
	}
}

// snapshotChanged queues the pending restores of a snapshot that became
// ready.
func (p *Provisioner) snapshotChanged(oldObj, newObj interface{}) {
	old, ok1 := oldObj.(*snapv1.VolumeSnapshot)
	snap, ok2 := newObj.(*snapv1.VolumeSnapshot)
	if ok1 && ok2 && !snapshotReady(old) && snapshotReady(snap) {
		p.requeueRestores(snap.Namespace + "/" + snap.Name)
	}
}

// snapshotReady reports what a restore needs of the snapshot itself: bound
// to a content and ready to use.
func snapshotReady(snap *snapv1.VolumeSnapshot) bool {
	st := snap.Status
	return st != nil && st.BoundVolumeSnapshotContentName != nil && st.ReadyToUse != nil && *st.ReadyToUse
}

// requeueRestores queues the pending claims that restore from the snapshot
// with key namespace/name. Restores are few: it reads every cached claim
// rather than keep an index.
func (p *Provisioner) requeueRestores(key string) {
	for _, obj := range p.claimInf.GetStore().List() {
		if claim, ok := obj.(*corev1.PersistentVolumeClaim); ok && waiting(claim) && p.restoreSourceOf(claim) == key {
			p.libraryClaims.requeue(claim)
		}
	}
}

// ReferenceGrantHandler returns the event handler to register on the
// ReferenceGrant informer: a grant created or changed queues, in the
// library, the pending claims whose data source is in the grant's
// namespace. It does nothing without [WithReferenceGrants].
func (p *Provisioner) ReferenceGrantHandler() cache.ResourceEventHandler {
	changed := func(obj interface{}) {
		grant, err := meta.Accessor(obj)
		if err != nil || p.cfg.grants == nil {
			return
		}
		for _, obj := range p.claimInf.GetStore().List() {
			claim, ok := obj.(*corev1.PersistentVolumeClaim)
			if !ok || !waiting(claim) {
				continue
			}
			if ref, ok := sourceRefOf(claim); ok && ref.namespace == grant.GetNamespace() {
				p.libraryClaims.requeue(claim)
			}
		}
	}
	// narrowed: a grant changed or deleted may no longer let a pending
	// clone keep its source; the cloning protection re-checks the sources
	// being deleted in the grant's namespace.
	narrowed := func(obj interface{}) {
		if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = tomb.Obj
		}
		grant, err := meta.Accessor(obj)
		recheck := p.recheckSource.Load()
		if err != nil || p.cfg.grants == nil || recheck == nil {
			return
		}
		objs, err := p.claimInf.GetIndexer().ByIndex(cache.NamespaceIndex, grant.GetNamespace())
		if err != nil {
			return
		}
		for _, obj := range objs {
			if c, ok := obj.(*corev1.PersistentVolumeClaim); ok && c.DeletionTimestamp != nil && slices.Contains(c.Finalizers, CloneFinalizer) {
				(*recheck)(c.Namespace + "/" + c.Name)
			}
		}
	}
	return cache.ResourceEventHandlerDetailedFuncs{
		AddFunc: func(obj interface{}, isInInitialList bool) {
			if !isInInitialList { // at start the library syncs every claim anyway
				changed(obj)
			}
		},
		DeleteFunc: narrowed,
		UpdateFunc: func(oldObj, newObj interface{}) {
			old, err1 := meta.Accessor(oldObj)
			grant, err2 := meta.Accessor(newObj)
			if err1 == nil && err2 == nil && old.GetResourceVersion() == grant.GetResourceVersion() {
				return // a resync
			}
			changed(newObj)
			narrowed(newObj)
		},
	}
}

// waiting reports whether claim may still be provisioned: pending, not
// bound to a volume, not being deleted.
func waiting(claim *corev1.PersistentVolumeClaim) bool {
	return claim.Spec.VolumeName == "" && claim.DeletionTimestamp == nil &&
		(claim.Status.Phase == corev1.ClaimPending || claim.Status.Phase == "")
}
