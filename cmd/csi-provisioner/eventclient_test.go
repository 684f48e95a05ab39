package main

import (
	"context"
	"fmt"
	"k8s.io/client-go/tools/record"
	testclock "k8s.io/utils/clock/testing"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kube-storage/csi-provisioner/internal/events"
	"github.com/kube-storage/csi-provisioner/internal/testutil"
)

// TestBroadcasterShutdownDeliversRecordedEvents: the events recorded just
// before the sidecar stops (a burst of them) are all written, in the
// order runSidecar's finish stops things: the broadcaster, then the
// writer. client-go's Shutdown alone stops feeding the sink with events
// still waiting for it, and most of the burst was lost.
func TestBroadcasterShutdownDeliversRecordedEvents(t *testing.T) {
	const n = 300
	for try := range 5 {
		t.Run(fmt.Sprint("try ", try), func(t *testing.T) {
			main, api := fake.NewClientset(), fake.NewClientset()
			// What is under test is the hand-over to the writer, not the
			// writer's drain: the fake clientset writes a few hundred
			// events a second at best under -race on a busy machine, and
			// the default drain timeout (2s) dropped the rest.
			w := events.NewWriter(api.CoreV1().Events(""), events.WriterOptions{DrainTimeout: time.Minute})
			ctx, stopWriter := context.WithCancel(context.WithoutCancel(t.Context()))
			writerDone := make(chan struct{})
			go func() { defer close(writerDone); w.Run(ctx) }()
			b := newBroadcaster(context.WithoutCancel(t.Context()), newEventSplitClient(main, api, w))
			recorder := newRecorder(b, "external-provisioner", &unwrittenEvents{})
			for i := range n {
				claim := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{
					Namespace: "ns", Name: fmt.Sprint("claim-", i), UID: types.UID(fmt.Sprint("uid-", i))}}
				recorder.Event(claim, corev1.EventTypeWarning, "ProvisioningFailed", "no space left")
			}
			b.Shutdown()
			stopWriter()
			<-writerDone
			list, err := api.CoreV1().Events("ns").List(t.Context(), metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if len(list.Items) != n {
				t.Errorf("%d events written, want %d", len(list.Items), n)
			}
		})
	}
}

// TestUnwrittenEventPostedAgain: an event the writer gives up on (the API
// server unreachable for all its tries) is not remembered as posted: the
// next repetition of its cause is posted once the API server is back,
// instead of being dropped as a repeat for 30 minutes.
func TestUnwrittenEventPostedAgain(t *testing.T) {
	main, api := fake.NewClientset(), fake.NewClientset()
	var down atomic.Bool
	down.Store(true)
	api.PrependReactor("create", "events", func(k8stesting.Action) (bool, runtime.Object, error) {
		if down.Load() {
			return true, nil, apierrors.NewServiceUnavailable("the API server is down")
		}
		return false, nil, nil
	})
	unwritten := &unwrittenEvents{}
	w := events.NewWriter(api.CoreV1().Events(""), events.WriterOptions{MaxTries: 2, RetryInterval: time.Millisecond, OnDrop: unwritten.dropped})
	go w.Run(t.Context())
	b := newBroadcaster(context.WithoutCancel(t.Context()), newEventSplitClient(main, api, w))
	t.Cleanup(b.Shutdown)
	recorder := newRecorder(b, "external-provisioner", unwritten)
	claim := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "data", UID: "uid-data"}}
	const reason, message = "ProvisioningFailed", "no space left"

	recorder.Event(claim, corev1.EventTypeWarning, reason, message)
	testutil.Eventually(t, 0, "the writer did not give up on the event", func(context.Context) (bool, error) {
		return !recorder.Repeats(claim, corev1.EventTypeWarning, reason, message), nil
	})
	down.Store(false)
	recorder.Event(claim, corev1.EventTypeWarning, reason, message)
	testutil.Eventually(t, 0, "the cause was not posted again once the API server was back", func(ctx context.Context) (bool, error) {
		list, err := api.CoreV1().Events("ns").List(ctx, metav1.ListOptions{})
		return err == nil && len(list.Items) == 1 && list.Items[0].Message == message, err
	})
}

// TestEventCorrelatorKeepsTheCurrentCause: a claim's cause flips between
// two values 30 times (each posted once by the deduplicator), then stays.
// client-go's default spam filter counts all of an object's events
// together and, after a burst of 25, drops the current cause, which the
// deduplicator would then not post again for events.RefreshInterval. With
// the sidecar's correlator the last cause is written.
func TestEventCorrelatorKeepsTheCurrentCause(t *testing.T) {
	clk := testclock.NewFakeClock(time.Unix(1_700_000_000, 0))
	opts := eventCorrelatorOptions()
	opts.Clock = clk
	c := record.NewEventCorrelatorWithOptions(opts)
	event := func(message string) *corev1.Event {
		return &corev1.Event{
			ObjectMeta:     metav1.ObjectMeta{Name: "c.1", Namespace: "ns"},
			InvolvedObject: corev1.ObjectReference{Kind: "PersistentVolumeClaim", Namespace: "ns", Name: "c", UID: "uid-c"},
			Source:         corev1.EventSource{Component: "csi-provisioner-binder"},
			Type:           corev1.EventTypeWarning, Reason: "FailedBinding", Message: message,
			FirstTimestamp: metav1.NewTime(clk.Now()), LastTimestamp: metav1.NewTime(clk.Now()), Count: 1,
		}
	}
	causes := []string{"cause A", "cause B"}
	for i := range 30 {
		if _, err := c.EventCorrelate(event(causes[i%2])); err != nil {
			t.Fatal(err)
		}
		clk.Step(2 * time.Second)
	}
	res, err := c.EventCorrelate(event("cause C"))
	if err != nil {
		t.Fatal(err)
	}
	if res.Skip {
		t.Error(`the correlator dropped the claim's current cause ("cause C") after 30 earlier events of other causes`)
	}
}
