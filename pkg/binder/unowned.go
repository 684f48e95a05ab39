package binder

import (
	"context"
	"fmt"
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

// reportUnowned explains a claim that is nobody's: one whose class
// className does not exist gets the Warning ProvisioningFailed, one without
// a class (className "") the Normal FailedBinding, as from
// kube-controller-manager's binder. It posts at this binder's turn, and only
// when neither it nor another binder has within events.RefreshInterval.
// It says nothing when the class turns out to exist (a class applied with
// the claim, not cached yet: its add event queues the claim again) or when
// another driver's static volume fits the claim (that driver's binder, or
// kube-controller-manager's, binds it; the event would stay on a claim that
// ends Bound).
//
// The cheap check comes first: at the resyncs after a report, the claim
// costs neither a request nor a scan of every volume.
func (b *Binder) reportUnowned(ctx context.Context, claim *corev1.PersistentVolumeClaim, className string) (result, error) {
	logger := klog.FromContext(ctx)
	logger.V(5).Info("Claim is nobody's", "class", className)
	eventType, reason, message := corev1.EventTypeNormal, reasonFailedBinding, msgNoVolumeNoClass
	if className != "" {
		eventType, reason, message = corev1.EventTypeWarning, reasonProvisioningFailed, fmt.Sprintf(msgClassNotFound, className)
	}
	if b.recorder.Repeats(claim, eventType, reason, message) {
		return result{}, nil
	}
	if className != "" {
		exists, err := b.classExistsInAPI(ctx, className)
		if err != nil {
			return result{}, fmt.Errorf("sync claim %s: %w", claimKey(claim), err)
		}
		if exists {
			logger.V(4).Info("Class of the claim not cached yet", "class", className)
			return result{}, nil
		}
	}
	if b.foreignVolumeFitting(claim, className, false) != nil {
		logger.V(4).Info("Claim is nobody's, but another driver's volume fits it", "class", className)
		return result{}, nil
	}
	if wait := MissingClassTurn(claim.UID, b.driver) - b.cfg.clock.Since(claim.CreationTimestamp.Time); wait > 0 {
		return result{requeueAfter: wait}, nil
	}
	if b.reportedRecently(ctx, claim, eventType, reason, message) {
		logger.V(4).Info("Not reporting the claim: another binder has said so", "reason", reason, "message", message)
		b.recorder.Note(claim, eventType, reason, message)
		return result{}, nil
	}
	b.recorder.Event(claim, eventType, reason, message)
	return result{}, nil
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
