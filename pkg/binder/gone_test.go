package binder

import (
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/cache"
)

// listCounting counts the walks through every cached claim.
type listCounting struct {
	cache.SharedIndexInformer
	lists *int
}

func (i listCounting) GetIndexer() cache.Indexer {
	return listCountingIndexer{Indexer: i.SharedIndexInformer.GetIndexer(), lists: i.lists}
}

type listCountingIndexer struct {
	cache.Indexer
	lists *int
}

func (x listCountingIndexer) List() []interface{} {
	*x.lists++
	return x.Indexer.List()
}

// TestGoneClaimNoWalk checks that a volume named after a claim that is gone
// does not make the in-use guard walk through every cached claim at each
// sync and resync: with policy Delete that was one walk per deleted claim,
// and with policy Retain one per Released volume every resync period.
func TestGoneClaimNoWalk(t *testing.T) {
	c1 := claimB("c1").Class("fast").VolumeName("pvc-uid-c1").Annotation(annBindCompleted, "yes").Phase(corev1.ClaimBound).Obj()
	released := volumeB("pvc-uid-c1").Class("fast").Annotation(annProvisionedBy, driver).
		ReclaimPolicy(corev1.PersistentVolumeReclaimRetain).BoundTo(c1).Phase(corev1.VolumeReleased).Obj()
	others := objs(classFast(), released)
	for i := range 20 {
		others = append(others, claimB(fmt.Sprintf("other-%d", i)).Class("fast").Obj())
	}
	renamed := released.DeepCopy()
	renamed.Spec.ClaimRef.Name = "c1-renamed"
	renamed.Status.Phase = corev1.VolumeBound

	for _, tc := range []struct {
		name      string
		deleted   bool // the binder saw c1's deletion
		maxWalks  int
		comesBack runtime.Object // a claim with c1's UID appears afterwards
	}{
		{name: "deletion seen", deleted: true, maxWalks: 0},
		{name: "deleted before a restart: one walk", maxWalks: 1},
		{name: "a claim of that UID appears late in the cache: found again", deleted: true, maxWalks: 1, comesBack: c1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, others, WithUIDNamedVolumes("pvc"))
			walks := 0
			f.binder.pvcInformer = listCounting{SharedIndexInformer: f.binder.pvcInformer, lists: &walks}
			if tc.deleted {
				f.binder.onClaimDelete(c1)
			}
			for range 5 {
				if f.binder.volumeNeedsWork(released) {
					t.Errorf("volumeNeedsWork(Released, Retain, claim gone) = true, want false")
				}
				if user := f.binder.otherClaimBoundTo(released, released.Spec.ClaimRef); user != nil {
					t.Errorf("otherClaimBoundTo = %s, want none", user.Name)
				}
			}
			if tc.comesBack != nil {
				f.putInInformer(tc.comesBack)
				f.binder.onClaimAdd(tc.comesBack)
				if user := f.binder.otherClaimBoundTo(renamed, renamed.Spec.ClaimRef); user == nil || user.Name != "c1" {
					t.Errorf("otherClaimBoundTo(claimRef renamed) = %v, want c1", user)
				}
			}
			if walks > tc.maxWalks {
				t.Errorf("walked through every cached claim %d times, want at most %d", walks, tc.maxWalks)
			}
		})
	}
}

// hookedIndexer runs afterList after each walk through every cached claim
// has read the cache.
type hookedInformer struct {
	cache.SharedIndexInformer
	afterList func()
}

func (i hookedInformer) GetIndexer() cache.Indexer {
	return hookedIndexer{Indexer: i.SharedIndexInformer.GetIndexer(), afterList: i.afterList}
}

type hookedIndexer struct {
	cache.Indexer
	afterList func()
}

func (x hookedIndexer) List() []interface{} {
	l := x.Indexer.List()
	x.afterList()
	return l
}

// TestGoneClaimAddedDuringWalk: the informer adds a claim while a walk
// through the cached claims, which read the cache before, looks for it.
// The claim's add notification must not come before the walk records the
// claim as gone (which would keep a live claim recorded for an hour and
// switch the in-use guard off for its volume): the walk holds the lock
// that the notification waits for.
func TestGoneClaimAddedDuringWalk(t *testing.T) {
	c1 := claimB("c1").Class("fast").VolumeName("pvc-uid-c1").Annotation(annBindCompleted, "yes").Phase(corev1.ClaimBound).Obj()
	pv := volumeB("pvc-uid-c1").Class("fast").Annotation(annProvisionedBy, driver).BoundTo(c1).Phase(corev1.VolumeBound).Obj()
	// The claimRef edited away from c1, to a claim that does not exist.
	pv.Spec.ClaimRef.Name, pv.Spec.ClaimRef.UID = "ghost", "uid-ghost"
	f := newFixture(t, objs(classFast(), pv), WithUIDNamedVolumes("pvc"))
	notified := make(chan struct{})
	once := false
	f.binder.pvcInformer = hookedInformer{SharedIndexInformer: f.binder.pvcInformer, afterList: func() {
		if once {
			return
		}
		once = true
		if f.binder.gone.mu.TryLock() {
			f.binder.gone.mu.Unlock()
			t.Error("the walk reads the cache without the lock that orders it before the add notification")
		}
		f.putInInformer(c1)
		go func() {
			defer close(notified)
			f.binder.onClaimAdd(c1)
		}()
	}}
	if user := f.binder.otherClaimBoundTo(pv, pv.Spec.ClaimRef); user != nil {
		t.Fatalf("otherClaimBoundTo = %s before c1 was cached, want none", user.Name)
	}
	<-notified
	if f.binder.gone.Has(c1.UID) {
		t.Fatal("c1 is cached but recorded as gone")
	}
	if user := f.binder.otherClaimBoundTo(pv, pv.Spec.ClaimRef); user == nil || user.Name != "c1" {
		t.Errorf("otherClaimBoundTo = %v, want c1, which is bound to the volume", user)
	}
}

// TestGoneClaimBackThroughRelistUpdate: a claim recorded as gone by a walk
// while the claim informer was stale (it still held an older claim of the
// same name) comes back through the relist as an update from the older
// claim to it, not as an add. Its gone record must go as with an add:
// otherwise the in-use guard of its volume is off for goneClaimTTL (an
// hour), and a volume whose claimRef was edited away while the claim is
// still bound to it is released (and, with policy Delete, deleted).
func TestGoneClaimBackThroughRelistUpdate(t *testing.T) {
	old := claimB("c1").UID("uid-c1-old").Class("fast").Obj() // deleted while the watch was down
	c1 := claimB("c1").Class("fast").VolumeName("pvc-uid-c1").Annotation(annBindCompleted, "yes").Phase(corev1.ClaimBound).Obj()
	pv := volumeB("pvc-uid-c1").Class("fast").Annotation(annProvisionedBy, driver).BoundTo(c1).Phase(corev1.VolumeBound).Obj()
	// The claimRef edited away from c1, to a claim that does not exist.
	pv.Spec.ClaimRef.Name, pv.Spec.ClaimRef.UID = "ghost", "uid-ghost"
	f := newFixture(t, objs(classFast(), pv, c1), WithUIDNamedVolumes("pvc"))

	// The claim watch broke; the cache still has the older claim c1.
	f.putInInformer(old)
	f.binder.onClaimAdd(old)
	if user := f.binder.otherClaimBoundTo(pv, pv.Spec.ClaimRef); user != nil {
		t.Fatalf("otherClaimBoundTo = %s while the cache lacks c1, want none", user.Name)
	}
	// The relist: an update from the older claim to c1.
	f.putInInformer(c1)
	f.binder.onClaimUpdate(old, c1)
	if f.binder.gone.Has(c1.UID) {
		t.Error("c1 is cached but still recorded as gone")
	}
	f.actions()
	if _, err := f.runSync("pv/pvc-uid-c1"); err != nil {
		t.Fatal(err)
	}
	if got := f.volume("pvc-uid-c1").Status.Phase; got != corev1.VolumeBound {
		t.Errorf("volume phase = %s, want Bound: claim c1 is still bound to it (writes %v, events %v)", got, writesOnly(f.actions()), f.events.take())
	}
	if ev := strings.Join(f.events.take(), "\n"); !strings.Contains(ev, reasonVolumeStillInUse) {
		t.Errorf("events %q, want %s", ev, reasonVolumeStillInUse)
	}
}
