// Package events reports each cause of a Kubernetes event once.
//
// Controllers retry: a claim that cannot be provisioned is synced again and
// again, and a plain [record.EventRecorder] would post the same Warning on
// every attempt. [Deduplicator] wraps a recorder and forwards an event for an
// object only when its (type, reason, message) differs from the last event it
// forwarded for that object, or when that one was forwarded more than
// [RefreshInterval] ago: the API server drops events after its --event-ttl
// (one hour by default), and a claim that stays Pending for a day must still
// say why. It is shared by the binder and the provisioner.
//
// [Writer] writes the events of a broadcaster to the API server from
// several workers, so that a busy sidecar does not drop them.
package events

import (
	"container/list"
	"fmt"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
)

// DefaultMaxObjects is the number of objects whose last event a
// [Deduplicator] remembers when it is given no positive limit; beyond it,
// only entries older than RefreshInterval are forgotten, up to
// hardMaxFactor times the limit.
const DefaultMaxObjects = 10000

// hardMaxFactor bounds a Deduplicator at this many times its limit of
// objects, however recent their entries.
const hardMaxFactor = 10

// RefreshInterval is how long a [Deduplicator] drops the repetitions of an
// event; the first one after it is forwarded. Half of kube-apiserver's
// default --event-ttl: client-go's correlator turns the repetition into an
// update of the event (its count), which renews the event's time to live,
// or creates it again if it expired.
const RefreshInterval = 30 * time.Minute

// Deduplicator is a [record.EventRecorder] that drops an event when it repeats
// the last event recorded for the same object.
//
// Objects are identified by their UID (an [corev1.ObjectReference] by its
// UID field); an object without a UID is identified by its Go type,
// namespace and name. Memory is bounded: beyond the configured number of
// objects, the least recently used entry is forgotten once it is older than
// RefreshInterval (its cause would be posted again anyway), and beyond ten
// times that number whatever its age, so at worst a cause is reported a
// second time. Call [Deduplicator.Forget] when an object
// is deleted or reaches a state in which its earlier events no longer apply
// (a claim that got bound), so that a later repetition of the same cause is
// reported again.
//
// It is safe for concurrent use. Two goroutines recording the same event for
// the same object at the same moment forward it once.
type Deduplicator struct {
	next record.EventRecorder
	max  int
	now  func() time.Time

	mu    sync.Mutex
	order *list.List               // of *entry, most recently used first
	byKey map[string]*list.Element // key → element in order
}

type entry struct {
	key                        string
	eventtype, reason, message string
	at                         time.Time // when it was forwarded
}

// is reports whether e is the event with this type, reason and message.
func (e *entry) is(eventtype, reason, message string) bool {
	return e.eventtype == eventtype && e.reason == reason && e.message == message
}

var _ record.EventRecorder = (*Deduplicator)(nil)

// NewDeduplicator returns a recorder that forwards to next the events that
// differ from the last one forwarded for the same object, remembering at
// most maxObjects objects (DefaultMaxObjects when maxObjects <= 0).
func NewDeduplicator(next record.EventRecorder, maxObjects int, opts ...DeduplicatorOption) *Deduplicator {
	if maxObjects <= 0 {
		maxObjects = DefaultMaxObjects
	}
	d := &Deduplicator{
		next:  next,
		max:   maxObjects,
		now:   time.Now,
		order: list.New(),
		byKey: make(map[string]*list.Element),
	}
	for _, o := range opts {
		o(d)
	}
	return d
}

// A DeduplicatorOption changes a Deduplicator at construction.
type DeduplicatorOption func(*Deduplicator)

// WithNow makes the Deduplicator tell the time with now (a fake clock's,
// in tests) instead of time.Now.
func WithNow(now func() time.Time) DeduplicatorOption {
	return func(d *Deduplicator) { d.now = now }
}

// Event forwards the event unless it repeats the last one for object.
func (d *Deduplicator) Event(object runtime.Object, eventtype, reason, message string) {
	if d.admit(object, eventtype, reason, message) {
		d.next.Event(object, eventtype, reason, message)
	}
}

// Eventf formats the message and then behaves like [Deduplicator.Event].
func (d *Deduplicator) Eventf(object runtime.Object, eventtype, reason, messageFmt string, args ...interface{}) {
	d.Event(object, eventtype, reason, fmt.Sprintf(messageFmt, args...))
}

// AnnotatedEventf formats the message and forwards the event with its
// annotations unless it repeats the last one for object. Annotations are not
// part of the comparison.
func (d *Deduplicator) AnnotatedEventf(object runtime.Object, annotations map[string]string, eventtype, reason, messageFmt string, args ...interface{}) {
	message := fmt.Sprintf(messageFmt, args...)
	if d.admit(object, eventtype, reason, message) {
		d.next.AnnotatedEventf(object, annotations, eventtype, reason, "%s", message)
	}
}

// Repeats reports whether [Deduplicator.Event] would drop this event now:
// it is the last one remembered for object, forwarded or noted less than
// RefreshInterval ago. It remembers nothing.
func (d *Deduplicator) Repeats(object runtime.Object, eventtype, reason, message string) bool {
	key := objectKey(object)
	now := d.now()
	d.mu.Lock()
	defer d.mu.Unlock()
	el, ok := d.byKey[key]
	if !ok {
		return false
	}
	e := el.Value.(*entry)
	return e.is(eventtype, reason, message) && now.Sub(e.at) < RefreshInterval
}

// Note remembers the event as the last one for object, as if it had been
// forwarded now, without forwarding it: for an event another component
// has just posted about the object, so that the same cause is not posted
// again before RefreshInterval.
func (d *Deduplicator) Note(object runtime.Object, eventtype, reason, message string) {
	d.admit(object, eventtype, reason, message)
}

// Forget drops what is remembered about the object with this UID.
func (d *Deduplicator) Forget(uid types.UID) {
	if uid == "" {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if el, ok := d.byKey[string(uid)]; ok {
		d.order.Remove(el)
		delete(d.byKey, string(uid))
	}
}

// aggregatedPrefix starts the message of an event that client-go's event
// correlator aggregated (the 11th similar event of an object within ten
// minutes): the message the recorder was given follows it.
const aggregatedPrefix = "(combined from similar events): "

// Unwritten undoes the remembering of event, which was forwarded but never
// written (a [Writer] gave up on it, see WriterOptions.OnDrop): if it is
// still the last event remembered for its object, it is forgotten, so that
// the next repetition of its cause is forwarded instead of being dropped
// for RefreshInterval. An event this Deduplicator did not forward, or one
// a later event replaced, changes nothing.
func (d *Deduplicator) Unwritten(event *corev1.Event) {
	key := objectKey(&event.InvolvedObject)
	d.mu.Lock()
	defer d.mu.Unlock()
	el, ok := d.byKey[key]
	if !ok {
		return
	}
	if e := el.Value.(*entry); e.is(event.Type, event.Reason, event.Message) || e.is(event.Type, event.Reason, strings.TrimPrefix(event.Message, aggregatedPrefix)) {
		d.order.Remove(el)
		delete(d.byKey, key)
	}
}

// Len returns the number of objects currently remembered.
func (d *Deduplicator) Len() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.order.Len()
}

// admit records the event as the last one for object and reports whether it
// differs from the previous last one or that one is older than
// RefreshInterval.
func (d *Deduplicator) admit(object runtime.Object, eventtype, reason, message string) bool {
	key := objectKey(object)
	now := d.now()
	d.mu.Lock()
	defer d.mu.Unlock()
	if el, ok := d.byKey[key]; ok {
		e := el.Value.(*entry)
		d.order.MoveToFront(el)
		if e.is(eventtype, reason, message) && now.Sub(e.at) < RefreshInterval {
			return false
		}
		e.eventtype, e.reason, e.message, e.at = eventtype, reason, message, now
		return true
	}
	d.byKey[key] = d.order.PushFront(&entry{key: key, eventtype: eventtype, reason: reason, message: message, at: now})
	for d.order.Len() > d.max {
		oldest := d.order.Back()
		if d.order.Len() <= hardMaxFactor*d.max && now.Sub(oldest.Value.(*entry).at) < RefreshInterval {
			// Forgetting an entry younger than RefreshInterval would post
			// its cause again at once: with more objects than max whose
			// causes are recorded at every resync (in a lister's random
			// order), nearly every repetition would be posted.
			break
		}
		d.order.Remove(oldest)
		delete(d.byKey, oldest.Value.(*entry).key)
	}
	return true
}

// objectKey identifies object: its UID, or its type, namespace and name when
// it has no UID.
func objectKey(object runtime.Object) string {
	if ref, ok := object.(*corev1.ObjectReference); ok {
		if ref.UID != "" {
			return string(ref.UID)
		}
		return fmt.Sprintf("%s/%s/%s", ref.Kind, ref.Namespace, ref.Name)
	}
	m, err := meta.Accessor(object)
	if err != nil {
		return fmt.Sprintf("%T", object)
	}
	if m.GetUID() != "" {
		return string(m.GetUID())
	}
	return fmt.Sprintf("%T/%s/%s", object, m.GetNamespace(), m.GetName())
}
