package chaos

import (
	"context"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
)

// Recorder records every state of every PV and PVC that a watch reports,
// for [CheckHistory]. A watch that ends (kube-apiserver restarted and the
// resourceVersion is too old) is a gap: the recorder lists again, records
// the listed states and a deletion for every object that disappeared, and
// watches on. Gaps are counted; transitions inside a gap are not seen.
type Recorder struct {
	client kubernetes.Interface

	mu      sync.Mutex
	records []Record
	gaps    int
	last    uint64            // highest revision recorded
	live    map[string]Record // last record per object key, for objects that exist
	errs    []string          // watch errors and gaps, for the summary
}

// NewRecorder returns a recorder; call Start.
func NewRecorder(client kubernetes.Interface) *Recorder {
	return &Recorder{client: client, live: map[string]Record{}}
}

// Start lists PVs and PVCs, then watches them until ctx is done. It returns
// once both initial lists are recorded.
func (r *Recorder) Start(ctx context.Context) error {
	listed := make(chan error, 2)
	for _, kind := range []string{"pv", "pvc"} {
		go r.run(ctx, kind, listed)
	}
	for range 2 {
		if err := <-listed; err != nil {
			return err
		}
	}
	return nil
}

// Records returns a copy of the records so far.
func (r *Recorder) Records() []Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Record, len(r.records))
	copy(out, r.records)
	return out
}

// LastRevision is the highest revision recorded.
func (r *Recorder) LastRevision() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last
}

// Gaps counts the watches that ended and were replaced by a new list.
func (r *Recorder) Gaps() (int, []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.gaps, append([]string(nil), r.errs...)
}

func (r *Recorder) run(ctx context.Context, kind string, listed chan<- error) {
	first := true
	for ctx.Err() == nil {
		rv, err := r.list(ctx, kind, !first)
		if err != nil {
			if first {
				listed <- err
				return
			}
			select { // kube-apiserver is down: try again shortly
			case <-ctx.Done():
			case <-time.After(500 * time.Millisecond):
			}
			continue
		}
		if first {
			listed <- nil
			first = false
		}
		lw := &cache.ListWatch{WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			if kind == "pv" {
				return r.client.CoreV1().PersistentVolumes().Watch(ctx, opts)
			}
			return r.client.CoreV1().PersistentVolumeClaims("").Watch(ctx, opts)
		}}
		w, err := watchtools.NewRetryWatcherWithContext(ctx, rv, lw)
		if err != nil {
			r.noteGap(kind, err.Error())
			continue
		}
		for ev := range w.ResultChan() {
			switch ev.Type {
			case watch.Added, watch.Modified, watch.Deleted:
				r.add(ev.Object, ev.Type == watch.Deleted)
			case watch.Error:
				r.noteError(kind, apierrors.FromObject(ev.Object).Error())
			}
		}
		w.Stop()
		if ctx.Err() == nil {
			r.noteGap(kind, "watch ended")
		}
	}
}

// list records the current state of every object of kind and returns the
// list's resourceVersion. After a gap, objects that were live and are not
// listed any more get a deletion record.
func (r *Recorder) list(ctx context.Context, kind string, afterGap bool) (string, error) {
	var items []runtime.Object
	var rv string
	if kind == "pv" {
		l, err := r.client.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return "", err
		}
		rv = l.ResourceVersion
		for i := range l.Items {
			items = append(items, &l.Items[i])
		}
	} else {
		l, err := r.client.CoreV1().PersistentVolumeClaims("").List(ctx, metav1.ListOptions{})
		if err != nil {
			return "", err
		}
		rv = l.ResourceVersion
		for i := range l.Items {
			items = append(items, &l.Items[i])
		}
	}
	listRev, err := ParseRevision(rv)
	if err != nil {
		return "", err
	}
	seen := map[string]bool{}
	for _, o := range items {
		seen[r.add(o, false)] = true
	}
	if afterGap {
		// The object went some time between its last known state and the
		// list. Its deletion is recorded where no check can fail on a
		// moment it may not have had (a transition inside a gap can go
		// unseen, never be invented): a claim's right after its last
		// known state, the earliest it can have gone, since a check
		// fails on a claim that exists; a volume's at the list's
		// revision, the latest, since a check fails on a volume deleted
		// while its claim exists. (A volume's last known state usually
		// comes before its claim's: the binder writes the volume first.)
		r.mu.Lock()
		for key, rec := range r.live {
			if strings.HasPrefix(key, kind+"/") && !seen[key] {
				rec.Deleted = true
				if rec.Volume != nil {
					rec.Revision = listRev
				}
				r.appendLocked(key, rec)
			}
		}
		r.mu.Unlock()
	}
	return rv, nil
}

// add records one object and returns its key. A state already recorded
// (same key and revision) is not recorded twice.
func (r *Recorder) add(obj runtime.Object, deleted bool) string {
	var rec Record
	var key, rv string
	switch o := obj.(type) {
	case *corev1.PersistentVolume:
		rec.Volume, key, rv = VolumeOf(o), "pv/"+o.Name+"/"+string(o.UID), o.ResourceVersion
	case *corev1.PersistentVolumeClaim:
		rec.Claim, key, rv = ClaimOf(o), "pvc/"+string(o.UID), o.ResourceVersion
	default:
		return ""
	}
	rev, err := ParseRevision(rv)
	if err != nil {
		r.noteError("parse", err.Error())
		return key
	}
	rec.Revision, rec.Deleted = rev, deleted
	r.mu.Lock()
	defer r.mu.Unlock()
	if prev, ok := r.live[key]; ok && prev.Revision == rev && !deleted {
		return key
	}
	r.appendLocked(key, rec)
	return key
}

func (r *Recorder) appendLocked(key string, rec Record) {
	r.records = append(r.records, rec)
	if rec.Revision > r.last {
		r.last = rec.Revision
	}
	if rec.Deleted {
		delete(r.live, key)
	} else {
		r.live[key] = rec
	}
}

func (r *Recorder) noteGap(kind, why string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.gaps++
	r.errs = append(r.errs, kind+": "+why)
}

func (r *Recorder) noteError(kind, msg string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, kind+": "+msg)
}
