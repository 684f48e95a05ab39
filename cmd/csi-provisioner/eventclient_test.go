package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kube-storage/csi-provisioner/internal/events"
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
			recorder := newRecorder(b, "external-provisioner")
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
