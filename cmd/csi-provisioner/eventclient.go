package main

import (
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/kube-storage/csi-provisioner/internal/events"
)

// supersededEvents: the provisioning library's "Provisioning" event of a
// claim (sent before CreateVolume) tells nothing more once the claim's
// "ProvisioningSucceeded" is queued too. When the API server is behind and
// the first still waits to be written, only the second is: one event write
// per volume less under load, the same two events otherwise. Failures
// supersede nothing.
var supersededEvents = map[string]string{"ProvisioningSucceeded": "Provisioning"}

// unwrittenEvents tells the recorders that drop repeated causes
// (newRecorder's deduplicators) about the events the writer gave up on
// (events.WriterOptions.OnDrop): after an API server outage longer than
// the writer's retries, the cause of a Pending claim is posted again at
// its next repetition instead of 30 minutes later.
type unwrittenEvents struct {
	mu       sync.Mutex
	dedupers []*events.Deduplicator
}

func (u *unwrittenEvents) add(d *events.Deduplicator) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.dedupers = append(u.dedupers, d)
}

func (u *unwrittenEvents) dropped(e *corev1.Event) {
	u.mu.Lock()
	dedupers := u.dedupers
	u.mu.Unlock()
	for _, d := range dedupers {
		d.Unwritten(e)
	}
}

// eventSplitClient is a clientset whose event writes go through a second
// clientset with a rate limiter of its own, queued on an events.Writer. On
// a shared budget events would delay volume writes, and volume writes would
// delay the events that explain a Pending claim; written one at a time by
// client-go's broadcasters (ours and the provisioning library's own), they
// are dropped under load. The provisioner library takes one clientset for
// both, so this wrapper routes only CoreV1().Events.
type eventSplitClient struct {
	kubernetes.Interface
	core typedcorev1.CoreV1Interface
}

// newEventSplitClient returns main with CoreV1().Events served by eventClient
// through w. The CoreV1 wrapper is built once, not on every request.
func newEventSplitClient(main, eventClient kubernetes.Interface, w *events.Writer) eventSplitClient {
	return eventSplitClient{
		Interface: main,
		core:      coreV1WithEvents{CoreV1Interface: main.CoreV1(), events: eventClient.CoreV1(), writer: w},
	}
}

func (c eventSplitClient) CoreV1() typedcorev1.CoreV1Interface { return c.core }

type coreV1WithEvents struct {
	typedcorev1.CoreV1Interface
	events typedcorev1.CoreV1Interface
	writer *events.Writer
}

func (c coreV1WithEvents) Events(namespace string) typedcorev1.EventInterface {
	return c.writer.Wrap(c.events.Events(namespace))
}

// broadcasterFlushTimeout bounds how long Shutdown of the sidecar's
// broadcaster waits for the events recorded before it to reach the writer.
// They are only correlated and queued on the way, microseconds each, so
// this is reached only when the marker could not be recorded.
const broadcasterFlushTimeout = 2 * time.Second

// flushingBroadcaster is the sidecar's event broadcaster (newBroadcaster).
// client-go's Shutdown closes the broadcaster and ends the goroutine that
// hands recorded events to the sink without waiting for the events still
// buffered for it: of a burst recorded just before a stop, most were never
// queued on the events.Writer and so never written. Shutdown therefore
// first records a marker event and waits until the sink receives it: the
// goroutine hands events over one at a time, in the order they were
// recorded, so every event recorded before Shutdown is queued by then. The
// marker itself is not written.
type flushingBroadcaster struct {
	record.EventBroadcaster
	sink   *markerSink
	logger klog.Logger
}

// Shutdown waits (up to broadcasterFlushTimeout) until the events recorded
// before the call are queued on the writer, then shuts the broadcaster
// down.
func (b *flushingBroadcaster) Shutdown() {
	uid := uuid.NewUUID()
	arrived := b.sink.expect(uid)
	marker := &corev1.ObjectReference{Kind: "Marker", Namespace: "default", Name: "flush", UID: uid}
	b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "csi-provisioner-flush"}).
		Event(marker, corev1.EventTypeNormal, "Flush", "events recorded before this one are queued")
	select {
	case <-arrived:
	case <-time.After(broadcasterFlushTimeout):
		b.logger.Info("Stopping the event broadcaster before its recorded events reached the writer", "timeout", broadcasterFlushTimeout)
	}
	b.EventBroadcaster.Shutdown()
}

// markerSink is an event sink that passes events on to its EventSink,
// except the marker it expects, whose arrival it only reports.
type markerSink struct {
	record.EventSink
	mu      sync.Mutex
	uid     types.UID
	arrived chan struct{}
}

// expect makes uid the marker and returns a channel closed when an event
// about it reaches the sink.
func (s *markerSink) expect(uid types.UID) <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.uid, s.arrived = uid, make(chan struct{})
	return s.arrived
}

func (s *markerSink) Create(e *corev1.Event) (*corev1.Event, error) {
	s.mu.Lock()
	if s.arrived != nil && e.InvolvedObject.UID == s.uid {
		close(s.arrived)
		s.arrived = nil
		s.mu.Unlock()
		return e, nil
	}
	s.mu.Unlock()
	return s.EventSink.Create(e)
}
