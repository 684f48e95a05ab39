package binder

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"

	"github.com/kube-storage/csi-provisioner/internal/expiring"
)

// goneClaimTTL is how long a claim is remembered as gone. Past it, the
// next look-up walks through the cached claims once more and records the
// claim again.
const goneClaimTTL = time.Hour

// goneClaims records the UIDs of claims that are not in the cache, for the
// volumes named after them (see WithUIDNamedVolumes).
//
// Why: such a claim has no entry in the claim-by-volume index, so
// otherClaimBoundTo can find it, when the volume's claimRef does not name
// it, only by walking through every cached claim. Without this record, a
// volume whose claim was deleted paid that walk at each sync (every
// deletion with policy Delete, while thousands of claims are cached) and
// each Released volume with policy Retain at every resync. A claim is
// recorded when the binder sees its deletion or when a walk does not find
// it, and forgotten when a claim with its UID is added to the cache (an
// informer that lagged).
//
// Contract: a claim the cache holds is never recorded for longer than its
// add notification takes. A walk that missed a claim the informer added
// while it ran records the UID after the notification's forget would have
// run; so walks and forgets are ordered by mu: the notification's forget
// waits for the walk's record, and undoes it.
type goneClaims struct {
	mu  sync.Mutex
	set *expiring.Set[types.UID]
}

func newGoneClaims(clk clock.Clock) *goneClaims {
	return &goneClaims{set: expiring.NewSet[types.UID](clk, goneClaimTTL)}
}

// Has reports whether the claim with uid is recorded as gone.
func (g *goneClaims) Has(uid types.UID) bool { return g.set.Has(uid) }

// Deleted records the claim with uid, whose deletion the binder saw.
func (g *goneClaims) Deleted(uid types.UID) { g.set.Add(uid) }

// Added forgets the claim with uid, which the cache now holds. The
// informer calls it after adding the claim to the cache.
func (g *goneClaims) Added(uid types.UID) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.set.Delete(uid)
}

// Walk runs look, which walks through the cached claims and reports
// whether it found the claim with uid, and records the claim as gone when
// it did not.
func (g *goneClaims) Walk(uid types.UID, look func() (cached bool)) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !look() {
		g.set.Add(uid)
	}
}
