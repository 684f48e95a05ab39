package events

import (
	"context"
	"errors"
	"hash/fnv"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	restclient "k8s.io/client-go/rest"
	"k8s.io/klog/v2"
)

// WriterOptions tune a [Writer]; the zero value gives the defaults.
type WriterOptions struct {
	// Workers is the number of events written at the same time; default 8.
	Workers int
	// QueueLength is the number of events waiting per worker before new
	// ones are dropped (with an error log); default 2048.
	QueueLength int
	// RetryInterval is the wait between two attempts to write an event
	// when the API server cannot be reached; default 10s, as client-go.
	RetryInterval time.Duration
	// MaxTries is the number of attempts per event; default 12, as
	// client-go.
	MaxTries int
	// DrainTimeout is how long Run goes on writing, once its context is
	// done, the events still queued and those being written, one try each,
	// so that the events of a sidecar's last moments (a claim provisioned
	// just before a rolling update) are not lost; default 2s, negative:
	// stop at once.
	DrainTimeout time.Duration
	// Supersedes maps an event reason to an earlier reason of the same
	// object that it makes redundant: when an event with the key's reason
	// is queued while one with the value's reason for the same object is
	// still waiting to be written, the waiting one is not written. Events
	// already written, or being written, are never affected, so with the
	// API server keeping up every event is written.
	Supersedes map[string]string
	// OnDrop, when set, is called with each event the Writer gives up on
	// while it runs: its queue was full, or the API server could not be
	// reached in MaxTries attempts. A recorder that drops repetitions
	// ([Deduplicator.Unwritten]) must learn that the event was never
	// written. It is not called for an event the API server refused (a
	// retry would be refused too), one superseded by a later event, or
	// one left when Run stops. It runs on the caller's or a worker's
	// goroutine and must not block.
	OnDrop func(*corev1.Event)
}

// Writer writes events to the API server from several workers.
//
// client-go's event broadcaster writes to its sink one event at a time and
// silently drops what does not fit its queue of 1000: when a sidecar
// provisions faster than about one event per API round trip, the events
// that explain a claim are lost. The provisioning library creates its own
// broadcaster, so the fix has to sit below the sink: [Writer.Wrap] returns
// an EventInterface whose event writes only queue the write and return at
// once, and the Writer's workers then write, retrying while the API server
// cannot be reached. The broadcasters still correlate (aggregate, count,
// filter spam) as usual. All writes about one object go to the same worker,
// in the order they were made.
type Writer struct {
	client typedcorev1.EventInterface
	opts   WriterOptions
	queues []chan write
	wg     sync.WaitGroup

	// supersedable holds the reasons that opts.Supersedes names as
	// superseded; waiting holds the queued writes of such events, by object
	// and reason.
	supersedable map[string]bool
	mu           sync.Mutex
	waiting      map[waitKey]*atomic.Bool

	// stopping is set once Run's context is done: a failed write is then
	// not retried.
	stopping atomic.Bool
}

// write is one queued event write: a create, or a patch of a repeated event.
type write struct {
	event *corev1.Event
	patch []byte // nil for a create
	// superseded is set for a write a later event may supersede; true
	// means: do not write.
	superseded *atomic.Bool
}

type waitKey struct {
	object corev1.ObjectReference
	reason string
}

func keyOf(e *corev1.Event, reason string) waitKey {
	o := e.InvolvedObject
	return waitKey{object: corev1.ObjectReference{Kind: o.Kind, Namespace: o.Namespace, Name: o.Name, UID: o.UID}, reason: reason}
}

// NewWriter returns a Writer that writes with client (its namespace does not
// matter: events are written to their own namespace). Run starts it.
func NewWriter(client typedcorev1.EventInterface, opts WriterOptions) *Writer {
	if opts.Workers <= 0 {
		opts.Workers = 8
	}
	if opts.QueueLength <= 0 {
		opts.QueueLength = 2048
	}
	if opts.RetryInterval <= 0 {
		opts.RetryInterval = 10 * time.Second
	}
	if opts.MaxTries <= 0 {
		opts.MaxTries = 12
	}
	if opts.DrainTimeout == 0 {
		opts.DrainTimeout = 2 * time.Second
	}
	w := &Writer{client: client, opts: opts, queues: make([]chan write, opts.Workers),
		supersedable: map[string]bool{}, waiting: map[waitKey]*atomic.Bool{}}
	for _, earlier := range opts.Supersedes {
		w.supersedable[earlier] = true
	}
	for i := range w.queues {
		w.queues[i] = make(chan write, opts.QueueLength)
	}
	return w
}

// Wrap returns events whose event writes (CreateWithEventNamespace and
// PatchWithEventNamespace, which client-go's event sink calls, and their
// WithContext forms) queue the write on w and report success at once.
// Everything else goes to events.
func (w *Writer) Wrap(events typedcorev1.EventInterface) typedcorev1.EventInterface {
	return queued{EventInterface: events, w: w}
}

type queued struct {
	typedcorev1.EventInterface
	w *Writer
}

func (q queued) CreateWithEventNamespace(e *corev1.Event) (*corev1.Event, error) {
	return q.CreateWithEventNamespaceWithContext(context.Background(), e)
}

func (q queued) CreateWithEventNamespaceWithContext(_ context.Context, e *corev1.Event) (*corev1.Event, error) {
	q.w.enqueue(write{event: e.DeepCopy()})
	return e, nil
}

func (q queued) PatchWithEventNamespace(e *corev1.Event, data []byte) (*corev1.Event, error) {
	return q.PatchWithEventNamespaceWithContext(context.Background(), e, data)
}

func (q queued) PatchWithEventNamespaceWithContext(_ context.Context, e *corev1.Event, data []byte) (*corev1.Event, error) {
	q.w.enqueue(write{event: e.DeepCopy(), patch: data})
	return e, nil
}

// enqueue never blocks: a write that does not fit is dropped and logged,
// and then supersedes nothing.
func (w *Writer) enqueue(wr write) {
	w.track(&wr)
	select {
	case w.queues[w.shard(wr.event)] <- wr:
		w.supersede(wr.event)
	default:
		w.done(wr)
		e := wr.event
		klog.Background().Error(errors.New("event queue full"), "Dropping event",
			"object", klog.KRef(e.InvolvedObject.Namespace, e.InvolvedObject.Name), "kind", e.InvolvedObject.Kind,
			"type", e.Type, "reason", e.Reason)
		w.dropped(e)
	}
}

// dropped tells opts.OnDrop about an event given up.
func (w *Writer) dropped(e *corev1.Event) {
	if w.opts.OnDrop != nil {
		w.opts.OnDrop(e)
	}
}

// Run writes queued events until ctx is done, then for up to
// opts.DrainTimeout the events still queued, and returns once every worker
// stopped. Writes use a context that ends with the drain, so a write under
// way when ctx ends is finished too; a write waiting to be retried is not
// tried again. Events queued after a worker emptied its queue, or left
// when the drain ends, are not written (logged with their number).
func (w *Writer) Run(ctx context.Context) {
	writeCtx, stopWrites := context.WithCancel(context.WithoutCancel(ctx))
	defer stopWrites()
	w.stopping.Store(ctx.Err() != nil)
	context.AfterFunc(ctx, func() { w.stopping.Store(true) })
	if w.opts.DrainTimeout > 0 {
		context.AfterFunc(ctx, func() { time.AfterFunc(w.opts.DrainTimeout, stopWrites) })
	} else {
		// No drain: the writes stop with ctx, and drain finds writeCtx
		// done.
		stopWrites()
		writeCtx = ctx
	}
	for _, q := range w.queues {
		w.wg.Go(func() {
			for {
				select {
				case <-ctx.Done():
					w.drain(writeCtx, q)
					return
				case wr := <-q:
					if w.done(wr) {
						w.write(ctx, writeCtx, wr)
					}
				}
			}
		})
	}
	w.wg.Wait()
}

// drain writes what q holds, one try each, until q is empty or ctx ends.
func (w *Writer) drain(ctx context.Context, q chan write) {
	for {
		select {
		case wr := <-q:
			if ctx.Err() != nil {
				klog.FromContext(ctx).Info("Events not written: stopping", "events", len(q)+1)
				return
			}
			if w.done(wr) {
				w.writeOnce(ctx, wr)
			}
		default:
			return
		}
	}
}

// track records wr, if its reason can be superseded, as waiting, so that
// a later event can mark it unwritten.
func (w *Writer) track(wr *write) {
	if !w.supersedable[wr.event.Reason] {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	wr.superseded = &atomic.Bool{}
	w.waiting[keyOf(wr.event, wr.event.Reason)] = wr.superseded
}

// supersede marks the waiting write that e supersedes (Supersedes), if
// any, as not to be written. It runs once e is queued.
func (w *Writer) supersede(e *corev1.Event) {
	earlier, supersedes := w.opts.Supersedes[e.Reason]
	if !supersedes {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	k := keyOf(e, earlier)
	if flag := w.waiting[k]; flag != nil {
		flag.Store(true)
		delete(w.waiting, k)
		klog.Background().V(5).Info("Event superseded before it was written", "object", klog.KRef(e.InvolvedObject.Namespace, e.InvolvedObject.Name), "reason", earlier, "by", e.Reason)
	}
}

// done takes wr off the waiting writes and reports whether it is still to
// be written.
func (w *Writer) done(wr write) bool {
	if wr.superseded == nil {
		return true
	}
	w.mu.Lock()
	k := keyOf(wr.event, wr.event.Reason)
	if w.waiting[k] == wr.superseded {
		delete(w.waiting, k)
	}
	w.mu.Unlock()
	return !wr.superseded.Load()
}

func (w *Writer) shard(e *corev1.Event) int {
	h := fnv.New32a()
	ref := e.InvolvedObject
	_, _ = h.Write([]byte(ref.Kind + "/" + ref.Namespace + "/" + ref.Name + "/" + string(ref.UID)))
	return int(h.Sum32() % uint32(len(w.queues)))
}

// write makes wr with writeCtx, retrying while the API server cannot be
// reached, until stop ends.
func (w *Writer) write(stop, writeCtx context.Context, wr write) {
	for try := 1; ; try++ {
		if w.writeOnce(writeCtx, wr) {
			return
		}
		if try >= w.opts.MaxTries {
			eventLogger(writeCtx, wr.event).Error(nil, "Giving up writing event", "tries", try)
			w.dropped(wr.event)
			return
		}
		wait := w.opts.RetryInterval
		if try == 1 {
			// Spread the first retry, so that clients do not all retry at
			// the same moment after an API server outage.
			wait = time.Duration(rand.Float64() * float64(wait))
		}
		select {
		case <-stop.Done():
			eventLogger(writeCtx, wr.event).V(2).Info("Event not written: stopping", "tries", try)
			return
		case <-time.After(wait):
		}
	}
}

// eventLogger returns the logger for a failed write of e. It is built only
// when a write fails: most writes succeed, and the values cost allocations.
func eventLogger(ctx context.Context, e *corev1.Event) klog.Logger {
	return klog.FromContext(ctx).WithValues("object", klog.KRef(e.InvolvedObject.Namespace, e.InvolvedObject.Name), "reason", e.Reason)
}

// writeOnce patches a repeated event (creating it if the earlier copy is
// gone) or creates a new one. It reports whether the write is done with:
// made, or refused for a reason a retry would not change. wr.event is the
// Writer's own copy (see queued), so it is changed in place.
func (w *Writer) writeOnce(ctx context.Context, wr write) bool {
	var err error
	if wr.patch != nil {
		_, err = w.client.PatchWithEventNamespaceWithContext(ctx, wr.event, wr.patch)
	}
	if wr.patch == nil || apierrors.IsNotFound(err) {
		wr.event.ResourceVersion = ""
		_, err = w.client.CreateWithEventNamespaceWithContext(ctx, wr.event)
	}
	if err == nil {
		return true
	}
	logger := eventLogger(ctx, wr.event)
	if ctx.Err() != nil {
		// Run is stopping (the process shuts down or lost its
		// leadership): no retry will come, and the write's error is
		// only the cancellation.
		logger.V(2).Info("Event not written: stopping", "err", err)
		return true
	}
	var construction *restclient.RequestConstructionError
	var status *apierrors.StatusError
	switch {
	case errors.As(err, &construction):
		logger.Error(err, "Cannot build the event request, dropping the event")
		return true
	case apierrors.IsTooManyRequests(err) || apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) ||
		apierrors.IsInternalError(err) || apierrors.IsServiceUnavailable(err):
		// The server is overloaded or restarting: worth another try
		// (client-go's writer drops these).
	case errors.As(err, &status):
		switch {
		case apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause) && wr.event.Type == corev1.EventTypeWarning:
			// No event can be written in a namespace being deleted, and
			// what keeps one of its claims (an in-flight finalizer) is
			// explained only by such a Warning: keep it in the log.
			logger.Info("Warning event not written: its namespace is being deleted", "message", wr.event.Message)
		case apierrors.IsAlreadyExists(err) || apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause):
			logger.V(5).Info("Event refused by the API server", "err", err)
		default:
			logger.Error(err, "Event refused by the API server, dropping it")
		}
		return true
	}
	if w.stopping.Load() {
		logger.V(2).Info("Event not written: stopping", "err", err)
		return true
	}
	logger.Error(err, "Cannot write event, will retry")
	return false
}
