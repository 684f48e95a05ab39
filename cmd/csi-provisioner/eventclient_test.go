package main

import (
	"context"
	"fmt"
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
