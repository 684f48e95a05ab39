package provisioner

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	utilcache "k8s.io/apimachinery/pkg/util/cache"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	"sigs.k8s.io/sig-storage-lib-external-provisioner/v13/controller"
)

// indexVolumeByHandle indexes the CSI PVs of this driver by volume handle.
const indexVolumeByHandle = "csi-provisioner.provisioner/volume-handle"

// recentHandleTTL is how long a volume recorded by this process is
// remembered by handle: longer than the informer takes to see the PV the
// library saves (the library's queue retries a failed save within
// seconds while the API server is up).
const recentHandleTTL = 5 * time.Minute

// volumeByHandle is the index function of indexVolumeByHandle.
func (p *Provisioner) volumeByHandle(obj any) ([]string, error) {
	pv, ok := obj.(*corev1.PersistentVolume)
	if !ok || pv.Spec.CSI == nil || pv.Spec.CSI.Driver != p.name || pv.Spec.CSI.VolumeHandle == "" {
		return nil, nil
	}
	return []string{pv.Spec.CSI.VolumeHandle}, nil
}

// handleRecords guards against a driver that answers CreateVolume with the
// ID of a volume another PV already records: two PVs of one volume would
// give two claims the same data, and deleting either would delete the
// other's. It knows the PVs in the informer (by index) and the volumes
// this process recorded whose PV the informer may not have yet.
type handleRecords struct {
	mu     sync.Mutex
	recent *utilcache.Expiring // handle → name of the PV recorded for it
}

func newHandleRecords(clk clock.Clock) *handleRecords {
	return &handleRecords{recent: utilcache.NewExpiringWithClock(clk)}
}

// claimHandle records that the PV named pvName records the volume
// handle, unless another PV already records it (see handleHolder); then it
// returns that PV's name and records nothing. Calls are serialized, so two
// claims answered with one ID at the same time cannot both pass.
func (p *Provisioner) claimHandle(handle, pvName string) string {
	p.handles.mu.Lock()
	defer p.handles.mu.Unlock()
	if other := p.handleHolderLocked(handle, pvName); other != "" {
		return other
	}
	p.handles.recent.Set(handle, pvName, recentHandleTTL)
	return ""
}

// handleHolder returns the name of a PV other than pvName that records the
// volume handle: one of this driver in the informer, or one this process
// recorded and the informer may not have yet. "" when there is none.
func (p *Provisioner) handleHolder(handle, pvName string) string {
	p.handles.mu.Lock()
	defer p.handles.mu.Unlock()
	return p.handleHolderLocked(handle, pvName)
}

func (p *Provisioner) handleHolderLocked(handle, pvName string) string {
	if other := p.otherVolumeWithHandle(handle, pvName); other != "" {
		return other
	}
	if v, ok := p.handles.recent.Get(handle); ok {
		if other, _ := v.(string); other != pvName {
			return other
		}
	}
	return ""
}

// forgetHandle drops the record of handle once its volume is deleted: a
// driver may give the ID to a new volume later.
func (p *Provisioner) forgetHandle(handle, pvName string) {
	p.handles.mu.Lock()
	defer p.handles.mu.Unlock()
	if v, ok := p.handles.recent.Get(handle); ok && v == pvName {
		p.handles.recent.Delete(handle)
	}
}

// otherVolumeWithHandle returns the name of a PV of this driver, other
// than pvName, that records the volume handle ("" when none does; the
// first by name when several do).
func (p *Provisioner) otherVolumeWithHandle(handle, pvName string) string {
	objs, err := p.volumeInf.GetIndexer().ByIndex(indexVolumeByHandle, handle)
	if err != nil {
		return ""
	}
	var names []string
	for _, obj := range objs {
		if pv, ok := obj.(*corev1.PersistentVolume); ok && pv.Name != pvName {
			names = append(names, pv.Name)
		}
	}
	if len(names) == 0 {
		return ""
	}
	return slices.Min(names)
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
