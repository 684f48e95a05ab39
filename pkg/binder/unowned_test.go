package binder

import (
	"errors"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8stesting "k8s.io/client-go/testing"
)

// TestUnownedReportListsOnce checks that the events of a claim that is
// nobody's are listed once per events.RefreshInterval, not at every resync,
// whether this binder reported the claim or another one did, and that the
// cause is reported again once that interval has passed.
func TestUnownedReportListsOnce(t *testing.T) {
	claim := claimB("c1").Class("").Created(now.Add(-time.Hour)).Obj()
	other := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Namespace: ns, Name: "c1.kcm"},
		InvolvedObject: corev1.ObjectReference{Kind: "PersistentVolumeClaim", Namespace: ns, Name: "c1", UID: claim.UID},
		Type:           corev1.EventTypeNormal, Reason: reasonFailedBinding, Message: msgNoVolumeNoClass,
		Source: corev1.EventSource{Component: "persistentvolume-controller"}, LastTimestamp: metav1.NewTime(now.Add(-time.Minute)),
	}
	for _, tc := range []struct {
		name    string
		objects []runtime.Object
		// events posted at the first sync, and after RefreshInterval.
		first, later int
	}{
		{name: "reported by this binder", objects: objs(claim), first: 1, later: 1},
		// kube-controller-manager's event is a minute old when the clock
		// moves on: by then it is old too.
		{name: "reported by another binder", objects: objs(claim, other), first: 0, later: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, tc.objects)
			sync := func(wantLists, wantEvents int) {
				t.Helper()
				for range 3 {
					if _, err := f.binder.syncClaim(f.ctx, "ns/c1"); err != nil {
						t.Fatal(err)
					}
				}
				lists := 0
				for _, a := range f.client.Actions() {
					if a.GetVerb() == "list" && a.GetResource().Resource == "events" {
						lists++
					}
				}
				f.client.ClearActions()
				if got := len(f.events.take()); lists != wantLists || got != wantEvents {
					t.Errorf("three syncs listed events %d times and posted %d events, want %d and %d", lists, got, wantLists, wantEvents)
				}
			}
			sync(1, tc.first)
			f.clock.Step(30*time.Minute + time.Second)
			sync(1, tc.later)
		})
	}
}

// TestUnownedReportSeesEventsV1: another binder's recent report written
// through events.k8s.io/v1 (eventTime set, no lastTimestamp) or repeated
// as a series (series.lastObservedTime recent, lastTimestamp old) counts
// as recent: this binder posts no second copy.
func TestUnownedReportSeesEventsV1(t *testing.T) {
	claim := claimB("c1").Class("").Created(now.Add(-time.Hour)).Obj()
	base := func() *corev1.Event {
		return &corev1.Event{
			ObjectMeta:     metav1.ObjectMeta{Namespace: ns, Name: "c1.other"},
			InvolvedObject: corev1.ObjectReference{Kind: "PersistentVolumeClaim", Namespace: ns, Name: "c1", UID: claim.UID},
			Type:           corev1.EventTypeNormal, Reason: reasonFailedBinding, Message: msgNoVolumeNoClass,
		}
	}
	eventTime := base()
	eventTime.EventTime = metav1.NewMicroTime(now.Add(-time.Minute))
	series := base()
	series.LastTimestamp = metav1.NewTime(now.Add(-2 * time.Hour))
	series.Series = &corev1.EventSeries{Count: 5, LastObservedTime: metav1.NewMicroTime(now.Add(-time.Minute))}
	for name, ev := range map[string]*corev1.Event{"eventTime only": eventTime, "series": series} {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, objs(claim, ev))
			if _, err := f.binder.syncClaim(f.ctx, "ns/c1"); err != nil {
				t.Fatal(err)
			}
			if got := f.events.take(); len(got) != 0 {
				t.Errorf("posted %v although another binder reported it a minute ago", got)
			}
		})
	}
}

// TestUnownedReportWhenEventsCannotBeListed: when the claim's events cannot
// be listed (an API error, or RBAC without events list), the claim that is
// nobody's is still explained: "a second Warning is better than none".
func TestUnownedReportWhenEventsCannotBeListed(t *testing.T) {
	claim := claimB("c1").Class("").Created(now.Add(-time.Hour)).Obj()
	f := newFixture(t, objs(claim))
	f.client.PrependReactor("list", "events", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "events"}, "", errors.New("no list"))
	})
	if _, err := f.binder.syncClaim(f.ctx, "ns/c1"); err != nil {
		t.Fatal(err)
	}
	if got := f.events.take(); len(got) != 1 {
		t.Errorf("events = %v, want the claim explained once", got)
	}
}
