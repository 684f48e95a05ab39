package binder

import (
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/cache"

	"github.com/kube-storage/csi-provisioner/internal/testutil"
)

// classless returns a claim with no class at all: spec.storageClassName nil.
func classless(name string) *corev1.PersistentVolumeClaim {
	c := claimB(name).Obj()
	c.Spec.StorageClassName = nil
	return c
}

func withClass(claim *corev1.PersistentVolumeClaim, class string) *corev1.PersistentVolumeClaim {
	claim = claim.DeepCopy()
	claim.Spec.StorageClassName = &class
	return claim
}

func defaultSC(name, provisioner string, created time.Time) *storagev1.StorageClass {
	return testutil.NewSC(name, provisioner).Default(annDefaultClass).Created(created).Obj()
}

func TestRetroactiveDefaultClass(t *testing.T) {
	c1 := classless("c1")
	older, newer := now.Add(-2*time.Hour), now.Add(-time.Hour)
	ours := defaultSC("fast", driver, older)
	oursBeta := testutil.NewSC("fast", driver).Default(annBetaDefaultClass).Created(older).Obj()
	theirs := defaultSC("other", otherDriver, older)
	theirsNewer := defaultSC("other", otherDriver, newer)
	oursNewer := defaultSC("fast", driver, newer)
	// Created in the same second: the lowest name wins.
	oursA := defaultSC("a-fast", driver, older)
	theirsB := defaultSC("b-other", otherDriver, older)
	notDefault := testutil.NewSC("fast", driver).Created(older).Obj()
	notTrue := testutil.NewSC("fast", driver).Created(older).Obj()
	notTrue.Annotations = map[string]string{annDefaultClass: "yes"}

	emptyClass := claimB("c1").Class("").Obj()
	betaAnnotated := claimB("c1").Annotation("volume.beta.kubernetes.io/storage-class", "fast").Obj()
	betaAnnotated.Spec.StorageClassName = nil
	static := volumeB("pv1").Obj() // class ""
	prebound := classless("c1")
	prebound.Spec.VolumeName = "pv-missing"

	cases := []syncCase{
		{
			name:    "a claim without class takes the driver's default class, one write, no event",
			objects: objs(ours, c1),
			sync:    "pvc/c1",
			claims:  []*corev1.PersistentVolumeClaim{withClass(c1, "fast")},
			actions: []string{"update pvc/c1"},
		},
		{
			name:    "the beta default annotation counts",
			objects: objs(oursBeta, c1),
			sync:    "pvc/c1",
			claims:  []*corev1.PersistentVolumeClaim{withClass(c1, "fast")},
			actions: []string{"update pvc/c1"},
		},
		{
			name:    "a static volume without class is bound first, as upstream does",
			objects: objs(ours, c1, static),
			sync:    "pvc/c1",
			claims:  []*corev1.PersistentVolumeClaim{boundClaim(c1, static, true)},
			volumes: []*corev1.PersistentVolume{boundVolume(static, c1, true)},
			actions: bindActions,
		},
		{
			name:    "the default class of another provisioner: not ours to set",
			objects: objs(theirs, notDefault, c1),
			sync:    "pvc/c1",
			// Nobody assigns a class: this binder explains it at its turn.
			requeueAfter: turnC1,
		},
		{
			name:    "of two default classes the newest wins: another provisioner's",
			objects: objs(ours, theirsNewer, c1),
			sync:    "pvc/c1",
			// Nobody assigns a class: this binder explains it at its turn.
			requeueAfter: turnC1,
		},
		{
			name:    "of two default classes the newest wins: ours",
			objects: objs(oursNewer, theirs, c1),
			sync:    "pvc/c1",
			claims:  []*corev1.PersistentVolumeClaim{withClass(c1, "fast")},
			actions: []string{"update pvc/c1"},
		},
		{
			name:    "of two default classes created together the lowest name wins",
			objects: objs(theirsB, oursA, c1),
			sync:    "pvc/c1",
			claims:  []*corev1.PersistentVolumeClaim{withClass(c1, "a-fast")},
			actions: []string{"update pvc/c1"},
		},
		{
			name:    "no default class: nothing",
			objects: objs(notDefault, c1),
			sync:    "pvc/c1",
			// Nobody assigns a class: this binder explains it at its turn.
			requeueAfter: turnC1,
		},
		{
			name:    "a default annotation other than \"true\" does not count",
			objects: objs(notTrue, c1),
			sync:    "pvc/c1",
			// Nobody assigns a class: this binder explains it at its turn.
			requeueAfter: turnC1,
		},
		{
			name:         "an explicit class \"\" is a class: never changed",
			objects:      objs(ours, emptyClass),
			sync:         "pvc/c1",
			requeueAfter: turnC1,
		},
		{
			name:         "the beta class annotation is a class: the claim is the class's, not changed",
			objects:      objs(ours, betaAnnotated),
			sync:         "pvc/c1",
			claims:       []*corev1.PersistentVolumeClaim{handedOver(betaAnnotated, true)},
			actions:      []string{"update pvc/c1"},
			requeueAfter: 29 * time.Second,
		},
		{
			name:    "a claim pre-bound to a volume keeps no class, as upstream does",
			objects: objs(ours, prebound),
			sync:    "pvc/c1",
		},
	}
	runSyncCases(t, cases)
}

// TestRetroactiveDefaultClassQueued checks that a class becoming the
// driver's default queues the claims without a class, and only then.
func TestRetroactiveDefaultClassQueued(t *testing.T) {
	pending := classless("pending")
	pendingEmpty := claimB("pending-empty").Class("").Obj()
	pendingFast := claimB("pending-fast").Class("fast").Obj()
	all := []runtime.Object{pending, pendingEmpty, pendingFast}
	for _, tc := range []struct {
		name  string
		class *storagev1.StorageClass
		want  []string
	}{
		{"the driver's default class", defaultSC("fast", driver, now), []string{"pvc/ns/pending", "pvc/ns/pending-empty", "pvc/ns/pending-fast"}},
		{"the driver's class, not default", testutil.NewSC("fast", driver).Obj(), []string{"pvc/ns/pending-fast"}},
		{"another provisioner's default class", defaultSC("other", otherDriver, now), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, all)
			f.binder.onClass(tc.class)
			got := f.queued()
			slices.Sort(got)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("queued (-want +got):\n%s", diff)
			}
		})
	}
}

// TestDefaultLostQueued checks that a class of any provisioner that stops
// being default, by an update or by its deletion, queues the claims without
// a class: an older default class of the driver may be theirs now. Before,
// they waited for the resync.
func TestDefaultLostQueued(t *testing.T) {
	pending := classless("pending")
	pendingEmpty := claimB("pending-empty").Class("").Obj()
	pendingOther := claimB("pending-other").Class("other").Obj()
	all := []runtime.Object{pending, pendingEmpty, pendingOther}
	otherDefault := defaultSC("other", otherDriver, now)
	otherPlain := testutil.NewSC("other", otherDriver).Obj()
	classlessAndOther := []string{"pvc/ns/pending", "pvc/ns/pending-empty", "pvc/ns/pending-other"}
	for _, tc := range []struct {
		name   string
		handle func(*Binder)
		want   []string
	}{
		{"another provisioner's class stops being default",
			func(b *Binder) { b.onClassUpdate(otherDefault, otherPlain) }, classlessAndOther},
		{"another provisioner's default class is deleted",
			func(b *Binder) { b.onClassDelete(otherDefault) }, classlessAndOther},
		{"another provisioner's default class, deleted while the informer was away",
			func(b *Binder) {
				b.onClassDelete(cache.DeletedFinalStateUnknown{Key: "other", Obj: otherDefault})
			}, classlessAndOther},
		{"another provisioner's class becomes default",
			func(b *Binder) { b.onClassUpdate(otherPlain, otherDefault) }, []string{"pvc/ns/pending-other"}},
		{"another provisioner's class, not default, changes",
			func(b *Binder) { b.onClassUpdate(otherPlain, otherPlain) }, []string{"pvc/ns/pending-other"}},
		{"another provisioner's class, not default, is deleted",
			func(b *Binder) { b.onClassDelete(otherPlain) }, []string{"pvc/ns/pending-other"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, all)
			tc.handle(f.binder)
			got := f.queued()
			slices.Sort(got)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("queued (-want +got):\n%s", diff)
			}
		})
	}
}
