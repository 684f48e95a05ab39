package binder

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	storagehelpers "k8s.io/component-helpers/storage/volume"
	"k8s.io/klog/v2"
)

// errVolumeTaken means a volume was reserved for another claim between the
// decision to bind it and the reservation. The sync is retried and then sees
// the new reservation.
var errVolumeTaken = errors.New("volume was reserved for another claim")

// accessModeOrder fixes the order of access modes in a group key.
var accessModeOrder = []corev1.PersistentVolumeAccessMode{
	corev1.ReadWriteOnce, corev1.ReadOnlyMany, corev1.ReadWriteMany, corev1.ReadWriteOncePod,
}

// findBestMatch picks the volume for claim among candidates the way the
// in-tree controller does: volumes are grouped by their set of access modes;
// only groups whose set contains every mode the claim requests are
// considered, those with the fewest modes first; within a group,
// FindMatchingVolume returns a volume pre-bound to the claim, or else the
// smallest Available one that fits (class, size, volume mode, attributes
// class, selector). With skipUnbound, volumes not pre-bound to the claim are
// never returned.
func findBestMatch(claim *corev1.PersistentVolumeClaim, candidates []*corev1.PersistentVolume, skipUnbound bool) (*corev1.PersistentVolume, error) {
	type group struct {
		modes int
		key   string
		pvs   []*corev1.PersistentVolume
	}
	groups := map[string]*group{}
	for _, pv := range candidates {
		if !storagehelpers.CheckAccessModes(claim, pv) {
			continue
		}
		key, n := accessModesKey(pv.Spec.AccessModes)
		g := groups[key]
		if g == nil {
			g = &group{modes: n, key: key}
			groups[key] = g
		}
		g.pvs = append(g.pvs, pv)
	}
	ordered := make([]*group, 0, len(groups))
	for _, g := range groups {
		ordered = append(ordered, g)
	}
	slices.SortFunc(ordered, func(x, y *group) int {
		return cmp.Or(cmp.Compare(x.modes, y.modes), strings.Compare(x.key, y.key))
	})
	for _, g := range ordered {
		pv, err := storagehelpers.FindMatchingVolume(claim, g.pvs, nil, nil, skipUnbound, true)
		if err != nil {
			return nil, fmt.Errorf("find volume for claim %s: %w", claimKey(claim), err)
		}
		if pv != nil {
			return pv, nil
		}
	}
	return nil, nil
}

// accessModesKey returns a canonical key of a set of access modes and its
// size.
func accessModesKey(modes []corev1.PersistentVolumeAccessMode) (string, int) {
	var parts []string
	for _, m := range accessModeOrder {
		if slices.Contains(modes, m) {
			parts = append(parts, string(m))
		}
	}
	for _, m := range modes { // unknown modes, for completeness
		if !slices.Contains(accessModeOrder, m) && !slices.Contains(parts, string(m)) {
			parts = append(parts, string(m))
		}
	}
	return strings.Join(parts, ","), len(parts)
}

// matchAndReserve finds the best volume for an unbound claim among
// candidates() and, when that volume is not yet reserved for the claim,
// reserves it by writing the volume's claimRef. Matching and reserving happen
// under reserveMu, so no other worker can match the same volume in between;
// the reserved copy is in the write cache before the mutex is released.
// It returns the volume to bind, already reserved for the claim, or nil.
func (b *Binder) matchAndReserve(ctx context.Context, claim *corev1.PersistentVolumeClaim,
	candidates func() []*corev1.PersistentVolume, skipUnbound bool) (*corev1.PersistentVolume, error) {
	b.reserveMu.Lock()
	defer b.reserveMu.Unlock()
	pvs := candidates()
	var pv *corev1.PersistentVolume
	for {
		var err error
		if pv, err = findBestMatch(claim, pvs, skipUnbound); err != nil || pv == nil {
			return nil, err
		}
		user := b.claimUsing(pv, claim)
		if user == nil {
			break
		}
		// Beyond upstream: a claimRef edited to this claim by name, or
		// removed, while another claim still uses the volume; taking it
		// would hand that claim's data to this one.
		klog.FromContext(ctx).V(4).Info("Not taking a volume another claim is still bound to", "pvc", klog.KObj(claim), "pv", klog.KObj(pv), "user", klog.KObj(user))
		if pv.Spec.ClaimRef != nil {
			b.recorder.Event(pv, corev1.EventTypeWarning, reasonVolumeStillInUse, fmt.Sprintf(msgVolumeStillInUse, claimRefKey(pv.Spec.ClaimRef), claimKey(user)))
		}
		pvs = slices.DeleteFunc(pvs, func(c *corev1.PersistentVolume) bool { return c.Name == pv.Name })
	}
	klog.FromContext(ctx).V(4).Info("Found a volume for the claim", "pvc", klog.KObj(claim), "pv", klog.KObj(pv))
	if storagehelpers.IsVolumeBoundToClaim(pv, claim) {
		// Already reserved for this claim (pre-bound by a user, by the
		// provisioner, or by an earlier sync); bind() finishes the job.
		return pv, nil
	}
	return b.writeReservation(ctx, pv, claim)
}

// reserve reserves pv, which the caller read without holding reserveMu, for
// claim. It checks under the mutex that the newest copy is still unreserved
// or reserved for this claim.
func (b *Binder) reserve(ctx context.Context, pv *corev1.PersistentVolume, claim *corev1.PersistentVolumeClaim) (*corev1.PersistentVolume, error) {
	b.reserveMu.Lock()
	defer b.reserveMu.Unlock()
	cur := b.getVolume(pv.Name)
	if cur == nil {
		return nil, fmt.Errorf("reserve volume %s for claim %s: volume disappeared", pv.Name, claimKey(claim))
	}
	if ref := cur.Spec.ClaimRef; ref != nil && ref.UID != claim.UID && !storagehelpers.IsVolumeBoundToClaim(cur, claim) {
		return nil, fmt.Errorf("reserve volume %s for claim %s: %w (%s)", pv.Name, claimKey(claim), errVolumeTaken, claimRefKey(ref))
	}
	return b.writeReservation(ctx, cur, claim)
}

// claimUsing returns an existing claim other than claim that is still bound
// to pv (see otherClaimBoundTo), or nil. Only a volume reserved for claim
// with its UID is claim's without a doubt.
func (b *Binder) claimUsing(pv *corev1.PersistentVolume, claim *corev1.PersistentVolumeClaim) *corev1.PersistentVolumeClaim {
	if pv.Spec.ClaimRef != nil && pv.Spec.ClaimRef.UID == claim.UID {
		return nil
	}
	return b.otherClaimBoundTo(pv, &corev1.ObjectReference{Namespace: claim.Namespace, Name: claim.Name, UID: claim.UID})
}

// writeReservation writes the volume's claimRef (with the claim's UID) and,
// unless the volume was pre-bound to the claim, bound-by-controller. The
// caller holds reserveMu.
func (b *Binder) writeReservation(ctx context.Context, pv *corev1.PersistentVolume, claim *corev1.PersistentVolumeClaim) (*corev1.PersistentVolume, error) {
	bound, dirty, err := storagehelpers.GetBindVolumeToClaim(pv, claim)
	if err != nil {
		return nil, fmt.Errorf("bind volume %s to claim %s: %w", pv.Name, claimKey(claim), err)
	}
	if !dirty {
		return pv, nil
	}
	return b.updateVolume(ctx, bound, "reserve for claim "+claimKey(claim))
}
