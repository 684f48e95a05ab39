package provisioner

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/container-storage-interface/spec/lib/go/csi"
	snapv1 "github.com/kubernetes-csi/external-snapshotter/client/v8/apis/volumesnapshot/v1"
	snapclient "github.com/kubernetes-csi/external-snapshotter/client/v8/clientset/versioned"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/kube-storage/csi-provisioner/internal/cachetrim"
)

// Restoring from a VolumeSnapshot, as upstream: a claim whose data source
// is a VolumeSnapshot (API group snapshot.storage.k8s.io) of its namespace
// is provisioned with CreateVolume's content source naming the snapshot's
// handle, when the driver reports CREATE_DELETE_SNAPSHOT and the snapshot,
// read from the API server, is bound to a VolumeSnapshotContent of the
// class's driver that points back to it, ready to use, with a snapshot
// handle and a restore size no larger than the claim's request. With
// volume-mode conversion prevented (the default), a content whose source
// volume mode differs from the claim's needs the allow-volume-mode-change
// annotation. Before the first CreateVolume the snapshot gets
// SnapshotFinalizer (when RBAC allows it), removed once the volume exists
// or a final answer says none will, and no other pending claim may still
// be restoring from the snapshot; a snapshot being deleted is refused,
// unless it carries that finalizer (a restore already started).

// SnapshotFinalizer is upstream's finalizer on a VolumeSnapshot that a
// volume is being restored from.
const SnapshotFinalizer = "provisioner.storage.kubernetes.io/volumesnapshot-as-source-protection"

const annAllowVolumeModeChange = "snapshot.storage.kubernetes.io/allow-volume-mode-change"

// snapshotContentSource checks the snapshot (namespace, name) a claim is
// restored from and returns the content source naming its handle. Messages are upstream's.
func (p *Provisioner) snapshotContentSource(ctx context.Context, claim *corev1.PersistentVolumeClaim, class *storagev1.StorageClass, namespace, name string) (*csi.VolumeContentSource, error) {
	snaps := p.cfg.snapshots.SnapshotV1()
	snap, err := snaps.VolumeSnapshots(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("error getting snapshot %s from api server: %w", name, err)
	}
	if snap.DeletionTimestamp != nil && !slices.Contains(snap.Finalizers, SnapshotFinalizer) {
		return nil, fmt.Errorf("snapshot %s is being deleted", name)
	}
	if snap.Status == nil || snap.Status.BoundVolumeSnapshotContentName == nil {
		return nil, fmt.Errorf("snapshot %s not bound", name)
	}
	contentName := *snap.Status.BoundVolumeSnapshotContentName
	content, err := snaps.VolumeSnapshotContents().Get(ctx, contentName, metav1.GetOptions{})
	if err != nil {
		klog.FromContext(ctx).Info("Cannot read the content of a snapshot", "pvc", klog.KObj(claim), "snapshot", klog.KRef(namespace, name), "content", contentName, "err", err)
		return nil, fmt.Errorf("error getting snapshotcontent %s for snapshot %s", contentName, name)
	}
	if ref := content.Spec.VolumeSnapshotRef; ref.UID != snap.UID || ref.Namespace != snap.Namespace || ref.Name != snap.Name {
		return nil, fmt.Errorf("snapshotcontent %s for snapshot %s is bound to a different snapshot", contentName, name)
	}
	if content.Spec.Driver != class.Provisioner {
		return nil, fmt.Errorf("snapshotcontent %s for snapshot %s is not handled by CSI driver of StorageClass %s", contentName, name, class.Name)
	}
	if snap.Status.ReadyToUse == nil || !*snap.Status.ReadyToUse {
		return nil, fmt.Errorf("snapshot %s is not Ready", name)
	}
	if content.Status == nil || content.Status.SnapshotHandle == nil {
		return nil, fmt.Errorf("snapshot handle %s is not available", name)
	}
	if size := snap.Status.RestoreSize; size != nil {
		requested := claim.Spec.Resources.Requests[corev1.ResourceStorage]
		if requested.Value() < size.Value() {
			return nil, fmt.Errorf("requested volume size %d is less than the size %d for the source snapshot %s", requested.Value(), size.Value(), name)
		}
	}
	if p.cfg.preventVolumeModeConversion {
		if err := checkVolumeModeChange(claim, content.Name, content.Spec.SourceVolumeMode, content.Annotations); err != nil {
			return nil, err
		}
	}
	return &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
		Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: *content.Status.SnapshotHandle},
	}}, nil
}

// checkVolumeModeChange refuses a restore that changes the volume mode of
// the snapshot's source unless the content allows it.
func checkVolumeModeChange(claim *corev1.PersistentVolumeClaim, content string, source *corev1.PersistentVolumeMode, annotations map[string]string) error {
	if source == nil || claim.Spec.VolumeMode == nil || *source == *claim.Spec.VolumeMode {
		return nil
	}
	prefix := fmt.Sprintf("requested volume %s/%s modifies the mode of the source volume but does not have permission to do so. ", claim.Namespace, claim.Name)
	value, ok := annotations[annAllowVolumeModeChange]
	if !ok {
		return fmt.Errorf("%s%s annotation is not present on snapshotcontent %s", prefix, annAllowVolumeModeChange, content)
	}
	allowed, err := strconv.ParseBool(value)
	if err != nil {
		return fmt.Errorf("%sfailed to convert %s annotation value to boolean with error: %w", prefix, annAllowVolumeModeChange, err)
	}
	if !allowed {
		return fmt.Errorf("%s%s is set to false on snapshotcontent %s", prefix, annAllowVolumeModeChange, content)
	}
	return nil
}

// protectSnapshot adds SnapshotFinalizer to the snapshot. Without the RBAC
// to update snapshots it logs and goes on, as upstream.
func (p *Provisioner) protectSnapshot(ctx context.Context, namespace, name string) error {
	return p.editSnapshotFinalizer(ctx, namespace, name, true)
}

// releaseSnapshot removes SnapshotFinalizer from the snapshot; a snapshot
// that is gone needs nothing.
func (p *Provisioner) releaseSnapshot(ctx context.Context, namespace, name string) error {
	return p.editSnapshotFinalizer(ctx, namespace, name, false)
}

func (p *Provisioner) editSnapshotFinalizer(ctx context.Context, namespace, name string, add bool) error {
	logger := klog.FromContext(ctx).WithValues("snapshot", klog.KRef(namespace, name))
	snaps := p.cfg.snapshots.SnapshotV1().VolumeSnapshots(namespace)
	snap, err := snaps.Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err) && !add:
		return nil
	case err != nil:
		return fmt.Errorf("get snapshot %s/%s: %w", namespace, name, err)
	case slices.Contains(snap.Finalizers, SnapshotFinalizer) == add:
		return nil
	}
	clone := snap.DeepCopy()
	if add {
		clone.Finalizers = append(clone.Finalizers, SnapshotFinalizer)
	} else {
		clone.Finalizers = slices.DeleteFunc(clone.Finalizers, func(f string) bool { return f == SnapshotFinalizer })
	}
	_, err = snaps.Update(ctx, clone, metav1.UpdateOptions{FieldManager: FieldManager})
	switch {
	case err == nil:
		logger.V(3).Info("Changed the snapshot's source protection", "finalizer", SnapshotFinalizer, "added", add)
		return nil
	case add && apierrors.IsForbidden(err):
		logger.Info("Cannot protect the snapshot a volume is restored from (RBAC needs update on volumesnapshots); going on without", "err", err)
		return nil
	case !add && apierrors.IsNotFound(err):
		return nil
	}
	return fmt.Errorf("update finalizer %s of snapshot %s/%s: %w", SnapshotFinalizer, namespace, name, err)
}

// errNoSnapshotClient refuses a restore when the provisioner was built
// without a snapshot client.
var errNoSnapshotClient = errors.New("restoring from a VolumeSnapshot needs the snapshot API client, which this provisioner was not given")

// WithSnapshotClient gives the provisioner the client of the
// snapshot.storage.k8s.io API, needed to restore claims from
// VolumeSnapshots; without it such claims get a final error.
func WithSnapshotClient(c snapclient.Interface) Option {
	return func(cfg *config) { cfg.snapshots = c }
}

// WithSnapshotInformer gives the provisioner an informer of the
// VolumeSnapshots of every namespace (snapshot.storage.k8s.io/v1, built on
// the client of [WithSnapshotClient]; the caller runs it). A claim that
// waits for its snapshot to exist or be ready goes back to the provisioning
// library as soon as it is (see requeue.go), and the orphan sweep reads the
// informer's cache, once synced, instead of listing every snapshot. Without
// it such a claim waits for the library's next retry. Restores themselves
// always read the snapshot and its content from the API server.
func WithSnapshotInformer(inf cache.SharedIndexInformer) Option {
	return func(cfg *config) { cfg.snapshotInf = inf }
}

// NewSnapshotInformer returns an informer of the VolumeSnapshots of every
// namespace, through snaps, for [WithSnapshotInformer]; the cache keeps no
// managedFields (cachetrim). The caller runs it. It is not external-
// snapshotter's generated informer: in client/v8 v8.6.0 that one lists and
// watches without the caller's context and without asking the client
// whether it supports streaming lists, so it never syncs on a fake
// clientset.
func NewSnapshotInformer(snaps snapclient.Interface) cache.SharedIndexInformer {
	c := snaps.SnapshotV1().VolumeSnapshots(metav1.NamespaceAll)
	lw := cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			return c.List(ctx, opts)
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			return c.Watch(ctx, opts)
		},
	}, snaps)
	inf := cache.NewSharedIndexInformer(lw, &snapv1.VolumeSnapshot{}, 0, cache.Indexers{})
	_ = inf.SetTransform(cachetrim.New().Transform) // cannot fail: the informer has not started
	return inf
}

// WithPreventVolumeModeConversion refuses restores that change the source
// volume's mode without the content's permission
// (--prevent-volume-mode-conversion, default true).
func WithPreventVolumeModeConversion(on bool) Option {
	return func(cfg *config) { cfg.preventVolumeModeConversion = on }
}
