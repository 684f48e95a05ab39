package events

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
)

// failReason is the reason of the events whose writes fail decides; the
// writes of other events always succeed.
const failReason = "Provisioning"

// apiEvents is an EventInterface that records the event writes the Writer
// makes; any other call panics (nil embedded interface).
type apiEvents struct {
	typedcorev1.EventInterface
	mu    sync.Mutex
	delay time.Duration
	// block makes every write wait until its context ends.
	block   bool
	fail    func(call int) error
	calls   int // writes of failReason events
	created []*corev1.Event
	patched []*corev1.Event
}

func (a *apiEvents) call(e *corev1.Event) error {
	if a.delay > 0 {
		time.Sleep(a.delay)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.fail == nil || e.Reason != failReason {
		return nil
	}
	a.calls++
	return a.fail(a.calls)
}

func (a *apiEvents) CreateWithEventNamespaceWithContext(ctx context.Context, e *corev1.Event) (*corev1.Event, error) {
	return a.record(ctx, &a.created, e)
}

func (a *apiEvents) PatchWithEventNamespaceWithContext(ctx context.Context, e *corev1.Event, _ []byte) (*corev1.Event, error) {
	return a.record(ctx, &a.patched, e)
}

// record makes a write of e: it fails, as a client's would, when ctx has
// ended (a.block holds it until then), or as a.fail decides, else appends
// a copy of e to *made.
func (a *apiEvents) record(ctx context.Context, made *[]*corev1.Event, e *corev1.Event) (*corev1.Event, error) {
	if a.block {
		<-ctx.Done()
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("post event: %w", err)
	}
	if err := a.call(e); err != nil {
		return nil, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	*made = append(*made, e.DeepCopy())
	return e, nil
}

func (a *apiEvents) counts() (calls, created, patched int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.calls, len(a.created), len(a.patched)
}

// lastCreated returns the reason of the last event created.
func (a *apiEvents) lastCreated() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.created) == 0 {
		return ""
	}
	return a.created[len(a.created)-1].Reason
}

// newStack runs w until the test ends and returns a recorder whose
// broadcaster writes through w to api, as the sidecar wires it.
func newStack(t *testing.T, w *Writer, api *apiEvents) record.EventRecorder {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { w.Run(ctx); close(done) }()
	b := record.NewBroadcaster(record.WithContext(ctx))
	b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: w.Wrap(api)})
	t.Cleanup(func() { b.Shutdown(); cancel(); <-done })
	return b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "test"})
}

func pvc(name string) *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("uid-" + name)}}
}

// waitFor polls cond for up to a minute.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestWriterWritesEveryEvent: events recorded at about 2500/s through an
// API that takes 1ms per write are all written (client-go's single writer
// manages 1000/s here and drops what exceeds its queue of 1000), and the
// events of each object in the order they were recorded.
func TestWriterWritesEveryEvent(t *testing.T) {
	const objects, perObject, perTick = 1000, 3, 25
	api := &apiEvents{delay: time.Millisecond}
	rec := newStack(t, NewWriter(api, WriterOptions{Workers: 8}), api)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	n := 0
	for o := range objects {
		for i := range perObject {
			if n++; n%perTick == 0 {
				<-tick.C
			}
			rec.Event(pvc(fmt.Sprintf("claim-%d", o)), corev1.EventTypeNormal, fmt.Sprintf("Step%d", i), "message")
		}
	}
	waitFor(t, "every event", func() bool { _, created, _ := api.counts(); return created == objects*perObject })

	api.mu.Lock()
	defer api.mu.Unlock()
	next := map[string]int{}
	for _, e := range api.created {
		if want := fmt.Sprintf("Step%d", next[e.InvolvedObject.Name]); e.Reason != want {
			t.Fatalf("%s: event %q written before %q", e.InvolvedObject.Name, e.Reason, want)
		}
		next[e.InvolvedObject.Name]++
	}
}

// TestWriterPatchesRepeats: the broadcaster still correlates: the same event
// twice is one create and one patch with count 2.
func TestWriterPatchesRepeats(t *testing.T) {
	api := &apiEvents{}
	rec := newStack(t, NewWriter(api, WriterOptions{Workers: 2}), api)
	rec.Event(pvc("c"), corev1.EventTypeWarning, "Failed", "same")
	waitFor(t, "the create", func() bool { _, created, _ := api.counts(); return created == 1 })
	rec.Event(pvc("c"), corev1.EventTypeWarning, "Failed", "same")
	waitFor(t, "the patch", func() bool { _, _, patched := api.counts(); return patched == 1 })
	api.mu.Lock()
	defer api.mu.Unlock()
	if got := api.patched[0].Count; got != 2 {
		t.Errorf("patched count = %d, want 2", got)
	}
	if len(api.created) != 1 {
		t.Errorf("%d creates, want 1", len(api.created))
	}
}

func TestWriterErrors(t *testing.T) {
	unreachable := errors.New("connection refused")
	tests := []struct {
		name        string
		fail        func(call int) error
		maxTries    int
		wantCalls   int
		wantCreated int
		wantDropped bool // OnDrop is told
	}{
		{name: "server unreachable, then back: retried until written",
			fail: func(call int) error {
				if call <= 2 {
					return unreachable
				}
				return nil
			},
			wantCalls: 3, wantCreated: 1},
		{name: "server unreachable for good: given up after MaxTries",
			fail: func(int) error { return unreachable }, maxTries: 4, wantCalls: 4, wantDropped: true},
		{name: "server overloaded (429), then not: retried",
			fail: func(call int) error {
				if call == 1 {
					return apierrors.NewTooManyRequests("busy", 1)
				}
				return nil
			},
			wantCalls: 2, wantCreated: 1},
		{name: "refused by the server: not retried",
			fail: func(int) error { return apierrors.NewBadRequest("bad event") }, wantCalls: 1},
		{name: "already exists: not retried",
			fail: func(int) error { return apierrors.NewAlreadyExists(corev1.Resource("events"), "e") }, wantCalls: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			api := &apiEvents{fail: tt.fail}
			var mu sync.Mutex
			var dropped []string
			onDrop := func(e *corev1.Event) { mu.Lock(); defer mu.Unlock(); dropped = append(dropped, e.Reason) }
			rec := newStack(t, NewWriter(api, WriterOptions{Workers: 1, RetryInterval: time.Millisecond, MaxTries: tt.maxTries, OnDrop: onDrop}), api)
			rec.Event(pvc("c"), corev1.EventTypeNormal, failReason, "m")
			// One worker writes in order: once the sentinel is written,
			// the first event is done with and the counts are final.
			rec.Event(pvc("c"), corev1.EventTypeNormal, "Sentinel", "m")
			waitFor(t, "the sentinel", func() bool { return api.lastCreated() == "Sentinel" })
			if calls, created, _ := api.counts(); calls != tt.wantCalls || created-1 != tt.wantCreated {
				t.Errorf("%d calls and %d creates, want %d and %d", calls, created-1, tt.wantCalls, tt.wantCreated)
			}
			mu.Lock()
			defer mu.Unlock()
			if want := map[bool][]string{true: {failReason}}[tt.wantDropped]; !slices.Equal(dropped, want) {
				t.Errorf("OnDrop told of %q, want %q", dropped, want)
			}
		})
	}
}

// TestWriterQueueFull: a queued write never blocks the broadcaster; what
// does not fit is dropped.
func TestWriterQueueFull(t *testing.T) {
	api := &apiEvents{}
	var dropped []string // enqueue runs on this goroutine
	w := NewWriter(api, WriterOptions{Workers: 1, QueueLength: 2, OnDrop: func(e *corev1.Event) { dropped = append(dropped, e.InvolvedObject.Name) }})
	sink := &typedcorev1.EventSinkImpl{Interface: w.Wrap(api)}
	for i := range 5 {
		e := &corev1.Event{InvolvedObject: corev1.ObjectReference{Namespace: "ns", Name: fmt.Sprintf("claim-%d", i)}, Reason: "Provisioning"}
		if _, err := sink.Create(e); err != nil {
			t.Fatal(err)
		}
	}
	if want := []string{"claim-2", "claim-3", "claim-4"}; !slices.Equal(dropped, want) {
		t.Errorf("OnDrop told of %q, want %q", dropped, want)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { w.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	waitFor(t, "the queued events", func() bool { _, created, _ := api.counts(); return created == 2 })
	// One worker, in order: had more been queued, they would come before
	// the sentinel.
	if _, err := sink.Create(&corev1.Event{InvolvedObject: corev1.ObjectReference{Name: "claim-0"}, Reason: "Sentinel"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the sentinel", func() bool { return api.lastCreated() == "Sentinel" })
	api.mu.Lock()
	defer api.mu.Unlock()
	var got []string
	for _, e := range api.created {
		got = append(got, e.InvolvedObject.Name+" "+e.Reason)
	}
	if want := []string{"claim-0 Provisioning", "claim-1 Provisioning", "claim-0 Sentinel"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("written %q, want %q", got, want)
	}
}

// TestWriterSupersedes: an event queued while an event it supersedes for
// the same object still waits makes the waiting one unwritten; events of
// other objects, and events already written, are not affected.
func TestWriterSupersedes(t *testing.T) {
	ev := func(claim, reason string) *corev1.Event {
		c := pvc(claim)
		return &corev1.Event{
			ObjectMeta:     metav1.ObjectMeta{Namespace: "ns", Name: claim + "." + reason},
			InvolvedObject: corev1.ObjectReference{Kind: "PersistentVolumeClaim", Namespace: c.Namespace, Name: c.Name, UID: c.UID},
			Reason:         reason,
		}
	}
	opts := WriterOptions{Workers: 2, Supersedes: map[string]string{"ProvisioningSucceeded": "Provisioning"}}
	for _, tc := range []struct {
		name string
		// queued are created while the Writer is not running yet; written
		// are then created one at a time, each after the one before is
		// written.
		queued, written [][2]string
		// queueLength is each worker's queue length, 0 for the default.
		queueLength int
		want        []string
	}{
		{
			name:   "waiting event superseded",
			queued: [][2]string{{"a", "Provisioning"}, {"b", "Provisioning"}, {"a", "ProvisioningSucceeded"}},
			want:   []string{"a/ProvisioningSucceeded", "b/Provisioning"},
		},
		{
			name:   "a failure does not supersede",
			queued: [][2]string{{"a", "Provisioning"}, {"a", "ProvisioningFailed"}},
			want:   []string{"a/Provisioning", "a/ProvisioningFailed"},
		},
		{
			name:    "written events stay",
			written: [][2]string{{"a", "Provisioning"}, {"a", "ProvisioningSucceeded"}},
			want:    []string{"a/Provisioning", "a/ProvisioningSucceeded"},
		},
		{
			name:        "a dropped event (the queue is full) supersedes nothing",
			queued:      [][2]string{{"a", "Provisioning"}, {"a", "ProvisioningSucceeded"}},
			queueLength: 1,
			want:        []string{"a/Provisioning"},
		},
		{
			name:   "superseded only once",
			queued: [][2]string{{"a", "Provisioning"}, {"a", "ProvisioningSucceeded"}, {"a", "ProvisioningSucceeded"}},
			want:   []string{"a/ProvisioningSucceeded", "a/ProvisioningSucceeded"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			api := &apiEvents{}
			o := opts
			o.QueueLength = tc.queueLength
			w := NewWriter(api, o)
			sink := w.Wrap(api)
			for _, q := range tc.queued {
				_, _ = sink.CreateWithEventNamespaceWithContext(t.Context(), ev(q[0], q[1]))
			}
			ctx, cancel := context.WithCancel(t.Context())
			done := make(chan struct{})
			go func() { w.Run(ctx); close(done) }()
			defer func() { cancel(); <-done }()
			n := len(tc.want) - len(tc.written)
			waitFor(t, "the queued events", func() bool { _, created, _ := api.counts(); return created >= n })
			for _, q := range tc.written {
				_, _ = sink.CreateWithEventNamespaceWithContext(t.Context(), ev(q[0], q[1]))
				n++
				waitFor(t, q[1], func() bool { _, created, _ := api.counts(); return created >= n })
			}

			api.mu.Lock()
			var got []string
			for _, e := range api.created {
				got = append(got, e.InvolvedObject.Name+"/"+e.Reason)
			}
			api.mu.Unlock()
			slices.Sort(got)
			if !slices.Equal(got, tc.want) {
				t.Errorf("written %v, want %v", got, tc.want)
			}
			if len(w.waiting) != 0 {
				t.Errorf("%d writes still recorded as waiting", len(w.waiting))
			}
		})
	}
}

// TestWriterStopping: a write cut short because the Writer stops is not
// logged as an error "will retry": no retry comes, the process is stopping.
func TestWriterStopping(t *testing.T) {
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
	ctx, cancel := context.WithCancel(klog.NewContext(t.Context(), logger))
	api := &apiEvents{fail: func(int) error { cancel(); return fmt.Errorf("post event: %w", context.Canceled) }}
	w := NewWriter(api, WriterOptions{Workers: 1, RetryInterval: time.Hour})
	e := &corev1.Event{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c.1"}, Reason: failReason,
		InvolvedObject: corev1.ObjectReference{Kind: "PersistentVolumeClaim", Namespace: "ns", Name: "c"}}
	w.write(ctx, ctx, write{event: e})
	log := logger.GetSink().(ktesting.Underlier).GetBuffer().String()
	if strings.Contains(log, "Cannot write event") || !strings.Contains(log, "Event not written: stopping") {
		t.Errorf("log of a write cut short by the stop:\n%s", log)
	}
	if calls, _, _ := api.counts(); calls != 1 {
		t.Errorf("%d write calls, want 1", calls)
	}
}

// TestWriterNamespaceTerminating: the API server refuses every event in a
// namespace being deleted. A Warning is the only explanation of a claim
// that a finalizer keeps there, so it is logged at the default verbosity,
// with the object, reason and message; a Normal event is not.
func TestWriterNamespaceTerminating(t *testing.T) {
	terminating := apierrors.NewForbidden(corev1.Resource("events"), "", errors.New("unable to create new content in namespace ns because it is being terminated"))
	terminating.ErrStatus.Details.Causes = append(terminating.ErrStatus.Details.Causes,
		metav1.StatusCause{Type: corev1.NamespaceTerminatingCause, Message: "namespace ns is being terminated", Field: "metadata.namespace"})
	tests := []struct {
		name     string
		typ      string
		wantLine bool
	}{
		{name: "Warning: logged", typ: corev1.EventTypeWarning, wantLine: true},
		{name: "Normal: not logged", typ: corev1.EventTypeNormal},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true), ktesting.Verbosity(0)))
			ctx := klog.NewContext(t.Context(), logger)
			api := &apiEvents{fail: func(int) error { return terminating }}
			w := NewWriter(api, WriterOptions{Workers: 1, RetryInterval: time.Hour})
			e := &corev1.Event{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c.1"}, Type: tt.typ, Reason: failReason,
				Message:        "finalizer stays so that a volume cannot leak",
				InvolvedObject: corev1.ObjectReference{Kind: "PersistentVolumeClaim", Namespace: "ns", Name: "c"}}
			w.write(ctx, ctx, write{event: e})
			log := logger.GetSink().(ktesting.Underlier).GetBuffer().String()
			line := strings.Contains(log, "Warning event not written: its namespace is being deleted") &&
				strings.Contains(log, `object="ns/c"`) && strings.Contains(log, `reason="`+failReason+`"`) &&
				strings.Contains(log, `message="finalizer stays so that a volume cannot leak"`)
			if line != tt.wantLine || (!tt.wantLine && log != "") {
				t.Errorf("log at verbosity 0, want the event's line %v:\n%s", tt.wantLine, log)
			}
			if calls, _, _ := api.counts(); calls != 1 {
				t.Errorf("%d write calls, want 1 (no retry)", calls)
			}
		})
	}
}

// TestWriterDrains: events still queued when Run's context ends are
// written before Run returns, within the drain timeout; with an API server
// that does not answer, Run returns once the drain timeout is over and
// says how many events were not written.
func TestWriterDrains(t *testing.T) {
	tests := []struct {
		name        string
		api         *apiEvents
		reason      string
		drain       time.Duration
		wantCreated int
		wantLog     string
	}{
		{name: "all written", api: &apiEvents{delay: 5 * time.Millisecond}, drain: time.Minute, wantCreated: 20},
		{name: "API server does not answer", api: &apiEvents{block: true}, drain: 50 * time.Millisecond, wantLog: "Events not written: stopping"},
		{name: "no drain", api: &apiEvents{delay: 5 * time.Millisecond}, drain: -1, wantLog: "Events not written: stopping"},
		// A failed write during the drain is not retried, and not logged
		// as an error that will be.
		{name: "API server unreachable", api: &apiEvents{fail: func(int) error { return errors.New("connection refused") }}, reason: failReason,
			drain: time.Minute, wantLog: "Event not written: stopping"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
			ctx, cancel := context.WithCancel(klog.NewContext(t.Context(), logger))
			w := NewWriter(tt.api, WriterOptions{Workers: 1, DrainTimeout: tt.drain})
			q := w.Wrap(tt.api)
			for i := range 20 {
				reason := cmp.Or(tt.reason, "ProvisioningSucceeded")
				e := &corev1.Event{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: fmt.Sprintf("c.%d", i)}, Reason: reason,
					InvolvedObject: corev1.ObjectReference{Kind: "PersistentVolumeClaim", Namespace: "ns", Name: fmt.Sprintf("c%d", i)}}
				if _, err := q.CreateWithEventNamespaceWithContext(ctx, e); err != nil {
					t.Fatal(err)
				}
			}
			cancel()
			start := time.Now()
			w.Run(ctx)
			if _, created, _ := tt.api.counts(); created != tt.wantCreated {
				t.Errorf("%d events written, want %d", created, tt.wantCreated)
			}
			if tt.drain > 0 && tt.drain < time.Minute && time.Since(start) > tt.drain+10*time.Second {
				t.Errorf("Run returned %v after the stop, drain timeout %v", time.Since(start), tt.drain)
			}
			log := logger.GetSink().(ktesting.Underlier).GetBuffer().String()
			if !strings.Contains(log, tt.wantLog) || strings.Contains(log, "will retry") {
				t.Errorf("log does not contain %q, or says an event will be retried:\n%s", tt.wantLog, log)
			}
		})
	}
}
