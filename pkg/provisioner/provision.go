package provisioner

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	storagehelpers "k8s.io/component-helpers/storage/volume"
	"k8s.io/klog/v2"
	"sigs.k8s.io/sig-storage-lib-external-provisioner/v13/controller"

	"github.com/kube-storage/csi-provisioner/pkg/csiclient"
	"github.com/kube-storage/csi-provisioner/pkg/inflight"
)

// cleanupAttempts is how many DeleteVolume calls remove a volume that was
// created too small, as upstream.
const cleanupAttempts = 5

// Provision creates the volume for opts.PVC with CreateVolume and returns
// the PV that records it. The library calls it again after any error; the
// returned state tells it whether a create may still be running:
//
//   - ProvisioningInBackground: the driver may still be creating the volume
//     (timeout, Unavailable, Aborted, ...; a volume smaller than requested
//     that could not be removed). The next call repeats the identical
//     request.
//   - ProvisioningFinished: nothing is in progress (a final answer of the
//     driver, or a request that cannot be valid). An InvalidArgument answer
//     keeps its gRPC code, for the library's slow retry.
//   - ProvisioningReschedule: the driver cannot create the volume on the
//     selected node, or that node is gone; the library asks the scheduler
//     for another node.
//   - ProvisioningNoChange: the call failed before reaching the driver.
//
// In node deployment ([WithNodeDeployment]) Provision first makes sure the
// claim is this node's (ShouldProvision has normally taken an
// immediate-binding claim already; see becomeOwner); a claim of another
// node gives an *controller.IgnoredError.
//
// Before the first CreateVolume for a claim the in-flight finalizer is
// persisted on it (see the package documentation); no CreateVolume is sent
// without it, and none for a claim being deleted that lacks it. For a claim
// being deleted, a final answer removes the finalizer.
//
// An error that comes after ctx ended (the sidecar stops, and the call in
// flight was cut short) is an *controller.IgnoredError: see [stopped]. On
// ProvisioningReschedule the selected node of opts.PVC is noted for the
// library's reschedule Update (see libraryClaims.rebase).
func (p *Provisioner) Provision(ctx context.Context, opts controller.ProvisionOptions) (*corev1.PersistentVolume, controller.ProvisioningState, error) {
	pv, state, err := p.provision(ctx, opts)
	if state == controller.ProvisioningReschedule && err != nil {
		p.reschedules.note(opts.PVC)
	}
	return pv, state, stopped(ctx, "provisioning", err)
}

// stopped turns err into an *controller.IgnoredError when ctx has ended:
// the library's context ends only when the sidecar stops (SIGTERM, a
// rolling update), and then cuts the CreateVolume or DeleteVolume in flight
// short with Canceled, or an API write with "context canceled". That is no
// failure of the claim or the volume, and the library would post it as a
// Warning ProvisioningFailed or VolumeFailedDelete that outlives the stop
// by an hour. On an IgnoredError it posts nothing. Nothing is lost: the
// claim keeps its in-flight finalizer and the volume its PV, and the next
// process repeats the call.
func stopped(ctx context.Context, operation string, err error) error {
	if err == nil || ctx.Err() == nil || isIgnoredError(err) {
		return err
	}
	klog.FromContext(ctx).V(2).Info("Stopped while "+operation+"; the next process repeats it", "err", err)
	return &controller.IgnoredError{Reason: fmt.Sprintf("stopped while %s: %v", operation, err)}
}

func (p *Provisioner) provision(ctx context.Context, opts controller.ProvisionOptions) (*corev1.PersistentVolume, controller.ProvisioningState, error) {
	claim, class := opts.PVC, opts.StorageClass
	logger := klog.FromContext(ctx).WithValues("pvc", klog.KObj(claim))
	ctx = klog.NewContext(ctx, logger)
	start := time.Now()

	if !p.annotatedForUs(claim) {
		return nil, controller.ProvisioningFinished, &controller.IgnoredError{
			Reason: fmt.Sprintf("PVC is not annotated for provisioner %s", p.name),
		}
	}
	if claim.DeletionTimestamp != nil && !inflight.Has(claim) {
		return nil, controller.ProvisioningFinished, &controller.IgnoredError{Reason: msgClaimDeletingNoInflight}
	}
	var taken bool // this call set selected-node to this node (node deployment)
	if p.node != nil {
		owned, took, state, err := p.takeClaim(ctx, claim, class)
		if err != nil {
			return nil, state, err
		}
		claim, taken, opts.SelectedNodeName = owned, took, p.node.NodeName
	}

	pl, state, err := p.prepare(ctx, claim, class, opts.SelectedNodeName, false)
	if err != nil {
		if state == controller.ProvisioningReschedule {
			p.topologies.drop(claim.UID)
		}
		logger.V(2).Info("Volume not provisioned", "state", state, "err", err)
		if claim.DeletionTimestamp != nil && !isIgnoredError(err) {
			// Release the claim if nothing is in flight for it; otherwise
			// say why it stays.
			released, relErr := p.releaseIfDeleting(ctx, claim)
			if relErr != nil {
				logger.Error(relErr, "Could not remove the in-flight finalizer")
			}
			if !released {
				err = fmt.Errorf("claim is being deleted but keeps finalizer %s until CreateVolume confirms whether a volume exists: %w", inflight.Finalizer, err)
			}
		}
		return nil, state, err
	}

	cur, state, err := p.currentClaim(ctx, claim, taken)
	if err != nil {
		return nil, state, err
	}
	if pl.cloneOf != "" {
		if err := p.protectCloneSource(ctx, pl.sourceNamespace, pl.cloneOf); err != nil {
			return nil, controller.ProvisioningNoChange, err
		}
	}
	if pl.snapshot != "" {
		if err := p.protectSnapshot(ctx, pl.sourceNamespace, pl.snapshot); err != nil {
			return nil, controller.ProvisioningNoChange, err
		}
	}
	if err := p.addInflight(ctx, cur); err != nil {
		if errors.Is(err, errClaimGone) {
			return nil, controller.ProvisioningFinished, &controller.IgnoredError{Reason: msgClaimDeletingNoInflight}
		}
		if errors.Is(err, errNotSelected) {
			return nil, controller.ProvisioningFinished, &controller.IgnoredError{Reason: fmt.Sprintf("the claim is no longer selected for node %s", p.node.NodeName)}
		}
		return nil, controller.ProvisioningNoChange, fmt.Errorf("add finalizer %s before CreateVolume: %w", inflight.Finalizer, err)
	}
	if !p.attempts.begin(claim.UID) {
		// The guard released the claim after a final answer: it is being
		// deleted or bound elsewhere.
		return nil, controller.ProvisioningFinished, &controller.IgnoredError{Reason: "the claim was released after a final CreateVolume answer"}
	}
	p.attempts.pin(claim.UID, pl.req.GetName())
	if p.caps.VolumeAccessibility && !pl.topologyCached {
		p.topologies.put(claim.UID, pl.req.GetAccessibilityRequirements())
	}

	if pl.migrated {
		ctx = csiclient.WithMigrated(ctx) // for the call metrics
	}
	vol, err := p.driver.CreateVolume(ctx, pl.req)
	if err != nil {
		state, err := p.createFailed(ctx, claim, opts.SelectedNodeName, err)
		if state != controller.ProvisioningInBackground {
			p.releaseSnapshotOf(ctx, claim, pl)
		}
		logger.V(2).Info("Volume not provisioned", "volumeName", pl.req.GetName(), "state", state, "code", csiclient.Code(err), "err", err, "duration", time.Since(start))
		return nil, state, err
	}
	// The driver has this volume (again): a PV of it is not a stale one.
	p.goneHandles.Delete(vol.GetVolumeId())
	return p.recordVolume(ctx, claim, pl, vol, start)
}

// recordVolume returns the PV of a created volume, after checking its
// capacity, that the API server would accept the PV (recordable) and, for
// a clone or a restore, that the driver reports the content source it was
// asked for and, for a class of the migrated in-tree plugin, translating
// it back to the in-tree source (a volume failing a check or the
// translation is deleted again, see discard).
func (p *Provisioner) recordVolume(ctx context.Context, claim *corev1.PersistentVolumeClaim, pl *plan, vol *csi.Volume, start time.Time) (*corev1.PersistentVolume, controller.ProvisioningState, error) {
	logger := klog.FromContext(ctx)
	// First: a volume another PV records must not be deleted below. The
	// handle is claimed for this PV at once, so that a second claim that
	// the driver answers with the same ID at the same time cannot pass
	// this check and delete the volume (discard) while this one records
	// it; discard releases it.
	if other := p.claimHandle(vol.GetVolumeId(), pl.req.GetName()); other != "" {
		return p.duplicateHandle(ctx, pl, vol, other)
	}
	requested := pl.req.GetCapacityRange().GetRequiredBytes()
	capacity := vol.GetCapacityBytes()
	switch {
	case capacity == 0:
		// CSI allows "unknown"; the API server does not.
		logger.V(4).Info("Driver reported capacity 0, using the requested size", "bytes", requested)
		capacity = requested
	case capacity < requested:
		return p.discard(ctx, claim, pl, vol, fmt.Errorf("created volume capacity %v less than requested capacity %v", vol.GetCapacityBytes(), requested))
	}
	if pl.req.GetVolumeContentSource() != nil && vol.GetContentSource() == nil {
		// The driver ignored the source: the volume is not the clone or
		// the restore the claim asked for (upstream's check and message).
		return p.discard(ctx, claim, pl, vol, errors.New("volume content source missing"))
	}

	pv := p.persistentVolume(claim, pl.class, pl, vol, capacity)
	if err := recordable(pv); err != nil {
		// The library would retry saving the PV for ever, with nothing on
		// the claim; the volume is deleted again and the claim told why.
		return p.discard(ctx, claim, pl, vol, fmt.Errorf("CSI driver %s returned volume ID %q that no PersistentVolume can record: %w", p.name, vol.GetVolumeId(), err))
	}
	if pl.migrated {
		// The translation can fail on the driver's answer (a zone
		// csi-translation-lib cannot parse): no PV can record the volume,
		// so it is deleted again, as upstream does (see discard).
		translated, err := inTreeVolume(pv)
		if err != nil {
			return p.discard(ctx, claim, pl, vol, err)
		}
		pv = translated
		// kube-controller-manager's PV controller adds it with an update;
		// set at creation it costs no write.
		metav1.SetMetaDataAnnotation(&pv.ObjectMeta, storagehelpers.AnnMigratedTo, p.name)
	}
	p.releaseSnapshotOf(ctx, claim, pl)
	p.topologies.drop(claim.UID)
	// Not forgotten yet: the claim is forgotten once bound without the
	// finalizer, or gone (see enqueueClaim, forgetClaim).
	p.attempts.created(claim.UID)
	p.node.forget(claim.UID)
	logger.V(2).Info("Provisioned volume", "pv", klog.KObj(pv), "volumeID", vol.GetVolumeId(), "capacity", capacity, "duration", time.Since(start))
	return pv, controller.ProvisioningFinished, nil
}

// createFailed maps a CreateVolume error to the library's state with
// csiclient.Classify and does the bookkeeping of a final answer.
func (p *Provisioner) createFailed(ctx context.Context, claim *corev1.PersistentVolumeClaim, selected string, err error) (controller.ProvisioningState, error) {
	class := csiclient.Classify(err, p.caps.VolumeAccessibility && selected != "")
	if class == csiclient.InProgress {
		return controller.ProvisioningInBackground, err
	}
	state := controller.ProvisioningFinished
	if class == csiclient.Reschedule {
		state = controller.ProvisioningReschedule
	}
	p.topologies.drop(claim.UID)
	if csiclient.Code(err) == codes.AlreadyExists {
		// Final for the library (as upstream), but a volume of this name
		// does exist, with other parameters: the claim must keep its
		// finalizer.
		if claim.DeletionTimestamp != nil {
			err = fmt.Errorf("claim is being deleted but keeps finalizer %s: volume %s exists in the driver with other parameters; delete it there, then remove the finalizer: %w", inflight.Finalizer, p.VolumeName(claim), err)
		}
		return state, err
	}
	p.attempts.final(claim.UID)
	if _, err := p.releaseIfDeleting(ctx, claim); err != nil {
		klog.FromContext(ctx).Error(err, "Could not remove the in-flight finalizer after a final CreateVolume answer; the claim's next sync (the library's retry, or the guard's on its next change) tries again")
	}
	return state, err
}

// releaseIfDeleting removes the in-flight finalizer from claim after a final
// answer when the claim is being deleted: no volume exists and none will be
// created. The claim's current state is taken from the informer when it is
// newer than the library's copy.
func (p *Provisioner) releaseIfDeleting(ctx context.Context, claim *corev1.PersistentVolumeClaim) (bool, error) {
	if claim.DeletionTimestamp == nil {
		cur, err := p.claims.PersistentVolumeClaims(claim.Namespace).Get(claim.Name)
		if err != nil || cur.UID != claim.UID || cur.DeletionTimestamp == nil {
			return false, nil
		}
		claim = cur
	}
	return p.releaseIdle(ctx, claim)
}

// discard handles a created volume that must not or cannot be recorded
// (smaller than requested, without the content source asked for, an
// answer no PV can hold, or one the migrated plugin's in-tree source cannot
// express): it is deleted again, never recorded in a PV, and
// the error is not final (ProvisioningInBackground, as upstream), so the
// library retries. When the delete succeeded and the claim is being
// deleted, the claim is released and the state is ProvisioningFinished.
func (p *Provisioner) discard(ctx context.Context, claim *corev1.PersistentVolumeClaim, pl *plan, vol *csi.Volume, reason error) (*corev1.PersistentVolume, controller.ProvisioningState, error) {
	logger := klog.FromContext(ctx)
	req := &csi.DeleteVolumeRequest{VolumeId: vol.GetVolumeId(), Secrets: pl.req.GetSecrets()}
	var err error
	for range cleanupAttempts {
		if err = p.driver.DeleteVolume(ctx, req); err == nil {
			break
		}
	}
	if err != nil {
		logger.Error(err, "Could not delete a created volume that cannot be used", "volumeID", vol.GetVolumeId(), "reason", reason)
		// The cleanup's error is text only (%v, as upstream): its gRPC code
		// is not the provisioning's, and the library takes an error with
		// INVALID_ARGUMENT for infeasible (final, slow retry).
		return nil, controller.ProvisioningInBackground, fmt.Errorf("%w. Cleanup of volume %s failed, volume is orphaned: %v", reason, pl.req.GetName(), err) //nolint:errorlint // the cleanup's code must not be the provisioning's (above)
	}
	logger.V(2).Info("Deleted a created volume that cannot be used", "volumeID", vol.GetVolumeId(), "reason", reason)
	p.forgetHandle(vol.GetVolumeId(), pl.req.GetName())
	p.attempts.final(claim.UID)
	released, err := p.releaseIfDeleting(ctx, claim)
	if err != nil {
		logger.Error(err, "Could not remove the in-flight finalizer after deleting the volume; the claim's next sync (the library's retry, or the guard's on its next change) tries again")
	}
	if released {
		// Nothing exists and the claim is going away: stop retrying.
		return nil, controller.ProvisioningFinished, reason
	}
	return nil, controller.ProvisioningInBackground, reason
}

func isIgnoredError(err error) bool {
	var ignored *controller.IgnoredError
	return errors.As(err, &ignored)
}

// currentClaim returns the informer's copy of claim, which is newer than
// the library's (that may be the copy it kept when the claim was last seen
// in progress), or the state and error to return when no CreateVolume may
// be sent for it now.
func (p *Provisioner) currentClaim(ctx context.Context, claim *corev1.PersistentVolumeClaim, taken bool) (*corev1.PersistentVolumeClaim, controller.ProvisioningState, error) {
	cur, err := p.claims.PersistentVolumeClaims(claim.Namespace).Get(claim.Name)
	if err != nil || cur.UID != claim.UID {
		return nil, controller.ProvisioningFinished, &controller.IgnoredError{Reason: "the claim no longer exists"}
	}
	if cur.Spec.VolumeName != "" {
		// Bound since the library's copy was taken (as the library's own
		// check, on the current claim): another CreateVolume could create
		// the volume again after the bound one was deleted (upstream
		// issue #1469), and the finalizer it needs would sit on a bound
		// claim.
		return nil, controller.ProvisioningFinished, &controller.IgnoredError{Reason: fmt.Sprintf("the claim is bound to volume %s", cur.Spec.VolumeName)}
	}
	if p.node != nil {
		if cur, err = p.ownedCopy(cur, claim, taken); err != nil {
			return nil, controller.ProvisioningFinished, err
		}
	}
	if !inflight.Has(cur) {
		p.attempts.observeClean(cur.UID)
	}
	if p.attempts.state(cur.UID) == attemptCreated {
		// The library calls again before its informer has the PV it saved.
		// Another CreateVolume would be answered from the existing volume,
		// but if it were slow, the claim could meanwhile be bound, deleted
		// and its volume deleted, and the late call would create it again
		// with no PV: ask the API server first.
		saved, err := p.savedVolume(ctx, cur)
		if err != nil {
			return nil, controller.ProvisioningNoChange, err
		}
		if saved {
			return nil, controller.ProvisioningFinished, &controller.IgnoredError{Reason: "the volume was created and its PV " + p.VolumeName(cur) + " is saved"}
		}
	}
	return cur, controller.ProvisioningFinished, nil
}

// savedVolume reports whether the API server has the PV of the volume
// this process created for claim.
func (p *Provisioner) savedVolume(ctx context.Context, claim *corev1.PersistentVolumeClaim) (bool, error) {
	name := p.VolumeName(claim)
	pv, err := p.client.CoreV1().PersistentVolumes().Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("get the PV %s of the volume created for the claim: %w", name, err)
	}
	return pv.Spec.ClaimRef != nil && pv.Spec.ClaimRef.UID == claim.UID, nil
}

// releaseSnapshotOf removes the source protection from the snapshot a
// claim is restored from, once no CreateVolume for it is in flight, unless
// another pending claim restores from the same snapshot and this process
// does not know its restore to be over (its CreateVolume may still read
// the snapshot): the last restore done removes it, or the sweep, which
// keeps it on the same condition. A failure only logs: the finalizer then
// stays until a later attempt or the sweep removes it.
func (p *Provisioner) releaseSnapshotOf(ctx context.Context, claim *corev1.PersistentVolumeClaim, pl *plan) {
	if pl.snapshot == "" {
		return
	}
	logger := klog.FromContext(ctx).WithValues("snapshot", klog.KRef(pl.sourceNamespace, pl.snapshot))
	if others := p.otherRestores(claim.UID, pl.sourceNamespace+"/"+pl.snapshot); len(others) > 0 {
		logger.V(4).Info("Keeping the snapshot's source protection: other claims restore from it", "pvcs", others)
		return
	}
	if err := p.releaseSnapshot(ctx, pl.sourceNamespace, pl.snapshot); err != nil {
		logger.Error(err, "Could not remove the snapshot's source protection")
	}
}

// otherRestores returns the pending claims, other than the one with UID
// self, that restore from the snapshot with key namespace/name and whose
// restore this process does not know to be over.
func (p *Provisioner) otherRestores(self types.UID, key string) []klog.ObjectRef {
	var refs []klog.ObjectRef
	for _, obj := range p.claimInf.GetStore().List() {
		c, ok := obj.(*corev1.PersistentVolumeClaim)
		if !ok || c.UID == self {
			continue
		}
		if p.pendingRestoreOf(c) == key && !p.attempts.state(c.UID).over() {
			refs = append(refs, klog.KObj(c))
		}
	}
	return refs
}
