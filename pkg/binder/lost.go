package binder

import (
	"time"

	"k8s.io/apimachinery/pkg/types"
	utilcache "k8s.io/apimachinery/pkg/util/cache"
	"k8s.io/utils/clock"
)

// lostVolumeTTL is how long a deleted volume is remembered for its claim.
// The claim is queued when the volume goes, so this only has to outlast
// that sync and its retries.
const lostVolumeTTL = time.Hour

// lostVolumes remembers, by name, the volumes in scope that were deleted
// while they named a claim, with that claim's UID.
//
// Why: a claim whose class is not this driver's (class "" bound to one of
// the driver's static volumes, which the binder binds) is in scope only
// through its volume. Once the volume is gone, nothing in the caches says
// that it was this driver's, so without this record the claim would stay
// Bound to a volume that no longer exists, with no event, while
// kube-controller-manager's binder (off for this driver) would have marked
// it Lost. A restart forgets the record; such a claim then stays as it is.
// It is safe for concurrent use.
type lostVolumes struct {
	names *utilcache.Expiring
}

func newLostVolumes(clk clock.Clock) *lostVolumes {
	return &lostVolumes{names: utilcache.NewExpiringWithClock(clk)}
}

// add records that volume name, which named the claim with uid, was
// deleted.
func (l *lostVolumes) add(name string, uid types.UID) { l.names.Set(name, uid, lostVolumeTTL) }

// boundTo reports whether volume name was deleted while it named the claim
// with uid.
func (l *lostVolumes) boundTo(name string, uid types.UID) bool {
	v, ok := l.names.Get(name)
	return ok && v.(types.UID) == uid
}
