package chaos

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kube-storage/csi-provisioner/internal/testutil"
)

const testDriver = "hostpath.csi.kube-storage.io"

// history builds synthetic watch histories; each call appends one record
// at the next revision.
type history struct {
	rev     uint64
	records []Record
}

func (h *history) claim(name, uid string, phase corev1.PersistentVolumeClaimPhase, volume string) *history {
	h.rev++
	h.records = append(h.records, Record{Revision: h.rev, Claim: &ClaimState{Namespace: "ns", Name: name, UID: types.UID(uid), Phase: phase, VolumeName: volume}})
	return h
}

func (h *history) claimDeleted(name, uid string) *history {
	h.rev++
	h.records = append(h.records, Record{Revision: h.rev, Deleted: true, Claim: &ClaimState{Namespace: "ns", Name: name, UID: types.UID(uid)}})
	return h
}

func (h *history) volume(name string, phase corev1.PersistentVolumePhase, policy corev1.PersistentVolumeReclaimPolicy, claimUID string, deleting bool) *history {
	h.rev++
	v := &VolumeState{Name: name, UID: types.UID("uid-" + name), Phase: phase, Policy: policy, Driver: testDriver, Handle: "h-" + name, Deleting: deleting}
	if claimUID != "" {
		v.ClaimNamespace, v.ClaimName, v.ClaimUID = "ns", "claim-of-"+name, types.UID(claimUID)
	}
	h.records = append(h.records, Record{Revision: h.rev, Volume: v})
	return h
}

func (h *history) volumeDeleted(name string, policy corev1.PersistentVolumeReclaimPolicy, claimUID string) *history {
	h.volume(name, corev1.VolumeReleased, policy, claimUID, true)
	h.records[len(h.records)-1].Deleted = true
	return h
}

// lifecycle is a correct history: provision, bind, delete the claim,
// release and delete the volume.
func lifecycle(h *history, claim, uid, pv string) *history {
	return h.claim(claim, uid, corev1.ClaimPending, "").
		volume(pv, corev1.VolumePending, corev1.PersistentVolumeReclaimDelete, uid, false).
		volume(pv, corev1.VolumeBound, corev1.PersistentVolumeReclaimDelete, uid, false).
		claim(claim, uid, corev1.ClaimBound, pv).
		claimDeleted(claim, uid).
		volume(pv, corev1.VolumeReleased, corev1.PersistentVolumeReclaimDelete, uid, false).
		volume(pv, corev1.VolumeReleased, corev1.PersistentVolumeReclaimDelete, uid, true).
		volumeDeleted(pv, corev1.PersistentVolumeReclaimDelete, uid)
}

func TestCheckHistory(t *testing.T) {
	for _, tc := range []struct {
		name    string
		history *history
		want    []string // "invariant: object" prefixes, sorted
	}{
		{
			name:    "a correct lifecycle",
			history: lifecycle(&history{}, "a", "u1", "pv-a"),
		},
		{
			name: "two correct lifecycles, interleaved rebinding of a name",
			history: lifecycle(lifecycle(&history{}, "a", "u1", "pv-a"), "a", "u2", "pv-a2").
				claim("b", "u3", corev1.ClaimBound, "pv-b"),
		},
		{
			name: "a Retain volume released and kept",
			history: (&history{}).claim("a", "u1", corev1.ClaimBound, "pv-a").
				volume("pv-a", corev1.VolumeBound, corev1.PersistentVolumeReclaimRetain, "u1", false).
				claimDeleted("a", "u1").
				volume("pv-a", corev1.VolumeReleased, corev1.PersistentVolumeReclaimRetain, "u1", false),
		},
		{
			name: "a Lost claim next to the Bound one is no double bind",
			history: (&history{}).claim("a", "u1", corev1.ClaimBound, "pv-a").
				claim("a", "u1", corev1.ClaimLost, "pv-a").
				claim("b", "u2", corev1.ClaimBound, "pv-a"),
		},
		{
			name: "released while the claim exists",
			history: (&history{}).claim("a", "u1", corev1.ClaimBound, "pv-a").
				volume("pv-a", corev1.VolumeBound, corev1.PersistentVolumeReclaimDelete, "u1", false).
				volume("pv-a", corev1.VolumeReleased, corev1.PersistentVolumeReclaimDelete, "u1", false).
				claimDeleted("a", "u1"),
			want: []string{InvNoEarlyRelease + ": pv pv-a"},
		},
		{
			name: "released while the claim is terminating",
			history: (&history{}).claim("a", "u1", corev1.ClaimBound, "pv-a").
				volume("pv-a", corev1.VolumeBound, corev1.PersistentVolumeReclaimDelete, "u1", false).
				claimTerminating("a", "u1", "pv-a").
				volume("pv-a", corev1.VolumeReleased, corev1.PersistentVolumeReclaimDelete, "u1", false),
			want: []string{InvNoEarlyRelease + ": pv pv-a"},
		},
		{
			name: "deleted while the claim exists",
			history: (&history{}).claim("a", "u1", corev1.ClaimBound, "pv-a").
				volume("pv-a", corev1.VolumeBound, corev1.PersistentVolumeReclaimDelete, "u1", false).
				volumeDeleted("pv-a", corev1.PersistentVolumeReclaimDelete, "u1"),
			want: []string{InvNoEarlyDelete + ": pv pv-a"},
		},
		{
			name: "a Retain volume deleted after its claim",
			history: (&history{}).claim("a", "u1", corev1.ClaimBound, "pv-a").
				volume("pv-a", corev1.VolumeBound, corev1.PersistentVolumeReclaimRetain, "u1", false).
				claimDeleted("a", "u1").
				volume("pv-a", corev1.VolumeReleased, corev1.PersistentVolumeReclaimRetain, "u1", false).
				volumeDeleted("pv-a", corev1.PersistentVolumeReclaimRetain, "u1"),
			want: []string{InvRetainKept + ": pv pv-a"},
		},
		{
			name: "a Retain volume deleted while its claim exists",
			history: (&history{}).claim("a", "u1", corev1.ClaimBound, "pv-a").
				volume("pv-a", corev1.VolumeBound, corev1.PersistentVolumeReclaimRetain, "u1", true),
			want: []string{InvNoEarlyDelete + ": pv pv-a", InvRetainKept + ": pv pv-a"},
		},
		{
			name: "two claims Bound to one volume",
			history: (&history{}).claim("a", "u1", corev1.ClaimBound, "pv-a").
				claim("b", "u2", corev1.ClaimBound, "pv-a"),
			want: []string{InvNoDoubleBind + ": pv pv-a"},
		},
		{
			name: "records out of order are sorted by revision",
			history: func() *history {
				h := (&history{}).claim("a", "u1", corev1.ClaimBound, "pv-a").
					volume("pv-a", corev1.VolumeReleased, corev1.PersistentVolumeReclaimDelete, "u1", false).
					claimDeleted("a", "u1")
				// The claim's deletion (rev 3) came before the release (rev 2)
				// in a merged stream: still a violation.
				h.records[1], h.records[2] = h.records[2], h.records[1]
				return h
			}(),
			want: []string{InvNoEarlyRelease + ": pv pv-a"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := CheckHistory(tc.history.records)
			assertViolations(t, got, tc.want)
		})
	}
}

func (h *history) claimTerminating(name, uid, volume string) *history {
	h.claim(name, uid, corev1.ClaimBound, volume)
	h.records[len(h.records)-1].Claim.Deleting = true
	return h
}

func TestCheckFinal(t *testing.T) {
	claim := func(name, uid, volume string, phase corev1.PersistentVolumeClaimPhase) corev1.PersistentVolumeClaim {
		c := testutil.NewPVC("ns", name).UID(uid).VolumeName(volume).Phase(phase).Obj()
		return *c
	}
	pv := func(name, claimName, claimUID string, policy corev1.PersistentVolumeReclaimPolicy) corev1.PersistentVolume {
		b := testutil.NewPV(name, testDriver).ReclaimPolicy(policy)
		if claimName != "" {
			b = b.ClaimRef("ns", claimName, claimUID)
		}
		v := b.Obj()
		v.Spec.CSI.VolumeHandle = "h-" + name
		return *v
	}
	good := func() ([]corev1.PersistentVolumeClaim, []corev1.PersistentVolume, []string) {
		return []corev1.PersistentVolumeClaim{claim("a", "u1", "pv-a", corev1.ClaimBound), claim("b", "u2", "pv-b", corev1.ClaimBound)},
			[]corev1.PersistentVolume{
				pv("pv-a", "a", "u1", corev1.PersistentVolumeReclaimDelete),
				pv("pv-b", "b", "u2", corev1.PersistentVolumeReclaimDelete),
				pv("pv-kept", "gone", "u0", corev1.PersistentVolumeReclaimRetain), // released, retained
			},
			[]string{"h-pv-a", "h-pv-b", "h-pv-kept"}
	}
	for _, tc := range []struct {
		name   string
		modify func(c *[]corev1.PersistentVolumeClaim, v *[]corev1.PersistentVolume, ids *[]string)
		want   []string
	}{
		{name: "converged", modify: func(*[]corev1.PersistentVolumeClaim, *[]corev1.PersistentVolume, *[]string) {}},
		{
			name: "a leaked volume",
			modify: func(_ *[]corev1.PersistentVolumeClaim, _ *[]corev1.PersistentVolume, ids *[]string) {
				*ids = append(*ids, "orphan")
			},
			want: []string{InvNoLeak + ": volume orphan"},
		},
		{
			name: "a missing volume",
			modify: func(_ *[]corev1.PersistentVolumeClaim, _ *[]corev1.PersistentVolume, ids *[]string) {
				*ids = slices.DeleteFunc(*ids, func(s string) bool { return s == "h-pv-b" })
			},
			want: []string{InvNoMissing + ": pv pv-b"},
		},
		{
			name: "a double bind",
			modify: func(c *[]corev1.PersistentVolumeClaim, _ *[]corev1.PersistentVolume, _ *[]string) {
				(*c)[1].Spec.VolumeName = "pv-a"
			},
			want: []string{InvClaimBound + ": pvc ns/b (uid u2)", InvNoDoubleBind + ": pv pv-a"},
		},
		{
			name: "a Pending claim",
			modify: func(c *[]corev1.PersistentVolumeClaim, _ *[]corev1.PersistentVolume, _ *[]string) {
				(*c)[0].Status.Phase = corev1.ClaimPending
			},
			want: []string{InvClaimBound + ": pvc ns/a (uid u1)"},
		},
		{
			name: "a claimRef with another UID",
			modify: func(_ *[]corev1.PersistentVolumeClaim, v *[]corev1.PersistentVolume, _ *[]string) {
				(*v)[0].Spec.ClaimRef.UID = "u9"
			},
			want: []string{InvClaimBound + ": pvc ns/a (uid u1)"},
		},
		{
			name: "a claim with two PVs pointing to it",
			modify: func(_ *[]corev1.PersistentVolumeClaim, v *[]corev1.PersistentVolume, ids *[]string) {
				*v = append(*v, pv("pv-a2", "a", "u1", corev1.PersistentVolumeReclaimDelete))
				*ids = append(*ids, "h-pv-a2")
			},
			want: []string{InvClaimBound + ": pvc ns/a (uid u1)"},
		},
		{
			name: "a Terminating claim",
			modify: func(c *[]corev1.PersistentVolumeClaim, _ *[]corev1.PersistentVolume, _ *[]string) {
				now := metav1.Now()
				(*c)[0].DeletionTimestamp = &now
				(*c)[0].Status.Phase = corev1.ClaimLost
			},
			want: []string{InvClaimBound + ": pvc ns/a (uid u1)"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, v, ids := good()
			tc.modify(&c, &v, &ids)
			assertViolations(t, CheckFinal(c, v, testDriver, ids), tc.want)
		})
	}
}

func assertViolations(t *testing.T, got []Violation, want []string) {
	t.Helper()
	var keys []string
	for _, v := range got {
		keys = append(keys, v.Invariant+": "+v.Object)
	}
	slices.Sort(keys)
	if !slices.Equal(keys, want) {
		var lines []string
		for _, v := range got {
			lines = append(lines, v.String())
		}
		t.Errorf("violations:\n  %s\nwant %v", strings.Join(lines, "\n  "), want)
	}
}

// TestUnsettled: a run has not converged while a Delete PV outlives its
// claim or a deleted claim is still there, Bound or not (CheckFinal accepts
// a Bound one being deleted).
func TestUnsettled(t *testing.T) {
	claim := func(name, uid string, deleting bool) corev1.PersistentVolumeClaim {
		c := testutil.NewPVC("ns", name).UID(uid).VolumeName("pv-" + name).Phase(corev1.ClaimBound).Obj()
		if deleting {
			now := metav1.Now()
			c.DeletionTimestamp = &now
		}
		return *c
	}
	pv := func(name, claimName, claimUID string, policy corev1.PersistentVolumeReclaimPolicy) corev1.PersistentVolume {
		v := testutil.NewPV(name, testDriver).ReclaimPolicy(policy).ClaimRef("ns", claimName, claimUID).Obj()
		v.Spec.CSI.VolumeHandle = "h-" + name
		return *v
	}
	for _, tc := range []struct {
		name                          string
		claims                        []corev1.PersistentVolumeClaim
		pvs                           []corev1.PersistentVolume
		wantUnreclaimed, wantDeleting int
	}{
		{
			name:   "converged",
			claims: []corev1.PersistentVolumeClaim{claim("a", "u1", false)},
			pvs: []corev1.PersistentVolume{
				pv("pv-a", "a", "u1", corev1.PersistentVolumeReclaimDelete),
				pv("pv-kept", "gone", "u0", corev1.PersistentVolumeReclaimRetain),
			},
		},
		{
			name:            "a Delete PV whose claim is gone",
			pvs:             []corev1.PersistentVolume{pv("pv-a", "a", "u1", corev1.PersistentVolumeReclaimDelete)},
			wantUnreclaimed: 1,
		},
		{
			name:         "a deleted claim still Bound",
			claims:       []corev1.PersistentVolumeClaim{claim("a", "u1", true)},
			pvs:          []corev1.PersistentVolume{pv("pv-a", "a", "u1", corev1.PersistentVolumeReclaimDelete)},
			wantDeleting: 1,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ids []string
			for _, v := range tc.pvs {
				ids = append(ids, v.Spec.CSI.VolumeHandle)
			}
			if vs := CheckFinal(tc.claims, tc.pvs, testDriver, ids); tc.wantDeleting > 0 && len(vs) > 0 {
				t.Fatalf("CheckFinal already reports %v", vs)
			}
			unreclaimed, deleting := unsettled(tc.claims, tc.pvs)
			if len(unreclaimed) != tc.wantUnreclaimed || len(deleting) != tc.wantDeleting {
				t.Errorf("unsettled = %v, %v; want %d unreclaimed, %d deleting", unreclaimed, deleting, tc.wantUnreclaimed, tc.wantDeleting)
			}
		})
	}
}
