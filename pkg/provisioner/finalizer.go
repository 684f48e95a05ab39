package provisioner

import (
	"context"
	"errors"
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/kube-storage/csi-provisioner/pkg/inflight"
)

// maxFinalizerAttempts bounds the update-on-conflict loop of one finalizer
// change; the caller's retry takes over after that.
const maxFinalizerAttempts = 3

// errClaimGone says that the claim was deleted (or replaced by a claim of
// another UID) or is being deleted, so the in-flight finalizer cannot be
// added and no CreateVolume may start.
var errClaimGone = errors.New("the claim is gone or being deleted")

// errNotSelected says, in node deployment, that the claim is no longer
// selected for this node (an administrator or the library removed
// selected-node, or another node took the claim since), so this node must
// not add the in-flight finalizer nor send CreateVolume.
var errNotSelected = errors.New("the claim is no longer selected for this node")

// addInflight persists the in-flight finalizer on claim with a live update
// of a copy, unless the claim already carries it. On a conflict it reads the
// claim again and stops if the live claim already has the finalizer. It
// returns errClaimGone when the finalizer cannot be added because the claim
// is gone or being deleted (the API server refuses new finalizers then),
// and in node deployment errNotSelected when the live claim read after a
// conflict is no longer selected for this node.
func (p *Provisioner) addInflight(ctx context.Context, claim *corev1.PersistentVolumeClaim) error {
	return p.changeInflight(ctx, claim, true)
}

// removeInflight removes the in-flight finalizer from claim with a live
// update of a copy. A claim that is gone, replaced or already without the
// finalizer is success.
func (p *Provisioner) removeInflight(ctx context.Context, claim *corev1.PersistentVolumeClaim) error {
	return p.changeInflight(ctx, claim, false)
}

func (p *Provisioner) changeInflight(ctx context.Context, claim *corev1.PersistentVolumeClaim, add bool) error {
	logger := klog.FromContext(ctx)
	cur := claim
	var err error
	for range maxFinalizerAttempts {
		if inflight.Has(cur) == add {
			return nil // nothing to change: no copy
		}
		if add && cur.DeletionTimestamp != nil {
			return errClaimGone
		}
		clone := cur.DeepCopy()
		if add {
			inflight.Add(clone, p.VolumeName(clone))
		} else {
			inflight.Remove(clone)
		}
		_, err = p.client.CoreV1().PersistentVolumeClaims(clone.Namespace).Update(ctx, clone, metav1.UpdateOptions{FieldManager: FieldManager})
		switch {
		case err == nil:
			logger.V(4).Info("Changed the in-flight finalizer", "pvc", klog.KObj(claim), "added", add)
			return nil
		case apierrors.IsNotFound(err):
			return gone(add)
		case add && apierrors.IsInvalid(err) && clone.DeletionTimestamp == nil:
			// Most likely the claim started being deleted after our read:
			// the API server forbids new finalizers then. Read it to know.
		case !apierrors.IsConflict(err):
			return fmt.Errorf("update finalizers of claim %s: %w", klog.KObj(claim), err)
		}
		live, getErr := p.client.CoreV1().PersistentVolumeClaims(claim.Namespace).Get(ctx, claim.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(getErr):
			return gone(add)
		case getErr != nil:
			return fmt.Errorf("get claim %s: %w", klog.KObj(claim), getErr)
		case live.UID != claim.UID:
			return gone(add)
		case add && p.node != nil && selectedNodeName(live) != p.node.NodeName:
			logger.V(2).Info("Not adding the in-flight finalizer: the claim is no longer selected for this node", "pvc", klog.KObj(claim), "selectedNode", selectedNodeName(live))
			return errNotSelected
		case !add && p.node != nil && !p.nodeGuards(live):
			// Node deployment: the claim changed hands meanwhile (another
			// node selected itself); its finalizer is that node's now.
			logger.V(4).Info("Not removing the in-flight finalizer of a claim another node took", "pvc", klog.KObj(claim), "selectedNode", selectedNodeName(live))
			return nil
		}
		cur = live
	}
	return fmt.Errorf("update finalizers of claim %s: %w", klog.KObj(claim), err)
}

func gone(add bool) error {
	if add {
		return errClaimGone
	}
	return nil
}

// attemptState is what this process knows about the CreateVolume calls
// for one claim.
type attemptState int

const (
	// attemptUnknown: the ledger does not hold the claim (this process
	// started after the claim got the finalizer, or forgot it).
	attemptUnknown attemptState = iota
	// attemptClean: this process saw the claim without the in-flight
	// finalizer and has sent no CreateVolume for it since. Every
	// CreateVolume needs the finalizer first, and only this process sends
	// them for this driver, so none was sent.
	attemptClean
	// attemptSent: a CreateVolume was sent and has no final answer yet.
	attemptSent
	// attemptFinal: the last CreateVolume got a final answer, so no volume
	// exists under the claim's name and none is being created.
	attemptFinal
	// attemptReleased: nothing being in flight, the in-flight finalizer is
	// being (or was) removed; no CreateVolume may start any more.
	attemptReleased
	// attemptCreated: the volume was created and its PV is being saved.
	// Known, so that an old copy of the claim without the finalizer, still
	// on its way from the watch, cannot make it look clean: only the PV
	// (or the claim's end) releases it.
	attemptCreated
)

// idle reports whether nothing can be in flight in state s: the last
// CreateVolume got a final answer, or none was sent since the claim was
// seen without the finalizer. A later CreateVolume may still begin.
func (s attemptState) idle() bool { return s == attemptFinal || s == attemptClean }

// sent reports whether this process sent a CreateVolume for the claim in
// state s and has not released it since: the in-flight finalizer on the
// claim is then this process's, even after the claim was handed to another
// provisioner (its class recreated with another provisioner).
func (s attemptState) sent() bool {
	return s == attemptSent || s == attemptFinal || s == attemptCreated
}

// inFlight reports whether, in state s, this process sent a CreateVolume
// whose answer (or the PV of its volume) may still be missing.
func (s attemptState) inFlight() bool { return s == attemptSent || s == attemptCreated }

// over reports whether no CreateVolume can still be running in state s:
// the volume was created, or the last call got a final answer.
func (s attemptState) over() bool {
	return s == attemptCreated || s == attemptFinal || s == attemptReleased
}

// ledger records, per claim UID, what this process knows of its
// CreateVolume calls, so that a claim whose create is known to be over (or
// never started) can be released without another CreateVolume, and so
// that no create starts while it is. It is memory only: after a restart a
// claim that already carries the finalizer is unknown, and only a
// CreateVolume answer or the provisioned PV releases it.
type ledger struct {
	mu     sync.Mutex
	states map[types.UID]attemptState
	// names holds the volume name of the first CreateVolume this process
	// sent for a claim, until the claim is forgotten: every later call for
	// it uses that name (see pin), whatever the claim's annotation says
	// meanwhile.
	names map[types.UID]string
	// peak is the most claims states has held since it was made: a Go map
	// keeps the size of its peak, so after a burst of pending claims (2 MB
	// for 10,000) forget copies what is left into a smaller one.
	peak int
}

// ledgerShrinkMin is the peak below which the ledger is never copied.
const ledgerShrinkMin = 1024

func newLedger() *ledger {
	return &ledger{states: map[types.UID]attemptState{}, names: map[types.UID]string{}}
}

// pin records name as the claim's volume name, unless one is recorded
// already. The claim's user may edit the recorded name on the claim
// (inflight.AnnVolumeName) between two calls; a retry under another name
// would create a second volume and leave the first, which no PV records.
func (l *ledger) pin(uid types.UID, name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.names[uid]; !ok {
		l.names[uid] = name
	}
}

// pinned returns the volume name pinned for the claim, if any.
func (l *ledger) pinned(uid types.UID) (string, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	name, ok := l.names[uid]
	return name, ok
}

// observeClean records that the claim was seen without the finalizer,
// unless something is known about it already.
func (l *ledger) observeClean(uid types.UID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, known := l.states[uid]; !known {
		l.states[uid] = attemptClean
		l.peak = max(l.peak, len(l.states))
	}
}

// begin records that a CreateVolume is about to be sent. It returns false
// when the claim was released: the caller must not send it.
func (l *ledger) begin(uid types.UID) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.states[uid] == attemptReleased {
		return false
	}
	l.states[uid] = attemptSent
	l.peak = max(l.peak, len(l.states))
	return true
}

// created records that the volume exists and its PV is being saved.
func (l *ledger) created(uid types.UID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.states[uid] != attemptReleased {
		l.states[uid] = attemptCreated
	}
}

// final records a final answer.
func (l *ledger) final(uid types.UID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.states[uid] != attemptReleased {
		l.states[uid] = attemptFinal
	}
}

// release marks the claim released if nothing can be in flight for it (a
// final answer, or no CreateVolume since it was seen without the
// finalizer) and reports whether it did. The caller then removes the
// finalizer, and calls unrelease if that fails.
func (l *ledger) release(uid types.UID) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.states[uid].idle() {
		return false
	}
	l.states[uid] = attemptReleased
	return true
}

// state returns what this process knows of the claim's CreateVolume
// calls (attemptUnknown: nothing).
func (l *ledger) state(uid types.UID) attemptState {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.states[uid]
}

// unrelease undoes release after a failed finalizer removal.
func (l *ledger) unrelease(uid types.UID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.states[uid] == attemptReleased {
		l.states[uid] = attemptFinal
	}
}

// forget drops what is known about the claim (it succeeded or is gone).
func (l *ledger) forget(uid types.UID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.states, uid)
	delete(l.names, uid)
	if l.peak >= ledgerShrinkMin && len(l.states) <= l.peak/4 {
		l.states, l.names, l.peak = compacted(l.states), compacted(l.names), len(l.states)
	}
}

// compacted returns a copy of m sized for what it holds: a map made by
// hand, since maps.Clone would keep the size of m's peak.
func compacted[V any](m map[types.UID]V) map[types.UID]V {
	out := make(map[types.UID]V, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// releaseIdle removes the finalizer of claim when no CreateVolume for it
// can be in flight (see ledger.release), and reports whether it did.
func (p *Provisioner) releaseIdle(ctx context.Context, claim *corev1.PersistentVolumeClaim) (bool, error) {
	if !p.attempts.release(claim.UID) {
		return false, nil
	}
	if err := p.removeInflight(ctx, claim); err != nil {
		p.attempts.unrelease(claim.UID)
		return false, err
	}
	return true, nil
}
