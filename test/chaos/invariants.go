package chaos

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kube-storage/csi-provisioner/pkg/inflight"
)

// The invariants, by the name a violation carries.
const (
	// InvClaimBound: every claim that still exists is Bound to exactly one
	// volume, and that volume's claimRef points back with the claim's UID.
	InvClaimBound = "claim-bound-to-one-volume"
	// InvNoDoubleBind: no volume is the volume of two Bound claims.
	InvNoDoubleBind = "no-volume-bound-twice"
	// InvNoLeak: every driver volume is the handle of an existing PV.
	InvNoLeak = "no-leaked-volume"
	// InvNoMissing: every PV of the driver has its volume in the driver.
	InvNoMissing = "no-missing-volume"
	// InvNoEarlyRelease: no PV becomes Released while the claim its
	// claimRef names (same UID) exists.
	InvNoEarlyRelease = "no-release-while-claim-exists"
	// InvNoEarlyDelete: no PV is deleted while the claim its claimRef names
	// (same UID) exists.
	InvNoEarlyDelete = "no-delete-while-claim-exists"
	// InvRetainKept: no PV with reclaim policy Retain is ever deleted.
	InvRetainKept = "retain-volume-never-deleted"
)

// ClaimState is what the checker needs of one observed PersistentVolumeClaim.
type ClaimState struct {
	Namespace, Name string
	UID             types.UID
	Phase           corev1.PersistentVolumeClaimPhase
	VolumeName      string
	// Deleting: the claim has a deletionTimestamp.
	Deleting bool
	// InFlight: the claim carries the in-flight finalizer (a CreateVolume
	// may be running for it).
	InFlight bool
}

// VolumeState is what the checker needs of one observed PersistentVolume.
type VolumeState struct {
	Name   string
	UID    types.UID
	Phase  corev1.PersistentVolumePhase
	Policy corev1.PersistentVolumeReclaimPolicy
	// ClaimNamespace, ClaimName and ClaimUID are the claimRef ("" without).
	ClaimNamespace, ClaimName string
	ClaimUID                  types.UID
	// Driver and Handle are spec.csi's ("" for a non-CSI volume).
	Driver, Handle string
	// Deleting: the volume has a deletionTimestamp.
	Deleting bool
}

// Record is one state of a claim or a volume, as a watch reported it.
// Exactly one of Claim and Volume is set.
type Record struct {
	// Revision orders the records of both kinds: the object's
	// resourceVersion, which kube-apiserver takes from etcd's revision,
	// global across resources. (Clients must treat resourceVersions as
	// opaque; this test relies on the etcd implementation on purpose.)
	Revision uint64
	// Deleted: the object is gone (a DELETED watch event, or absent from a
	// list after a gap in the watch).
	Deleted bool
	Claim   *ClaimState
	Volume  *VolumeState
}

// Violation is a broken invariant and the objects it names.
type Violation struct {
	Invariant string
	// Object names the offending object ("pvc ns/name (uid)", "pv name",
	// "volume id").
	Object string
	Detail string
}

func (v Violation) String() string {
	return fmt.Sprintf("%s: %s: %s", v.Invariant, v.Object, v.Detail)
}

// ClaimOf extracts a claim's state.
func ClaimOf(c *corev1.PersistentVolumeClaim) *ClaimState {
	return &ClaimState{
		Namespace: c.Namespace, Name: c.Name, UID: c.UID,
		Phase: c.Status.Phase, VolumeName: c.Spec.VolumeName,
		Deleting: c.DeletionTimestamp != nil, InFlight: inflight.Has(c),
	}
}

// VolumeOf extracts a volume's state.
func VolumeOf(pv *corev1.PersistentVolume) *VolumeState {
	s := &VolumeState{
		Name: pv.Name, UID: pv.UID, Phase: pv.Status.Phase,
		Policy: pv.Spec.PersistentVolumeReclaimPolicy, Deleting: pv.DeletionTimestamp != nil,
	}
	if ref := pv.Spec.ClaimRef; ref != nil {
		s.ClaimNamespace, s.ClaimName, s.ClaimUID = ref.Namespace, ref.Name, ref.UID
	}
	if pv.Spec.CSI != nil {
		s.Driver, s.Handle = pv.Spec.CSI.Driver, pv.Spec.CSI.VolumeHandle
	}
	return s
}

// ParseRevision parses a resourceVersion as an etcd revision.
func ParseRevision(rv string) (uint64, error) {
	return strconv.ParseUint(rv, 10, 64)
}

func claimName(c *ClaimState) string {
	return fmt.Sprintf("pvc %s/%s (uid %s)", c.Namespace, c.Name, c.UID)
}

// violations collects violations, each (invariant, object) once.
type violations struct {
	seen map[string]bool
	list []Violation
}

func (vs *violations) add(inv, obj, format string, args ...any) {
	if vs.seen == nil {
		vs.seen = map[string]bool{}
	}
	if key := inv + "\x00" + obj; !vs.seen[key] {
		vs.seen[key] = true
		vs.list = append(vs.list, Violation{Invariant: inv, Object: obj, Detail: fmt.Sprintf(format, args...)})
	}
}

// CheckHistory replays records in revision order and returns the
// violations of the history invariants: InvNoEarlyRelease, InvNoEarlyDelete,
// InvRetainKept and InvNoDoubleBind (two claims Bound to one volume at the
// same time). A claim "exists" from its first record until its deletion
// record, Terminating included: a claim being deleted still holds its data
// until it is gone. records is not modified.
func CheckHistory(records []Record) []Violation {
	sorted := slices.Clone(records)
	slices.SortStableFunc(sorted, func(a, b Record) int { return cmp.Compare(a.Revision, b.Revision) })

	var vs violations
	claims := map[types.UID]*ClaimState{}      // existing claims
	boundTo := map[string]map[types.UID]bool{} // volume name -> UIDs of claims Bound to it
	volumes := map[string]*VolumeState{}       // existing volumes, by name
	for _, r := range sorted {
		switch {
		case r.Claim != nil:
			c := r.Claim
			if old := claims[c.UID]; old != nil && old.VolumeName != "" {
				delete(boundTo[old.VolumeName], c.UID)
			}
			if r.Deleted {
				delete(claims, c.UID)
				continue
			}
			claims[c.UID] = c
			if c.Phase != corev1.ClaimBound || c.VolumeName == "" {
				continue
			}
			if boundTo[c.VolumeName] == nil {
				boundTo[c.VolumeName] = map[types.UID]bool{}
			}
			boundTo[c.VolumeName][c.UID] = true
			if len(boundTo[c.VolumeName]) > 1 {
				var names []string
				for uid := range boundTo[c.VolumeName] {
					names = append(names, claimName(claims[uid]))
				}
				slices.Sort(names)
				vs.add(InvNoDoubleBind, "pv "+c.VolumeName, "Bound to %d claims at revision %d: %v", len(names), r.Revision, names)
			}
		case r.Volume != nil:
			v := r.Volume
			prev := volumes[v.Name]
			if prev != nil && prev.UID != v.UID {
				prev = nil // a new volume of the same name
			}
			owner := claims[v.ClaimUID]
			if v.ClaimUID == "" {
				owner = nil
			}
			if !r.Deleted && v.Phase == corev1.VolumeReleased && (prev == nil || prev.Phase != corev1.VolumeReleased) && owner != nil {
				vs.add(InvNoEarlyRelease, "pv "+v.Name, "became Released at revision %d while its claim %s existed (phase %s, deleting %v)",
					r.Revision, claimName(owner), owner.Phase, owner.Deleting)
			}
			if (r.Deleted || v.Deleting) && (prev == nil || !prev.Deleting) {
				what := "deleted"
				if !r.Deleted {
					what = "marked for deletion"
				}
				if owner != nil {
					vs.add(InvNoEarlyDelete, "pv "+v.Name, "%s at revision %d while its claim %s existed (phase %s, deleting %v)",
						what, r.Revision, claimName(owner), owner.Phase, owner.Deleting)
				}
				if v.Policy == corev1.PersistentVolumeReclaimRetain {
					vs.add(InvRetainKept, "pv "+v.Name, "reclaim policy Retain, %s at revision %d (handle %q)", what, r.Revision, v.Handle)
				}
			}
			if r.Deleted {
				delete(volumes, v.Name)
			} else {
				volumes[v.Name] = v
			}
		}
	}
	return vs.list
}

// CheckFinal checks the state after convergence: claims are every claim the
// run created that still exists, volumes every PV, driverVolumeIDs what the
// driver's ListVolumes returns. It returns the violations of InvClaimBound,
// InvNoDoubleBind, InvNoLeak and InvNoMissing (for the PVs of driver).
func CheckFinal(claims []corev1.PersistentVolumeClaim, volumes []corev1.PersistentVolume, driver string, driverVolumeIDs []string) []Violation {
	var vs violations
	pvByName := map[string]*corev1.PersistentVolume{}
	pvsOfClaim := map[types.UID][]string{}
	handles := map[string]string{} // handle -> PV name
	for i := range volumes {
		pv := &volumes[i]
		pvByName[pv.Name] = pv
		if ref := pv.Spec.ClaimRef; ref != nil && ref.UID != "" {
			pvsOfClaim[ref.UID] = append(pvsOfClaim[ref.UID], pv.Name)
		}
		if pv.Spec.CSI != nil && pv.Spec.CSI.Driver == driver {
			handles[pv.Spec.CSI.VolumeHandle] = pv.Name
		}
	}
	claimsOfPV := map[string][]string{}
	for i := range claims {
		c := &claims[i]
		name := claimName(ClaimOf(c))
		if c.Spec.VolumeName != "" {
			claimsOfPV[c.Spec.VolumeName] = append(claimsOfPV[c.Spec.VolumeName], name)
		}
		switch pv := pvByName[c.Spec.VolumeName]; {
		case c.Status.Phase != corev1.ClaimBound:
			vs.add(InvClaimBound, name, "phase %q, want Bound (volumeName %q, deleting %v)", c.Status.Phase, c.Spec.VolumeName, c.DeletionTimestamp != nil)
		case c.Spec.VolumeName == "":
			vs.add(InvClaimBound, name, "Bound without spec.volumeName")
		case pv == nil:
			vs.add(InvClaimBound, name, "Bound to pv %s, which does not exist", c.Spec.VolumeName)
		case pv.Spec.ClaimRef == nil:
			vs.add(InvClaimBound, name, "Bound to pv %s, whose claimRef is empty", pv.Name)
		case pv.Spec.ClaimRef.UID != c.UID || pv.Spec.ClaimRef.Name != c.Name || pv.Spec.ClaimRef.Namespace != c.Namespace:
			ref := pv.Spec.ClaimRef
			vs.add(InvClaimBound, name, "Bound to pv %s, whose claimRef points to %s/%s (uid %s)", pv.Name, ref.Namespace, ref.Name, ref.UID)
		}
		if pvs := pvsOfClaim[c.UID]; len(pvs) > 1 {
			slices.Sort(pvs)
			vs.add(InvClaimBound, name, "%d PVs point to it: %v", len(pvs), pvs)
		}
	}
	for pv, names := range claimsOfPV {
		if len(names) > 1 {
			slices.Sort(names)
			vs.add(InvNoDoubleBind, "pv "+pv, "the volume of %d claims: %v", len(names), names)
		}
	}
	inDriver := map[string]bool{}
	for _, id := range driverVolumeIDs {
		inDriver[id] = true
		if _, ok := handles[id]; !ok {
			vs.add(InvNoLeak, "volume "+id, "in the driver, but no PV has this handle")
		}
	}
	for h, pv := range handles {
		if !inDriver[h] {
			vs.add(InvNoMissing, "pv "+pv, "its volume %s is not in the driver", h)
		}
	}
	slices.SortFunc(vs.list, func(a, b Violation) int {
		return cmp.Or(cmp.Compare(a.Invariant, b.Invariant), cmp.Compare(a.Object, b.Object))
	})
	return vs.list
}
