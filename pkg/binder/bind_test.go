package binder

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kube-storage/csi-provisioner/pkg/inflight"
)

var errCrash = errors.New("binder crashed")

// TestBindDropsRecordedVolumeName: the write that binds a provisioned
// claim removes the in-flight finalizer and the volume name recorded with
// it, which has served; a bound claim keeps neither.
func TestBindDropsRecordedVolumeName(t *testing.T) {
	c1 := claimB("c1").Class("fast").Obj()
	f := newFixture(t, objs(classFast(), withVolumeName(handedOver(c1, true), "pv1"),
		volumeB("pv1").Class("fast").BoundTo(c1).Annotation(annProvisionedBy, driver).Phase(corev1.VolumePending).Obj()))
	if _, err := f.runSync("pvc/c1"); err != nil {
		t.Fatal(err)
	}
	got := f.claim("c1")
	if got.Spec.VolumeName != "pv1" || inflight.Has(got) {
		t.Fatalf("claim volumeName %q, finalizers %v; want bound to pv1 without the in-flight finalizer", got.Spec.VolumeName, got.Finalizers)
	}
	if name, ok := got.Annotations[inflight.AnnVolumeName]; ok {
		t.Errorf("bound claim keeps %s=%q", inflight.AnnVolumeName, name)
	}
}

// TestBindResumesAfterCrash stops bind after each of its four writes (the
// write after it fails, as if the process died), starts a new binder on
// whatever the API holds, and checks that syncing the claim and the volume
// finishes the binding exactly as an uninterrupted one, in either order.
func TestBindResumesAfterCrash(t *testing.T) {
	c1 := claimB("c1").Class("fast").Obj()
	scenarios := []struct {
		name    string
		objects []runtime.Object
		writes  int // writes of an uninterrupted binding
	}{
		{"static volume", objs(classFast(), c1, volumeB("pv1").Class("fast").Obj()), 4},
		{"provisioned volume", objs(classFast(), handedOver(c1, true),
			volumeB("pv1").Class("fast").BoundTo(c1).Annotation(annProvisionedBy, driver).Phase(corev1.VolumePending).Obj()), 3},
		{"pre-bound claim", objs(classFast(), claimB("c1").Class("fast").VolumeName("pv1").Obj(), volumeB("pv1").Class("fast").Obj()), 4},
		{"volume pre-bound by name", objs(classFast(), c1, volumeB("pv1").Class("fast").ClaimRef(ns, "c1", "").Obj()), 4},
	}
	for _, sc := range scenarios {
		// The reference: an uninterrupted binding.
		ref := newFixture(t, sc.objects)
		if _, err := ref.runSync("pvc/c1"); err != nil {
			t.Fatalf("%s: reference bind: %v", sc.name, err)
		}
		if got := len(writesOnly(ref.actions())); got != sc.writes {
			t.Fatalf("%s: reference bind made %d writes, want %d", sc.name, got, sc.writes)
		}
		wantClaim, wantVolume := ref.claim("c1"), ref.volume("pv1")

		for crashAfter := 0; crashAfter < sc.writes; crashAfter++ {
			for _, order := range [][]string{{"pvc/c1", "pv/pv1"}, {"pv/pv1", "pvc/c1"}} {
				t.Run(fmt.Sprintf("%s/crash after write %d/%s first", sc.name, crashAfter, order[0]), func(t *testing.T) {
					f := newFixture(t, sc.objects)
					f.api.fail = func(n int, _ k8stesting.Action) error {
						if n > crashAfter {
							return errCrash
						}
						return nil
					}
					if _, err := f.runSync("pvc/c1"); !errors.Is(err, errCrash) {
						t.Fatalf("first sync: error %v, want the crash", err)
					}
					if got := len(writesOnly(f.actions())); got != crashAfter+1 {
						t.Fatalf("first sync attempted %d writes, want %d", got, crashAfter+1)
					}

					// Restart: a new binder whose informers list the API.
					var state []runtime.Object
					state = append(state, classFast(), f.claim("c1"), f.volume("pv1"))
					g := newFixture(t, state)
					for round := 0; ; round++ {
						if round == 5 {
							t.Fatal("no fixpoint after 5 rounds of syncs")
						}
						for _, s := range order {
							if _, err := g.runSync(s); err != nil {
								t.Fatalf("resume %s: %v", s, err)
							}
							g.queued()
						}
						if len(writesOnly(g.actions())) == 0 {
							break
						}
						g.loadInformers()
					}
					if diff := cmp.Diff(wantClaim, g.claim("c1"), cmpOpts...); diff != "" {
						t.Errorf("claim after resume (-uninterrupted +resumed):\n%s", diff)
					}
					if diff := cmp.Diff(wantVolume, g.volume("pv1"), cmpOpts...); diff != "" {
						t.Errorf("volume after resume (-uninterrupted +resumed):\n%s", diff)
					}
				})
			}
		}
	}
}

// TestOwnWritesCache checks that a second sync, before the informer has seen
// the first sync's writes, works from the binder's own copies: it neither
// repeats writes nor runs into conflicts.
func TestOwnWritesCache(t *testing.T) {
	f := newFixture(t, objs(classFast(), claimB("c1").Class("fast").Obj(), volumeB("pv1").Class("fast").Obj()))
	if _, err := f.runSync("pvc/c1"); err != nil {
		t.Fatal(err)
	}
	if got := len(writesOnly(f.actions())); got != 4 {
		t.Fatalf("bind made %d writes, want 4", got)
	}
	// The informers still hold the old objects.
	for _, s := range []string{"pvc/c1", "pv/pv1", "pvc/c1"} {
		if _, err := f.runSync(s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	if got := f.actions(); len(got) != 0 {
		t.Errorf("syncs on stale informers made calls %q, want none", got)
	}
	if got := f.binder.pvs.len() + f.binder.claims.len(); got != 2 {
		t.Errorf("own cache holds %d objects, want 2 (the newest volume and claim)", got)
	}
	// Once the informers catch up, the own copies are dropped.
	f.loadInformers()
	f.binder.getClaim(ns, "c1")
	f.binder.getVolume("pv1")
	if got := f.binder.pvs.len() + f.binder.claims.len(); got != 0 {
		t.Errorf("own cache holds %d objects after the informers caught up, want 0", got)
	}
}

// TestReservationCached: a reservation the informer has not seen yet is
// honoured by the next sync even when the binding stopped right after it:
// another claim must not take the volume from a stale informer copy.
func TestReservationCached(t *testing.T) {
	f := newFixture(t, objs(classFast(), claimB("c1").Class("fast").Obj(), claimB("c2").Class("fast").Obj(), volumeB("pv1").Class("fast").Obj()))
	f.api.fail = func(n int, _ k8stesting.Action) error {
		if n > 1 {
			return errCrash
		}
		return nil
	}
	if _, err := f.runSync("pvc/c1"); !errors.Is(err, errCrash) {
		t.Fatalf("sync of c1: error %v, want the crash after the reservation", err)
	}
	f.actions()
	f.api.fail = nil
	if _, err := f.runSync("pvc/c2"); err != nil {
		t.Fatalf("sync of c2: %v", err)
	}
	for _, a := range writesOnly(f.actions()) {
		if strings.Contains(a, "pv1") {
			t.Errorf("the sync of c2 wrote %q: it took the volume reserved for c1", a)
		}
	}
	if ref := f.volume("pv1").Spec.ClaimRef; ref == nil || ref.Name != "c1" {
		t.Errorf("pv1 claimRef = %v, want c1", ref)
	}
}

func TestWriteCache(t *testing.T) {
	pv := func(rv string) *corev1.PersistentVolume { return volumeB("pv1").RV(rv).Obj() }
	tests := []struct {
		name      string
		stored    []string // resourceVersions stored, in order
		informer  string   // "" for absent
		wantRV    string   // "" for nil
		wantAfter int      // own copies left
	}{
		{name: "no own copy", informer: "5", wantRV: "5"},
		{name: "own copy newer", stored: []string{"7"}, informer: "5", wantRV: "7", wantAfter: 1},
		{name: "informer caught up", stored: []string{"7"}, informer: "7", wantRV: "7"},
		{name: "informer newer", stored: []string{"7"}, informer: "9", wantRV: "9"},
		{name: "older store is ignored", stored: []string{"7", "6"}, informer: "5", wantRV: "7", wantAfter: 1},
		{name: "object deleted", stored: []string{"7"}, wantRV: ""},
		{name: "unparsable versions: the informer wins", stored: []string{"x"}, informer: "5", wantRV: "5"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newWriteCache[*corev1.PersistentVolume]()
			for _, rv := range tt.stored {
				c.store("pv1", pv(rv))
			}
			var inf *corev1.PersistentVolume
			if tt.informer != "" {
				inf = pv(tt.informer)
			}
			got := c.newest("pv1", inf)
			gotRV := ""
			if got != nil {
				gotRV = got.ResourceVersion
			}
			if gotRV != tt.wantRV {
				t.Errorf("newest: resourceVersion %q, want %q", gotRV, tt.wantRV)
			}
			if c.len() != tt.wantAfter {
				t.Errorf("own copies after read: %d, want %d", c.len(), tt.wantAfter)
			}
		})
	}
}

// TestReserveRechecksUnderTheLock: a volume read as unreserved but reserved
// for another claim by the time the reservation is written is not taken.
func TestReserveRechecksUnderTheLock(t *testing.T) {
	c1 := claimB("c1").Class("fast").VolumeName("pv1").Obj()
	stale := volumeB("pv1").Class("fast").Obj()
	taken := volumeB("pv1").Class("fast").RV("5").ClaimRef(ns, "c2", "uid-c2").Obj()
	f := newFixture(t, objs(classFast(), c1, stale))
	f.putInInformer(taken)
	if _, err := f.binder.reserve(f.ctx, stale, c1); !errors.Is(err, errVolumeTaken) {
		t.Errorf("reserve: error %v, want errVolumeTaken", err)
	}
	if got := f.actions(); len(got) != 0 {
		t.Errorf("reserve made calls %q, want none", got)
	}
}

// TestBindDeletedClaimGoesWithItsFinalizer: a claim deleted while its
// CreateVolume ran keeps only the in-flight finalizer; once its volume is
// provisioned, the bind write that removes that finalizer lets the API
// server delete the claim, or the provisioner's guard removed it first and
// the claim is gone before the bind write. The binder used to write the
// claim (status) anyway, which failed "not found" and was logged as an
// error ("Sync failed, will retry") for every such claim. The volume is
// then Released as for any claim that went.
func TestBindDeletedClaimGoesWithItsFinalizer(t *testing.T) {
	deleting := handedOver(claimB("c1").Class("fast").Deleted().Obj(), true)
	pv := volumeB("pv1").Class("fast").BoundTo(deleting).Annotation(annProvisionedBy, driver).
		Finalizers(pvFinalizer).Phase(corev1.VolumePending).Obj()
	tests := []struct {
		name string
		// guarded: the guard removed the finalizer; the informer has not
		// seen the claim go.
		guarded bool
		actions []string
	}{
		{name: "the bind write removes the last finalizer", actions: []string{"status pv/pv1", "update pvc/c1"}},
		{name: "the guard removed it first", guarded: true, actions: []string{"status pv/pv1", "update pvc/c1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, objs(classFast(), deleting, pv))
			if tt.guarded {
				if err := f.client.Tracker().Delete(corev1.SchemeGroupVersion.WithResource("persistentvolumeclaims"), ns, "c1"); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := f.runSync("pvc/c1"); err != nil {
				t.Errorf("sync of the claim: %v", err)
			}
			if diff := cmp.Diff(tt.actions, f.actions()); diff != "" {
				t.Errorf("actions (-want +got):\n%s", diff)
			}
			if got := f.claims(); len(got) != 0 {
				t.Fatalf("claims in the API: %d, want none (its last finalizer was removed)", len(got))
			}
			f.loadInformers()
			if _, err := f.runSync("pv/pv1"); err != nil {
				t.Fatalf("sync of the volume: %v", err)
			}
			if got := f.volume("pv1").Status.Phase; got != corev1.VolumeReleased {
				t.Errorf("volume phase %q, want Released", got)
			}
		})
	}
}
