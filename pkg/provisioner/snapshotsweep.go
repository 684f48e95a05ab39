package provisioner

import (
	"context"
	"fmt"
	"slices"
	"time"

	snapv1 "github.com/kubernetes-csi/external-snapshotter/client/v8/apis/volumesnapshot/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// RunSnapshotSweep removes SnapshotFinalizer, once the claims are known and
// then every interval, from the VolumeSnapshots that no pending claim restores from: upstream's sweep of
// orphaned finalizers (--snapshot-orphan-sweep-interval). Provision already
// removes the finalizer after a restore; the sweep catches what a crash or
// a deleted claim left behind, which would otherwise block the snapshot's
// deletion. It returns when ctx is done, and at once when interval is not
// positive, the driver does not report CREATE_DELETE_SNAPSHOT or there is
// no snapshot client.
func (p *Provisioner) RunSnapshotSweep(ctx context.Context, interval time.Duration) {
	if interval <= 0 || !p.caps.CreateDeleteSnapshot || p.cfg.snapshots == nil {
		return
	}
	logger := klog.FromContext(ctx).WithName("snapshot-sweep")
	ctx = klog.NewContext(ctx, logger)
	sweep := func() {
		if err := p.sweepSnapshots(ctx); err != nil {
			logger.Error(err, "Snapshot finalizer sweep failed; the next one retries")
		}
	}
	// The first sweep as soon as the claims are known, as upstream's: a
	// protection left by a sidecar that died between a restore and its
	// release would otherwise wait a whole interval.
	if !cache.WaitForCacheSync(ctx.Done(), p.HasSynced) {
		return
	}
	sweep()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			sweep()
		}
	}
}

// sweepSnapshots runs one sweep. An API server that serves no snapshot API
// has nothing to sweep.
func (p *Provisioner) sweepSnapshots(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	snaps, err := p.snapshotsToSweep(ctx)
	if apierrors.IsNotFound(err) {
		logger.V(4).Info("The snapshot API is not served; nothing to sweep")
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	var pending map[string]bool // computed at the first protected snapshot
	for _, snap := range snaps {
		if !slices.Contains(snap.Finalizers, SnapshotFinalizer) {
			continue
		}
		if pending == nil {
			if pending, err = p.pendingRestores(); err != nil {
				return fmt.Errorf("list the claims: %w", err) // keep every protection when unsure
			}
		}
		if pending[snap.Namespace+"/"+snap.Name] {
			continue
		}
		if err := p.releaseSnapshot(ctx, snap.Namespace, snap.Name); err != nil {
			errs = append(errs, err)
			continue
		}
		logger.V(2).Info("Removed an orphaned source protection", "snapshot", klog.KObj(snap))
	}
	if len(errs) > 0 {
		return errs[0]
	}
	return nil
}

// snapshotsToSweep returns every VolumeSnapshot: from the informer's cache
// once it synced ([WithSnapshotInformer]), else listed.
func (p *Provisioner) snapshotsToSweep(ctx context.Context) ([]*snapv1.VolumeSnapshot, error) {
	var snaps []*snapv1.VolumeSnapshot
	if inf := p.cfg.snapshotInf; inf != nil && inf.HasSynced() {
		for _, obj := range inf.GetStore().List() {
			if snap, ok := obj.(*snapv1.VolumeSnapshot); ok {
				snaps = append(snaps, snap)
			}
		}
		return snaps, nil
	}
	list, err := p.cfg.snapshots.SnapshotV1().VolumeSnapshots("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	for i := range list.Items {
		snaps = append(snaps, &list.Items[i])
	}
	return snaps, nil
}

// pendingRestores returns the snapshots ("namespace/name") that a pending
// claim restores from (a claim being deleted with a create in flight stays
// pending too). One pass over the cached claims serves a whole sweep.
func (p *Provisioner) pendingRestores() (map[string]bool, error) {
	claims, err := p.claims.List(labels.Everything())
	if err != nil {
		return nil, err
	}
	pending := map[string]bool{}
	for _, c := range claims {
		if key := p.pendingRestoreOf(c); key != "" {
			pending[key] = true
		}
	}
	return pending, nil
}

// pendingRestoreOf returns the key (namespace/name) of the VolumeSnapshot
// that claim restores from while it is pending and may keep it
// (keepsSourceOf), "" otherwise.
func (p *Provisioner) pendingRestoreOf(claim *corev1.PersistentVolumeClaim) string {
	if claim.Status.Phase != corev1.ClaimPending && claim.Status.Phase != "" {
		return ""
	}
	key := p.restoreSourceOf(claim)
	if key == "" || !p.keepsSourceOf(claim) {
		return ""
	}
	return key
}

// restoreSourceOf returns the key (namespace/name) of the VolumeSnapshot
// that claim restores from, "" when its data source is not a snapshot.
func (p *Provisioner) restoreSourceOf(claim *corev1.PersistentVolumeClaim) string {
	if ref, ok := sourceRefOf(claim); !ok || ref.group != snapshotAPIGroup {
		return ""
	}
	return p.sourceKey(claim, kindVolumeSnapshot)
}
