package provisioner

import (
	"context"
	"fmt"
	"hash/maphash"
	"slices"
	"sync"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	"sigs.k8s.io/sig-storage-lib-external-provisioner/v13/controller"
)

// pendingHandleTTL is how long a volume recorded by this process is
// remembered by handle if the informer never shows its PV (the library
// gave up saving it, or deleted the volume through a path that did not
// reach Delete): longer than the informer takes to see a PV the library
// saves (its queue retries a failed save within seconds while the API
// server is up).
const pendingHandleTTL = 5 * time.Minute

// handleRecords guards against a driver that answers CreateVolume with the
// ID of a volume another PV already records: two PVs of one volume would
// give two claims the same data, and deleting either would delete the
// other's.
//
// It costs next to nothing per volume, because the check runs for every
// volume and almost never finds anything: an informer index by handle
// would keep a set of about 250 bytes per PV (see internal/volindex).
// Instead, counts holds, per hash of a handle, how many PVs of this
// driver in the informer record it; only a count that the PV being
// checked does not explain by itself makes a lookup walk the informer's
// PVs. pending holds the volumes this process recorded whose PV the
// informer has not shown yet, by handle, until it does.
type handleRecords struct {
	clock clock.Clock
	seed  maphash.Seed

	mu        sync.Mutex
	counts    map[uint64]int32
	pending   map[string]pendingHandle
	lastSweep time.Time
}

// pendingHandle is a volume this process recorded for PV pv at time at.
type pendingHandle struct {
	pv string
	at time.Time
}

func newHandleRecords(clk clock.Clock) *handleRecords {
	return &handleRecords{
		clock: clk, seed: maphash.MakeSeed(), counts: map[uint64]int32{}, pending: map[string]pendingHandle{},
		lastSweep: clk.Now(),
	}
}

// trackHandles keeps the counts of p.handles up to date with the volume
// informer. The registration's HasSynced is added to p.hasSynced.
func (p *Provisioner) trackHandles() error {
	reg, err := p.volumeInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) { p.countHandle(obj, 1) },
		UpdateFunc: func(old, cur any) {
			// The volume source of a PV is immutable; a handle changes
			// only with a delete and re-create under the same name.
			if handle := p.driverHandle(cur); p.driverHandle(old) != handle {
				p.countHandle(old, -1)
				p.countHandle(cur, 1)
			} else if handle != "" {
				p.handles.seen(handle, cur.(*corev1.PersistentVolume).Name)
			}
		},
		DeleteFunc: func(obj any) {
			if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = tomb.Obj
			}
			p.countHandle(obj, -1)
		},
	})
	if err != nil {
		return fmt.Errorf("track volume handles: %w", err)
	}
	p.hasSynced = append(p.hasSynced, reg.HasSynced)
	return nil
}

// driverHandle is the volume handle of obj, a PV of this driver, or "".
// With --migrated-in-tree an in-tree PV of the migrated plugin records a
// volume of this driver too: its handle is the one Delete would send.
func (p *Provisioner) driverHandle(obj any) string {
	pv, ok := obj.(*corev1.PersistentVolume)
	if !ok {
		return ""
	}
	source, err := p.csiVolume(klog.Background(), pv)
	if err != nil || source == nil {
		return ""
	}
	return source.VolumeHandle
}

// countHandle adds delta to the count of obj's handle, if it is a PV of
// this driver, and drops the pending record its appearance settles.
func (p *Provisioner) countHandle(obj any, delta int32) {
	handle := p.driverHandle(obj)
	if handle == "" {
		return
	}
	r := p.handles
	key := maphash.String(r.seed, handle)
	r.mu.Lock()
	defer r.mu.Unlock()
	if n := r.counts[key] + delta; n > 0 {
		r.counts[key] = n
	} else {
		delete(r.counts, key)
	}
	if delta > 0 {
		r.seenLocked(handle, obj.(*corev1.PersistentVolume).Name)
	}
}

// seen drops the pending record of handle once the informer shows the PV
// pvName it was recorded for.
func (r *handleRecords) seen(handle, pvName string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seenLocked(handle, pvName)
}

func (r *handleRecords) seenLocked(handle, pvName string) {
	if rec, ok := r.pending[handle]; ok && rec.pv == pvName {
		delete(r.pending, handle)
	}
}

// claimHandle records that the PV named pvName records the volume
// handle, unless another PV already records it (see handleHolder); then it
// returns that PV's name and records nothing. Calls are serialized, so two
// claims answered with one ID at the same time cannot both pass.
func (p *Provisioner) claimHandle(handle, pvName string) string {
	r := p.handles
	r.mu.Lock()
	defer r.mu.Unlock()
	if other := p.handleHolderLocked(handle, pvName, nil); other != "" {
		return other
	}
	now := r.clock.Now()
	r.pending[handle] = pendingHandle{pv: pvName, at: now}
	if now.Sub(r.lastSweep) >= pendingHandleTTL {
		r.lastSweep = now
		for k, rec := range r.pending {
			if now.Sub(rec.at) >= pendingHandleTTL {
				delete(r.pending, k)
			}
		}
	}
	return ""
}

// handleHolder returns the name of a PV other than pvName that records the
// volume handle: one of this driver in the informer, or one this process
// recorded and the informer may not have yet. "" when there is none. A PV
// in the informer for which ignore returns true does not count (nil:
// every PV counts).
func (p *Provisioner) handleHolder(handle, pvName string, ignore func(*corev1.PersistentVolume) bool) string {
	p.handles.mu.Lock()
	defer p.handles.mu.Unlock()
	return p.handleHolderLocked(handle, pvName, ignore)
}

func (p *Provisioner) handleHolderLocked(handle, pvName string, ignore func(*corev1.PersistentVolume) bool) string {
	r := p.handles
	if rec, ok := r.pending[handle]; ok && rec.pv != pvName && r.clock.Since(rec.at) < pendingHandleTTL {
		return rec.pv
	}
	n := r.counts[maphash.String(r.seed, handle)]
	if n == 0 || (n == 1 && p.driverHandle(p.cachedVolume(pvName)) == handle) {
		return "" // nobody, or only pvName itself
	}
	// Another PV of this driver records the handle, or one with the same
	// hash: look.
	var names []string
	for _, obj := range p.volumeInf.GetStore().List() {
		if p.driverHandle(obj) == handle {
			if pv := obj.(*corev1.PersistentVolume); pv.Name != pvName && (ignore == nil || !ignore(pv)) {
				names = append(names, pv.Name)
			}
		}
	}
	if len(names) == 0 {
		return ""
	}
	return slices.Min(names)
}

// cachedVolume is the PV named name in the informer, or nil.
func (p *Provisioner) cachedVolume(name string) any {
	obj, exists, err := p.volumeInf.GetStore().GetByKey(name)
	if err != nil || !exists {
		return nil
	}
	return obj
}

// forgetHandle drops the record of handle once its volume is deleted: a
// driver may give the ID to a new volume later.
func (p *Provisioner) forgetHandle(handle, pvName string) {
	r := p.handles
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seenLocked(handle, pvName)
}

// duplicateHandleError is the error of a CreateVolume answer whose volume
// ID PV other already records.
func (p *Provisioner) duplicateHandleError(handle, volumeName, other string) error {
	return fmt.Errorf("CSI driver %s returned volume ID %q for volume %s, but PersistentVolume %s already records that volume: "+
		"two claims would share one volume, and deleting either would delete the other's data. "+
		"The volume is neither recorded nor deleted, and CreateVolume is retried; "+
		"the driver must return a distinct volume for each name", p.name, handle, volumeName, other)
}

// duplicateHandle is recordVolume's answer to a volume whose ID the PV
// other already records. The volume is not recorded, and not deleted: it
// is other's. The state is ProvisioningInBackground, so the claim keeps
// its in-flight finalizer (the driver may also have created a volume of
// this name that it did not report) and the library retries the same
// request with backoff, posting the error as a Warning ProvisioningFailed
// each time, until the driver answers with a volume of its own.
func (p *Provisioner) duplicateHandle(ctx context.Context, pl *plan, vol *csi.Volume, other string) (*corev1.PersistentVolume, controller.ProvisioningState, error) {
	err := p.duplicateHandleError(vol.GetVolumeId(), pl.req.GetName(), other)
	klog.FromContext(ctx).Error(err, "CSI driver returned the volume of another PV", "volumeID", vol.GetVolumeId(), "pv", klog.KRef("", other))
	return nil, controller.ProvisioningInBackground, err
}
