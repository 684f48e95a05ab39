package binder

import (
	"context"
	"hash/fnv"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/kube-storage/csi-provisioner/internal/events"
)

// Some pending claims are nobody's: one whose class does not exist, and
// one without a class that no volume fits. Every binder that sees such a
// claim (kube-controller-manager's and this sidecar's of each driver in the
// cluster) would post the same event about it, "storageclass.storage.k8s.io
// "x" not found" or "no persistent volumes available for this claim and no
// storage class is set", from a source of its own, which the API server
// does not merge. So this binder waits a little before it reports one, and
// reports it only when no binder has within [events.RefreshInterval]:
//
//   - The wait ([MissingClassTurn]), counted from the claim's creation,
//     is missingClassWait plus a share of missingClassSpread that depends
//     on the claim and the driver, so the binders of several drivers look
//     at a new claim one after the other, and kube-controller-manager's,
//     which reports at once, has reported by then. It also gives a class,
//     or a volume, applied together with the claim time to arrive.
//   - Then the claim's events are listed (one request, the same cost as
//     the class lookup before it); a recent event of the same type, reason
//     and message, from any source, is enough. The binder's deduplicator
//     then remembers it, so the resyncs within RefreshInterval neither
//     list nor report.
//
// Binders whose turns fall within one event write of each other can
// still both report.
const (
	missingClassWait   = time.Second
	missingClassSpread = 2 * time.Second
)

// MissingClassTurn is how long after the creation of the claim with this
// UID the binder of driver looks at it for the event of a claim that is
// nobody's (its class is missing, or it has none and no volume fits): at
// least a second, less than three. Tests use it to tell which of several
// binders reports.
func MissingClassTurn(uid types.UID, driver string) time.Duration {
	h := fnv.New64a()
	_, _ = h.Write([]byte(uid))
	_, _ = h.Write([]byte{0})
	_, _ = h.Write([]byte(driver))
	return missingClassWait + time.Duration(h.Sum64()%uint64(missingClassSpread/time.Millisecond))*time.Millisecond
}

// reportUnowned posts the event about a claim that is nobody's, at this
// binder's turn and unless it or another binder has within
// events.RefreshInterval.
func (b *Binder) reportUnowned(ctx context.Context, claim *corev1.PersistentVolumeClaim, eventType, reason, message string) result {
	if wait := MissingClassTurn(claim.UID, b.driver) - b.cfg.clock.Since(claim.CreationTimestamp.Time); wait > 0 {
		return result{requeueAfter: wait}
	}
	if b.recorder.Repeats(claim, eventType, reason, message) {
		return result{}
	}
	if b.reportedRecently(ctx, claim, eventType, reason, message) {
		klog.FromContext(ctx).V(4).Info("Not reporting the claim: another binder has said so", "reason", reason, "message", message)
		b.recorder.Note(claim, eventType, reason, message)
		return result{}
	}
	b.recorder.Event(claim, eventType, reason, message)
	return result{}
}

// reportedRecently reports whether an event of this type, reason and
// message about claim was last seen within events.RefreshInterval, posted
// by any component. When the events cannot be listed it says false: a
// second Warning is better than none.
func (b *Binder) reportedRecently(ctx context.Context, claim *corev1.PersistentVolumeClaim, eventType, reason, message string) bool {
	sel := fields.Set{"involvedObject.uid": string(claim.UID), "type": eventType, "reason": reason}.AsSelector().String()
	list, err := b.client.CoreV1().Events(claim.Namespace).List(ctx, metav1.ListOptions{FieldSelector: sel})
	if err != nil {
		klog.FromContext(ctx).V(2).Info("Cannot list the claim's events; reporting anyway", "pvc", klog.KObj(claim), "err", err)
		return false
	}
	now := b.cfg.clock.Now()
	for i := range list.Items {
		e := &list.Items[i]
		if e.InvolvedObject.UID != claim.UID || e.Type != eventType || e.Reason != reason || e.Message != message {
			continue
		}
		last := e.LastTimestamp.Time
		if e.Series != nil && e.Series.LastObservedTime.After(last) {
			last = e.Series.LastObservedTime.Time
		}
		if last.IsZero() {
			last = e.EventTime.Time
		}
		if now.Sub(last) < events.RefreshInterval {
			return true
		}
	}
	return false
}
