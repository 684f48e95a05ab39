package provisioner

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	storagehelpers "k8s.io/component-helpers/storage/volume"
	"k8s.io/klog/v2"
	"sigs.k8s.io/sig-storage-lib-external-provisioner/v13/controller"

	"github.com/kube-storage/csi-provisioner/pkg/csiclient"
)

// Delete deletes the volume behind pv with DeleteVolume; the library then
// deletes the PV object. It is called for Released volumes with reclaim
// policy Delete, provisioned ones and static CSI ones of this driver alike.
//
//   - A PV that is not a CSI volume of this driver gives an
//     *controller.IgnoredError: the library skips it silently. So does, in
//     node deployment, a PV whose node affinity does not allow this node,
//     and one without node affinity (see the package documentation). A CSI
//     volume of another driver whose pv.kubernetes.io/provisioned-by names
//     this one (a hand edit) also gets a Warning VolumeFailedDelete: no
//     provisioner deletes it, and its handle means nothing to this driver.
//   - While any VolumeAttachment names the PV (and the driver publishes
//     volumes), it returns "persistentvolume <pv> is still attached to node
//     <node>"; the library retries. ShouldDelete keeps such volumes from
//     Delete in the first place; this covers an attachment created between
//     the two.
//   - A driver that answers DeleteVolume with NotFound (CSI requires OK
//     for a volume that does not exist) gets an error that says so and
//     how to let the PV go: the volume may still exist, so it is not
//     taken for deleted (as upstream).
//   - While another PV of this driver records the same volume handle (a
//     driver that gave two claims one volume, or two static PVs of one
//     volume), it returns "not deleting volume ...": DeleteVolume would
//     delete the other PV's data. The library retries with backoff; the
//     volume is deleted once it is the last PV of the handle.
//   - The secrets are those named by the PV's deletion-secret annotations.
//     A PV without the annotations (written by old provisioners) resolves
//     them from its StorageClass with the claimRef's name and namespace. A
//     secret that cannot be read is logged and left out: it may be gone
//     already and the driver may not need it. If DeleteVolume then fails,
//     its error (and so the VolumeFailedDelete event) also says that the
//     secret could not be read.
//   - An error of DeleteVolume is returned as is; the library emits
//     VolumeFailedDelete and retries. Deleting a volume that no longer
//     exists succeeds (CSI), so Delete is idempotent.
//   - An error that comes after ctx ended (the sidecar stops) is an
//     *controller.IgnoredError, on which the library posts no event (see
//     [stopped]).
//   - Once DeleteVolume succeeded for a PV, Delete of that PV (same UID
//     and handle) succeeds without calling it again for deletedVolumeTTL:
//     the library calls Delete again when it could not delete the PV
//     object afterwards (see deletedVolume).
func (p *Provisioner) Delete(ctx context.Context, pv *corev1.PersistentVolume) error {
	return stopped(ctx, "deleting", p.delete(ctx, pv))
}

func (p *Provisioner) delete(ctx context.Context, pv *corev1.PersistentVolume) error {
	source, err := p.csiVolume(klog.FromContext(ctx), pv)
	if err != nil {
		return err
	}
	if source == nil {
		if pv.Spec.CSI != nil && pv.Annotations[storagehelpers.AnnDynamicallyProvisioned] == p.name {
			// The library hands it to this driver only, the other
			// driver's provisioner skips it: without a word it would stay
			// Released for ever. Its handle means nothing to this driver.
			p.recorder.Event(pv, corev1.EventTypeWarning, reasonVolumeFailedDelete, fmt.Sprintf(
				"persistentvolume %s is a CSI volume of driver %s, but %s names %s: not deleting it; delete the volume with its own driver and this PersistentVolume by hand",
				pv.Name, pv.Spec.CSI.Driver, storagehelpers.AnnDynamicallyProvisioned, p.name))
		}
		return &controller.IgnoredError{Reason: fmt.Sprintf("the volume is not a CSI volume of driver %s", p.name)}
	}
	logger := klog.FromContext(ctx).WithValues("pv", klog.KObj(pv), "volumeID", source.VolumeHandle)
	ctx = klog.NewContext(ctx, logger)
	if p.deleted.Has(deletedVolume{uid: pv.UID, handle: source.VolumeHandle}) {
		// The library's retry after it could not delete the PV object.
		logger.V(2).Info("Volume already deleted by this process; not calling DeleteVolume again")
		return nil
	}
	start := time.Now()
	if p.node != nil {
		if err := p.checkVolumeNode(ctx, pv); err != nil {
			return err
		}
	}
	if err := p.checkCapabilities(false); err != nil {
		return err
	}
	if err := p.checkDetached(pv); err != nil {
		logger.V(4).Info("Not deleting an attached volume", "err", err)
		return err
	}
	if other := p.handleHolder(source.VolumeHandle, pv.Name, p.reclaimedToo); other != "" {
		return fmt.Errorf("not deleting volume %q of persistentvolume %s: persistentvolume %s of driver %s records the same volume, and would lose its data; "+
			"it is deleted once no other persistentvolume records it, or once they are all Released with reclaim policy Delete and detached", source.VolumeHandle, pv.Name, other, p.name)
	}
	secrets, unread, err := p.deletionSecrets(ctx, pv)
	if err != nil {
		return err
	}
	if pv.Spec.CSI == nil {
		ctx = csiclient.WithMigrated(ctx) // an in-tree volume, for the call metrics
	}
	err = p.driver.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: source.VolumeHandle, Secrets: secrets})
	logger.V(2).Info("DeleteVolume done", "err", err, "duration", time.Since(start))
	if err == nil {
		p.deleted.Add(deletedVolume{uid: pv.UID, handle: source.VolumeHandle})
		p.goneHandles.Add(source.VolumeHandle)
		p.forgetHandle(source.VolumeHandle, pv.Name)
	}
	if csiclient.Code(err) == codes.NotFound {
		// CSI requires OK for a volume that does not exist, but drivers
		// also answer NotFound when their backend cannot find the volume
		// for the moment (vsphere-csi-driver #2620): taking it for
		// deleted could leak the volume, so the PV stays, explained.
		err = fmt.Errorf("%w; CSI requires DeleteVolume to answer OK for a volume that does not exist, so NotFound is not taken as deleted "+
			"(the volume may still exist). If the volume is gone, set the persistentvolume's persistentVolumeReclaimPolicy to Retain and delete it", err)
	}
	if err != nil && unread != nil {
		// The driver's answer alone (often "unauthenticated") would hide
		// that the secret it needs is gone: say so in the library's event.
		return fmt.Errorf("%w (sent without secrets: %w)", err, unread)
	}
	return err
}

// ShouldDelete is the library's DeletionGuard. A Released volume with
// reclaim policy Delete that a VolumeAttachment still names is not handed
// to Delete: the usual order when a pod and its claim go together is that
// the claim goes first and the detach follows. Upstream fails Delete then,
// with a Warning VolumeFailedDelete at every retry of the library's backoff
// (external-provisioner issue #1574); here the volume gets one Normal
// VolumeDelete event per node it waits for, and no retry: the deletion of
// its last VolumeAttachment hands it back to the library (requeue.go),
// whose periodic resync of every volume is the safety net. Delete checks
// the attachments again. Every other volume is left to the library's own
// checks.
//
// A PV whose deletion the library finished a moment ago is not handed to
// Delete again from a copy that lags behind it (finishedDeletions).
//
// In node deployment a volume that is not this node's is not handed to
// Delete either (checkVolumeNode): every node's library would count the
// ignored deletion as a deletion in its metrics.
//
// Once ctx has ended (the sidecar stops) no volume is handed to Delete:
// the library's workers go on taking what is left in their queue.
func (p *Provisioner) ShouldDelete(ctx context.Context, pv *corev1.PersistentVolume) bool {
	if ctx.Err() != nil {
		return false
	}
	if p.finished.lagsBehind(pv) {
		klog.FromContext(ctx).V(4).Info("Volume already deleted; the library's copy lags behind", "pv", klog.KObj(pv))
		return false
	}
	if pv.Status.Phase != corev1.VolumeReleased || pv.Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimDelete {
		return true
	}
	if p.node != nil {
		if source, err := p.csiVolume(klog.FromContext(ctx), pv); err == nil && source != nil && p.checkVolumeNode(ctx, pv) != nil {
			return false
		}
	}
	if p.attachInf == nil {
		return true
	}
	node, attached, err := p.attachedTo(pv)
	if err != nil || !attached {
		return true // Delete reports it
	}
	klog.FromContext(ctx).V(4).Info("Deleting the volume once it is detached", "pv", klog.KObj(pv), "node", node)
	p.recorder.Event(pv, corev1.EventTypeNormal, reasonVolumeDelete,
		fmt.Sprintf("persistentvolume %s is still attached to node %s: it is deleted once detached", pv.Name, node))
	return false
}

// reclaimedToo reports whether another PV that records the volume being
// deleted would have it deleted as well: it is Released with reclaim
// policy Delete and no VolumeAttachment names it. Its data is not kept by
// keeping the volume, and if every PV of a shared volume (static PVs of
// one share) waited for the others, none would ever be deleted. Upstream
// deletes each without looking at the others.
func (p *Provisioner) reclaimedToo(other *corev1.PersistentVolume) bool {
	return other.Status.Phase == corev1.VolumeReleased &&
		other.Spec.PersistentVolumeReclaimPolicy == corev1.PersistentVolumeReclaimDelete &&
		p.checkDetached(other) == nil
}

// checkDetached fails while a VolumeAttachment names pv, or while the
// attachments are not known yet. Only drivers that publish volumes have
// VolumeAttachments.
func (p *Provisioner) checkDetached(pv *corev1.PersistentVolume) error {
	node, attached, err := p.attachedTo(pv)
	switch {
	case err != nil:
		return err
	case attached:
		return fmt.Errorf("persistentvolume %s is still attached to node %s", pv.Name, node)
	}
	return nil
}

// attachedTo returns the node of the first VolumeAttachment (by name) that
// names pv, and whether there is one; false for a driver that does not
// publish volumes. Until the attachments are in the cache it fails: a
// volume must not be deleted because its attachment was not read yet.
func (p *Provisioner) attachedTo(pv *corev1.PersistentVolume) (string, bool, error) {
	if p.attachInf == nil {
		return "", false, nil
	}
	if !p.attachInf.HasSynced() {
		return "", false, fmt.Errorf("volumeattachments not read yet: not deleting persistentvolume %s before its attachments are known", pv.Name)
	}
	objs, err := p.attachInf.GetIndexer().ByIndex(indexAttachmentByVolume, pv.Name)
	if err != nil {
		return "", false, fmt.Errorf("list volumeattachments of %s: %w", pv.Name, err)
	}
	var attached []*storagev1.VolumeAttachment
	for _, obj := range objs {
		if va, ok := obj.(*storagev1.VolumeAttachment); ok {
			attached = append(attached, va)
		}
	}
	if len(attached) == 0 {
		return "", false, nil
	}
	slices.SortFunc(attached, func(a, b *storagev1.VolumeAttachment) int { return strings.Compare(a.Name, b.Name) })
	return attached[0].Spec.NodeName, true, nil
}

// deletionSecrets returns the data of the secret DeleteVolume needs for pv,
// nil for none. A secret that cannot be read is left out (it may have gone
// with its namespace, and the driver may not need it) and unread says why,
// for the error of a DeleteVolume that then fails. Only an invalid secret
// template of the fallback is an error.
func (p *Provisioner) deletionSecrets(ctx context.Context, pv *corev1.PersistentVolume) (data map[string]string, unread, err error) {
	logger := klog.FromContext(ctx)
	name, hasName := pv.Annotations[annDeletionSecretName]
	namespace, hasNamespace := pv.Annotations[annDeletionSecretNS]
	var ref *corev1.SecretReference
	switch {
	case hasName && hasNamespace:
		if name == "" || namespace == "" {
			logger.V(4).Info("The volume needs no deletion secret")
			return nil, nil, nil
		}
		ref = &corev1.SecretReference{Name: name, Namespace: namespace}
	default:
		if ref, unread, err = p.deletionSecretFromClass(logger, pv); err != nil || ref == nil {
			return nil, unread, err
		}
	}
	data, err = secretData(ctx, p.client, ref)
	if err != nil {
		logger.Error(err, "Could not read the deletion secret; deleting the volume without it", "secret", klog.KRef(ref.Namespace, ref.Name))
		return nil, fmt.Errorf("the deletion secret could not be read: %w", err), nil
	}
	return data, nil, nil
}

// deletionSecretFromClass resolves the provisioner secret of pv's class
// (translated to CSI when it is the migrated in-tree plugin's, as
// upstream) with the claimRef's name and namespace (annotation tokens
// cannot resolve), for volumes without the deletion-secret annotations:
// those written by old provisioners, and in-tree volumes provisioned
// before the migration. A class that cannot be read leaves no secret, and
// unread says why (see deletionSecrets).
func (p *Provisioner) deletionSecretFromClass(logger klog.Logger, pv *corev1.PersistentVolume) (ref *corev1.SecretReference, unread, err error) {
	className := storagehelpers.GetPersistentVolumeClass(pv)
	if className == "" {
		return nil, nil, nil
	}
	class, err := p.classes.Get(className)
	if err != nil {
		logger.Info("Could not get the volume's storage class; deleting the volume without secrets", "class", className, "err", err)
		return nil, fmt.Errorf("the storage class that names the deletion secret could not be read: %w", err), nil
	}
	if pv.Spec.ClaimRef == nil {
		logger.Info("The volume has no claim reference; deleting it without secrets")
		return nil, nil, nil
	}
	// A class of the migrated in-tree plugin names its secrets in the
	// plugin's terms (Portworx: openstorage.io/auth-secret-*).
	if class, _, err = p.csiClass(logger, class); err != nil {
		return nil, nil, err
	}
	claim := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: pv.Spec.ClaimRef.Name, Namespace: pv.Spec.ClaimRef.Namespace}}
	ref, err = resolveSecretRef(logger, provisionerSecret, class.Parameters, pv.Name, claim)
	if err != nil {
		return nil, nil, fmt.Errorf("failed to get secretreference for volume %s: %w", pv.Name, err)
	}
	return ref, nil, nil
}
