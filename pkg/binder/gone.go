package binder

import (
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"

	"github.com/kube-storage/csi-provisioner/internal/expiring"
)

// goneClaimTTL is how long a claim is remembered as gone. Past it, the
// next look-up walks through the cached claims once more and records the
// claim again.
const goneClaimTTL = time.Hour

// newGoneClaims returns the record of the UIDs of claims that are not in
// the cache, for the volumes named after them (see WithUIDNamedVolumes).
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
func newGoneClaims(clk clock.Clock) *expiring.Set[types.UID] {
	return expiring.NewSet[types.UID](clk, goneClaimTTL)
}
