package provisioner

import (
	"context"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/kube-storage/csi-provisioner/internal/expiring"
	"github.com/kube-storage/csi-provisioner/pkg/inflight"
)

// libraryVolumeFinalizer is the finalizer the provisioning library puts on
// the PVs it provisions (AddFinalizer) and removes once their volume is
// deleted.
const libraryVolumeFinalizer = "external-provisioner.volume.kubernetes.io/finalizer"

// finishedTTL is how long a finished deletion is remembered. The copies
// that lag behind it come from watch events already on their way, so they
// arrive within moments; after finishedTTL a copy is treated as before,
// which is only slower (the deletion is done again; DeleteVolume is
// idempotent), never unsafe.
const finishedTTL = 2 * time.Minute

// finishedDeletions remembers, by PV UID, the PVs whose deletion the
// library finished: it removed its finalizer from the PV being deleted.
// It is safe for concurrent use.
//
// Why: the library deletes a volume (DeleteVolume, then the PV object,
// then its finalizer) and the watch events of its own writes queue the PV
// again. When the PV comes up before the event of the finalizer removal
// has reached the cache, the library's copy still shows the finalizer, and
// the library deletes the volume a second time: a second DeleteVolume, a
// second PV delete that fails with "not found" once the PV is gone
// ("Unhandled Error" in the log), and persistentvolume_delete_total or
// persistentvolume_delete_failed_total counting a deletion that did not
// happen. At 1,000 deletions at once that was 776 extra DeleteVolume calls
// and 32 failures counted (make bench). ShouldDelete keeps such copies
// from the library.
type finishedDeletions struct {
	*expiring.Set[types.UID]
}

func newFinishedDeletions(clk clock.Clock) *finishedDeletions {
	return &finishedDeletions{Set: expiring.NewSet[types.UID](clk, finishedTTL)}
}

// lagsBehind reports whether pv is a copy from before the library finished
// deleting it: the PV is being deleted and the library removed its
// finalizer, which a PV being deleted cannot get back.
func (f *finishedDeletions) lagsBehind(pv *corev1.PersistentVolume) bool {
	return pv.DeletionTimestamp != nil && slices.Contains(pv.Finalizers, libraryVolumeFinalizer) && f.Has(pv.UID)
}

// LibraryClient returns client as the provisioning library gets it: the
// same, except that
//   - its PersistentVolume patches are watched for the removal of the
//     library's finalizer from a PV being deleted (the library's last step
//     of a deletion), which ShouldDelete then knows about (see
//     finishedDeletions);
//   - its create of a PV whose volume this process deleted since (see
//     goneHandles) is not sent;
//   - its reschedule of a claim also removes the in-flight finalizer when
//     no CreateVolume for the claim is in flight (see libraryClaims);
//   - a PV create that fails is explained on its claim (see unsavedVolume).
func (p *Provisioner) LibraryClient(client kubernetes.Interface) kubernetes.Interface {
	return libraryClient{Interface: client, libraryHooks: &libraryHooks{
		unsaved:     p.unsavedVolume,
		finished:    p.finished,
		gone:        goneCheck{handles: p.goneHandles, source: p.csiVolume},
		attempts:    p.attempts,
		reschedules: p.reschedules,
	}}
}

// libraryHooks is what the wrappers of the library's clients (client,
// CoreV1, PersistentVolumes, PersistentVolumeClaims) consult; each wrapper
// shares its parent's.
type libraryHooks struct {
	unsaved     func(*corev1.PersistentVolume, error)
	finished    *finishedDeletions
	gone        goneCheck
	attempts    *ledger
	reschedules *rescheduleNotes
}

// unsavedVolume posts a Warning on the claim of pv, whose create failed
// with err. The library's queue of unsaved PVs retries the create for
// ever and only logs, so a PV the API server keeps refusing (an admission
// webhook, a policy) would leave the claim Pending (and, deleted,
// Terminating: its in-flight finalizer stays until a PV records the
// volume) without a word. The deduplicating recorder posts each error
// once.
func (p *Provisioner) unsavedVolume(pv *corev1.PersistentVolume, err error) {
	ref := pv.Spec.ClaimRef
	if ref == nil || apierrors.IsAlreadyExists(err) {
		return
	}
	claim, getErr := p.claims.PersistentVolumeClaims(ref.Namespace).Get(ref.Name)
	if getErr != nil || claim.UID != ref.UID {
		return
	}
	p.recorder.Event(claim, corev1.EventTypeWarning, reasonProvisioningFailed, fmt.Sprintf(
		"volume %s was created, but its PersistentVolume %s could not be saved (retried with backoff; the claim keeps finalizer %s until it is): %v",
		p.driverHandle(pv), pv.Name, inflight.Finalizer, err))
}

type libraryClient struct {
	kubernetes.Interface
	*libraryHooks
}

func (c libraryClient) CoreV1() typedcorev1.CoreV1Interface {
	return libraryCoreV1{CoreV1Interface: c.Interface.CoreV1(), libraryHooks: c.libraryHooks}
}

type libraryCoreV1 struct {
	typedcorev1.CoreV1Interface
	*libraryHooks
}

func (c libraryCoreV1) PersistentVolumes() typedcorev1.PersistentVolumeInterface {
	return libraryVolumes{PersistentVolumeInterface: c.CoreV1Interface.PersistentVolumes(), libraryHooks: c.libraryHooks}
}

type libraryVolumes struct {
	typedcorev1.PersistentVolumeInterface
	*libraryHooks
}

// Create creates pv, unless its volume (the CSI one, or the translated
// one of a migrated in-tree volume) is one this process deleted and no
// CreateVolume returned since (goneHandles): then it returns pv without
// sending anything, which the library takes for a saved PV. A failed
// create is passed to c.unsaved.
func (c libraryVolumes) Create(ctx context.Context, pv *corev1.PersistentVolume, opts metav1.CreateOptions) (*corev1.PersistentVolume, error) {
	logger := klog.FromContext(ctx)
	if handle, gone := c.gone.deleted(logger, pv); gone {
		var claim klog.ObjectRef
		if ref := pv.Spec.ClaimRef; ref != nil {
			claim = klog.KRef(ref.Namespace, ref.Name)
		}
		logger.V(2).Info("Not creating the persistentvolume again: its volume was deleted since the first create, whose answer was lost",
			"pv", klog.KObj(pv), "volumeID", handle, "claim", claim)
		return pv, nil
	}
	out, err := c.PersistentVolumeInterface.Create(ctx, pv, opts)
	if err != nil && c.unsaved != nil {
		c.unsaved(pv, err)
	}
	return out, err
}

// Patch patches, and records a PV being deleted that the patch left
// without the library's finalizer.
func (c libraryVolumes) Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, subresources ...string) (*corev1.PersistentVolume, error) {
	pv, err := c.PersistentVolumeInterface.Patch(ctx, name, pt, data, opts, subresources...)
	if err == nil && pv.DeletionTimestamp != nil && !slices.Contains(pv.Finalizers, libraryVolumeFinalizer) {
		c.finished.Add(pv.UID)
	}
	return pv, err
}

// goneHandles remembers the handles of the volumes whose DeleteVolume
// succeeded in this process, until a CreateVolume returns the handle
// again (a driver that derives IDs from names gives a recreated volume
// its old ID) or deletedVolumeTTL passes. It is safe for concurrent use.
//
// Why: when the answer to the library's create of a PV is lost, the PV
// exists but the library's background queue of unsaved PVs
// (NewVolumeStoreQueue, as upstream) tries to create it again, with a
// backoff that reaches minutes, and checks nothing first. Meanwhile the
// PV may be bound, its claim deleted and the volume reclaimed: the retry
// then makes a PV of a volume that no longer exists, whose claim is gone.
// It is Released at once, and its reclaim calls DeleteVolume a second
// time; a driver that answers NotFound for a volume it does not have
// would leave it Released with a Warning at every retry (see Delete).
// TestLostPVCreateNotRepeatedAfterDeletion (test/integration) made one
// in every run. A handle a CreateVolume returned since is one the driver
// has, so its PV is created as always: nothing here can leak a volume.
type goneHandles struct {
	*expiring.Set[string]
}

func newGoneHandles(clk clock.Clock) *goneHandles {
	return &goneHandles{Set: expiring.NewSet[string](clk, deletedVolumeTTL)}
}

// goneCheck looks up a PV the library creates in goneHandles by the
// handle of its volume: its CSI source, or the CSI source a migrated
// in-tree volume translates to (the handle Delete recorded).
type goneCheck struct {
	handles *goneHandles
	source  func(klog.Logger, *corev1.PersistentVolume) (*corev1.CSIPersistentVolumeSource, error)
}

// deleted returns the handle of pv's volume and whether this process
// deleted that volume and no CreateVolume returned it since. A PV whose
// volume is not this driver's, or does not translate, is not.
func (g goneCheck) deleted(logger klog.Logger, pv *corev1.PersistentVolume) (string, bool) {
	source, err := g.source(logger, pv)
	if err != nil || source == nil {
		return "", false
	}
	return source.VolumeHandle, g.handles.Has(source.VolumeHandle)
}

// deletedVolumeTTL is how long a successful DeleteVolume is remembered
// (Provisioner.deleted): longer than the library's retries of a deletion
// take while kube-apiserver is down or refuses writes (--retry-interval-max
// apart, 5 minutes by default). After it, a retry calls DeleteVolume
// again, which is only one more call (DeleteVolume is idempotent).
const deletedVolumeTTL = 30 * time.Minute

// deletedVolume is a member of the record of the volumes whose
// DeleteVolume succeeded (Provisioner.deleted), by PV UID and volume
// handle.
//
// Why: the library calls Delete, then deletes the PV object and removes
// its finalizer; when either write fails (kube-apiserver restarting, 429,
// 5xx, a lost answer) it calls Delete again at its next retry, and without
// this record every retry was one more DeleteVolume of a volume already
// gone: 7 per volume during a 15 s outage (test/integration
// TestAPIServerOutage).
type deletedVolume struct {
	uid    types.UID
	handle string
}
