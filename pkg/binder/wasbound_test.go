package binder

import (
	"errors"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	k8stesting "k8s.io/client-go/testing"
)

// TestRecordBoundKeepsEarlierClaims: the volume already records a claim
// it was edited away from (now Lost); its claimRef is then moved from a
// second Bound claim too. Both must stay recorded: dropping the first
// would let the volume be released or handed out while that claim (kept
// by pvc-protection while pods use it) still mounts it.
func TestRecordBoundKeepsEarlierClaims(t *testing.T) {
	c1, pv := boundPair(claimB("c1").Class("fast").Obj(), volumeB("v1").Obj())
	c2 := claimB("c2").Class("fast").Obj()
	pv = recordBoundClaims(pv, "uid-old")
	pv.Spec.ClaimRef = &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: ns, Name: c2.Name, UID: c2.UID}
	f := newFixture(t, objs(classFast(), c1, c2, pv))
	f.loadInformers()
	if _, err := f.runSync("pvc/c1"); err != nil {
		t.Fatal(err)
	}
	got := f.volume("v1")
	for _, uid := range []string{"uid-old", "uid-c1"} {
		if !recordedBound(got, typesUID(uid)) {
			t.Errorf("%s = %q: %s not recorded", AnnBoundClaims, got.Annotations[AnnBoundClaims], uid)
		}
	}
	if p := f.claim("c1").Status.Phase; p != corev1.ClaimLost {
		t.Errorf("c1 phase %q, want Lost (Misbound)", p)
	}
}

func typesUID(s string) types.UID { return types.UID(s) }

// TestRecordBoundFailureKeepsClaimBound: the claimRef of c1's volume was
// moved to c2. If recording c1 on the volume fails, c1 must not be marked
// Lost (Misbound) yet: a Lost claim that is not recorded no longer counts
// as using the volume, which could then be released while c1's pods use it.
func TestRecordBoundFailureKeepsClaimBound(t *testing.T) {
	c1, pv := boundPair(claimB("c1").Class("fast").Obj(), volumeB("v1").Obj())
	c2 := claimB("c2").Class("fast").Obj()
	pv.Spec.ClaimRef = &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: ns, Name: c2.Name, UID: c2.UID}
	f := newFixture(t, objs(classFast(), c1, c2, pv))
	f.api.fail = func(_ int, a k8stesting.Action) error {
		if a.GetResource().Resource == "persistentvolumes" {
			return errors.New("etcdserver: request timed out")
		}
		return nil
	}
	f.loadInformers()
	if _, err := f.runSync("pvc/c1"); err == nil {
		t.Error("sync: no error though the volume could not be updated")
	}
	if p := f.claim("c1").Status.Phase; p != corev1.ClaimBound {
		t.Errorf("c1 phase %q, want still Bound until it is recorded on the volume", p)
	}
}

// TestOtherClaimBoundToPrefersNotLost: of several claims a binder bound
// to a volume, otherClaimBoundTo returns one that is not Lost, whatever
// order the index gives them in (a map's, so it is asked many times). A
// Lost claim returned instead would let another Lost claim take the
// volume from the claim still bound to it (TestSyncBoundClaim 3-3-3).
func TestOtherClaimBoundToPrefersNotLost(t *testing.T) {
	state := objs(classFast())
	var uids []types.UID
	for _, name := range []string{"lost-a", "lost-b", "lost-c", "lost-d", "lost-e", "lost-f", "lost-g"} {
		c := claimB(name).Class("fast").VolumeName("pv1").Annotation(annBindCompleted, "yes").Phase(corev1.ClaimLost).Obj()
		uids = append(uids, c.UID)
		state = append(state, c)
	}
	bound := claimB("bound").Class("fast").VolumeName("pv1").Annotation(annBindCompleted, "yes").Phase(corev1.ClaimBound).Obj()
	pv := recordBoundClaims(volumeB("pv1").Class("fast").Phase(corev1.VolumeAvailable).Obj(), uids...)
	f := newFixture(t, append(state, bound, pv))
	ref := &corev1.ObjectReference{Namespace: ns, Name: "c1", UID: "uid-c1"}
	for range 64 {
		got := "none"
		if c := f.binder.otherClaimBoundTo(f.binder.getVolume("pv1"), ref); c != nil {
			got = c.Name
		}
		if got != bound.Name {
			t.Fatalf("otherClaimBoundTo = %s, want %s, the claim that is not Lost", got, bound.Name)
		}
	}
}
