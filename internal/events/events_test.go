package events

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
)

// recorder records what reaches it.
type recorder struct {
	mu     sync.Mutex
	events []string
}

var _ record.EventRecorder = (*recorder)(nil)

func (r *recorder) Event(object runtime.Object, eventtype, reason, message string) {
	m, _ := metaName(object)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, fmt.Sprintf("%s %s %s %s", m, eventtype, reason, message))
}

func (r *recorder) Eventf(object runtime.Object, eventtype, reason, messageFmt string, args ...interface{}) {
	r.Event(object, eventtype, reason, fmt.Sprintf(messageFmt, args...))
}

func (r *recorder) AnnotatedEventf(object runtime.Object, _ map[string]string, eventtype, reason, messageFmt string, args ...interface{}) {
	r.Event(object, eventtype, reason, fmt.Sprintf(messageFmt, args...))
}

func metaName(object runtime.Object) (string, bool) {
	switch o := object.(type) {
	case *corev1.PersistentVolumeClaim:
		return o.Name, true
	case *corev1.ObjectReference:
		return o.Name, true
	}
	return "?", false
}

func claim(name, uid string) *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID(uid)}}
}

type step struct {
	after   time.Duration // the clock moves by this before recording
	forget  string        // UID to forget before recording, if any
	note    bool          // Note the event instead of recording it
	obj     runtime.Object
	typ     string
	reason  string
	message string
	want    bool // forwarded
}

func TestDeduplicator(t *testing.T) {
	a, b := claim("a", "uid-a"), claim("b", "uid-b")
	aRecreated := claim("a", "uid-a2")
	noUID := claim("n", "")
	tests := []struct {
		name  string
		max   int
		steps []step
	}{
		{name: "first event is forwarded, repeat is dropped", steps: []step{
			{obj: a, typ: "Normal", reason: "R", message: "m", want: true},
			{obj: a, typ: "Normal", reason: "R", message: "m"},
			{obj: a, typ: "Normal", reason: "R", message: "m"},
		}},
		{name: "a different message, reason or type is forwarded", steps: []step{
			{obj: a, typ: "Normal", reason: "R", message: "m", want: true},
			{obj: a, typ: "Normal", reason: "R", message: "m2", want: true},
			{obj: a, typ: "Normal", reason: "R2", message: "m2", want: true},
			{obj: a, typ: "Warning", reason: "R2", message: "m2", want: true},
			{obj: a, typ: "Warning", reason: "R2", message: "m2"},
		}},
		{name: "only the last event counts (A B A is three events)", steps: []step{
			{obj: a, typ: "Normal", reason: "R", message: "1", want: true},
			{obj: a, typ: "Normal", reason: "R", message: "2", want: true},
			{obj: a, typ: "Normal", reason: "R", message: "1", want: true},
		}},
		{name: "objects are independent, by UID", steps: []step{
			{obj: a, typ: "Normal", reason: "R", message: "m", want: true},
			{obj: b, typ: "Normal", reason: "R", message: "m", want: true},
			{obj: aRecreated, typ: "Normal", reason: "R", message: "m", want: true},
			{obj: a, typ: "Normal", reason: "R", message: "m"},
		}},
		{name: "forget makes the same event new again", steps: []step{
			{obj: a, typ: "Normal", reason: "R", message: "m", want: true},
			{forget: "uid-a", obj: a, typ: "Normal", reason: "R", message: "m", want: true},
			{forget: "uid-b", obj: a, typ: "Normal", reason: "R", message: "m"},
		}},
		{name: "an object without UID is keyed by name", steps: []step{
			{obj: noUID, typ: "Normal", reason: "R", message: "m", want: true},
			{obj: noUID, typ: "Normal", reason: "R", message: "m"},
		}},
		{name: "object references are keyed by their UID", steps: []step{
			{obj: &corev1.ObjectReference{Name: "a", UID: "uid-a"}, typ: "Normal", reason: "R", message: "m", want: true},
			{obj: a, typ: "Normal", reason: "R", message: "m"},
		}},
		{name: "a repetition is forwarded again after RefreshInterval, from the last forwarded one", steps: []step{
			{obj: a, typ: "Warning", reason: "R", message: "m", want: true},
			{after: RefreshInterval - time.Second, obj: a, typ: "Warning", reason: "R", message: "m"},
			{after: time.Second, obj: a, typ: "Warning", reason: "R", message: "m", want: true},
			{after: RefreshInterval / 2, obj: a, typ: "Warning", reason: "R", message: "m"},
			{after: RefreshInterval / 2, obj: a, typ: "Warning", reason: "R", message: "m", want: true},
			{obj: b, typ: "Warning", reason: "R", message: "m", want: true},
			{after: RefreshInterval - time.Second, obj: a, typ: "Warning", reason: "R", message: "m"},
		}},
		{name: "a noted event is not forwarded, and silences the same one until RefreshInterval", steps: []step{
			{note: true, obj: a, typ: "Warning", reason: "R", message: "m"},
			{obj: a, typ: "Warning", reason: "R", message: "m"},
			{obj: b, typ: "Warning", reason: "R", message: "m", want: true},
			{after: RefreshInterval - time.Second, obj: a, typ: "Warning", reason: "R", message: "m"},
			{after: time.Second, obj: a, typ: "Warning", reason: "R", message: "m", want: true},
			{note: true, obj: a, typ: "Warning", reason: "R", message: "other"},
			{obj: a, typ: "Warning", reason: "R", message: "m", want: true},
		}},
		{name: "bounded: the least recently used object is forgotten once RefreshInterval old", max: 2, steps: []step{
			{obj: a, typ: "Normal", reason: "R", message: "m", want: true},
			{obj: b, typ: "Normal", reason: "R", message: "m", want: true},
			{obj: a, typ: "Normal", reason: "R", message: "m", after: RefreshInterval, want: true}, // a is now the most recent
			{obj: aRecreated, typ: "Normal", reason: "R", message: "m", want: true},                // evicts b, old enough
			{obj: a, typ: "Normal", reason: "R", message: "m"},
			{obj: b, typ: "Normal", reason: "R", message: "m", want: true},
		}},
		{name: "bounded: a recent entry is kept beyond the limit", max: 1, steps: []step{
			{obj: a, typ: "Normal", reason: "R", message: "m", want: true},
			{obj: b, typ: "Normal", reason: "R", message: "m", want: true}, // a is recent: kept
			{obj: a, typ: "Normal", reason: "R", message: "m"},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			next := &recorder{}
			d := NewDeduplicator(next, tt.max)
			now := time.Date(2026, 11, 23, 0, 0, 0, 0, time.UTC)
			d.now = func() time.Time { return now }
			for i, s := range tt.steps {
				now = now.Add(s.after)
				if s.forget != "" {
					d.Forget(types.UID(s.forget))
				}
				before := len(next.events)
				if repeats := d.Repeats(s.obj, s.typ, s.reason, s.message); !s.note && repeats == s.want {
					t.Errorf("step %d (%s %s %q): Repeats = %v, want %v", i, s.typ, s.reason, s.message, repeats, !s.want)
				}
				// Alternate the three entry points; they share one memory.
				switch {
				case s.note:
					d.Note(s.obj, s.typ, s.reason, s.message)
				case i%3 == 0:
					d.Event(s.obj, s.typ, s.reason, s.message)
				case i%3 == 1:
					d.Eventf(s.obj, s.typ, s.reason, "%s", s.message)
				default:
					d.AnnotatedEventf(s.obj, map[string]string{"k": "v"}, s.typ, s.reason, "%s", s.message)
				}
				if got := len(next.events) > before; got != s.want {
					t.Errorf("step %d (%s %s %q): forwarded = %v, want %v", i, s.typ, s.reason, s.message, got, s.want)
				}
			}
			if tt.max > 0 && d.Len() > hardMaxFactor*tt.max {
				t.Errorf("remembers %d objects, hard limit %d", d.Len(), hardMaxFactor*tt.max)
			}
		})
	}
}

func TestDeduplicatorConcurrent(t *testing.T) {
	next := &recorder{}
	d := NewDeduplicator(next, 0)
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for j := range 100 {
				d.Event(claim("c", fmt.Sprintf("uid-%d", j%10)), "Normal", "R", "same")
			}
		})
	}
	wg.Wait()
	if len(next.events) != 10 {
		t.Errorf("forwarded %d events, want one per object (10)", len(next.events))
	}
}

// TestDeduplicatorUnwritten: an event the writer gave up on is forgotten if
// it is still the last one remembered for its object, so that its next
// repetition is forwarded; any other event leaves the memory as it is.
func TestDeduplicatorUnwritten(t *testing.T) {
	claim := pvc("c")
	ref := corev1.ObjectReference{Kind: "PersistentVolumeClaim", Namespace: "ns", Name: "c", UID: claim.UID}
	unwritten := func(reason, message string) *corev1.Event {
		return &corev1.Event{InvolvedObject: ref, Type: corev1.EventTypeWarning, Reason: reason, Message: message}
	}
	tests := []struct {
		name        string
		unwritten   *corev1.Event
		wantRepeats bool
	}{
		{name: "the last event: forgotten", unwritten: unwritten("ProvisioningFailed", "no space")},
		{name: "the last event, aggregated by client-go's correlator: forgotten", unwritten: unwritten("ProvisioningFailed", "(combined from similar events): no space")},
		{name: "an earlier event: kept", unwritten: unwritten("ProvisioningFailed", "older cause"), wantRepeats: true},
		{name: "another object's: kept", unwritten: &corev1.Event{InvolvedObject: corev1.ObjectReference{UID: "other"}, Type: corev1.EventTypeWarning, Reason: "ProvisioningFailed", Message: "no space"}, wantRepeats: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := NewDeduplicator(record.NewFakeRecorder(10), 0)
			d.Event(claim, corev1.EventTypeWarning, "ProvisioningFailed", "older cause")
			d.Event(claim, corev1.EventTypeWarning, "ProvisioningFailed", "no space")
			d.Unwritten(tt.unwritten)
			if got := d.Repeats(claim, corev1.EventTypeWarning, "ProvisioningFailed", "no space"); got != tt.wantRepeats {
				t.Errorf("Repeats = %v, want %v", got, tt.wantRepeats)
			}
		})
	}
}

// TestDeduplicatorManyPendingClaims: the binder records the unchanged cause
// of every pending claim at each 15 s resync, in a lister's random order.
// With more claims than the limit, ten resyncs (2.5 minutes, far inside
// RefreshInterval) post each cause once: forgetting recent entries would
// post nearly every repetition (62,269 events for 12,000 claims before).
func TestDeduplicatorManyPendingClaims(t *testing.T) {
	const claims = DefaultMaxObjects * 6 / 5
	now := time.Unix(1_700_000_000, 0)
	next := &recorder{}
	d := NewDeduplicator(next, 0, WithNow(func() time.Time { return now }))
	order := make([]int, claims)
	for i := range order {
		order[i] = i
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 10 {
		rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		for _, i := range order {
			d.Event(claim(fmt.Sprintf("c%d", i), fmt.Sprintf("uid-%d", i)), "Normal", "ExternalProvisioning", "Waiting for a volume to be created")
		}
		now = now.Add(15 * time.Second)
	}
	if len(next.events) != claims {
		t.Errorf("%d events forwarded for %d claims in 10 resyncs with one unchanged cause each, want %d", len(next.events), claims, claims)
	}
}
