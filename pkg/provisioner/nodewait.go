package provisioner

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/kube-storage/csi-provisioner/internal/events"
)

// untakenEventSuffix ends the name of the event that explains why no node
// takes a claim: "<claim UID>" + untakenEventSuffix. Every node uses the same
// name, so the first node's create wins and the others get AlreadyExists:
// one event per claim, however many nodes decline it.
const untakenEventSuffix = ".no-node-takes-it"

// untakenGraceFactor times MaxDelay is how long a node that declined a
// claim for capacity waits before it explains the claim: every node tries
// a claim it sees for the first time within 1.5 × BaseDelay, so by then
// any node with room has taken it, and no event is posted for a claim
// that merely went to another node.
const untakenGraceFactor = 1.5

// untakenExcludedGraceFactor times MaxDelay is how long a node that a
// class's allowedTopologies exclude waits before it explains an Immediate
// claim (see explainNotAllowed).
const untakenExcludedGraceFactor = 4

// untakenRetryBase is how long a node waits before it posts again an
// untaken-claim event whose post failed (the API server down or
// answering 5xx); the wait doubles with each further failure up to
// untakenRetryMax.
const (
	untakenRetryBase = 5 * time.Second
	untakenRetryMax  = 5 * time.Minute
)

// untaken remembers the claims (by UID) this node declined and explained,
// or will: so that it explains each once, and so that it can try again the
// claims it declined for capacity when a volume of this node is deleted.
// An entry is dropped when the claim is provisioned, gone or taken
// (nodeDeployment.forget).
type untaken struct {
	mu     sync.Mutex
	claims map[types.UID]untakenClaim
}

type untakenClaim struct {
	key string // namespace/name
	// decline is why this node declined the claim for capacity, the last
	// time; nil for a claim declined for another reason.
	decline *capacityDecline
	// explained is when this node last posted or renewed the claim's
	// event, or tried to; zero before.
	explained time.Time
	// retrying is set while a goroutine posts again the claim's event
	// after a failed post (retryUntaken).
	retrying bool
}

// add records the claim, with why this node declined it for capacity (nil
// for another reason), and reports whether the claim was new. A claim
// declined again keeps its entry with the new decline.
func (u *untaken) add(claim *corev1.PersistentVolumeClaim, decline *capacityDecline) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	if c, ok := u.claims[claim.UID]; ok {
		if decline != nil {
			c.decline = decline
			u.claims[claim.UID] = c
		}
		return false
	}
	if u.claims == nil {
		u.claims = map[types.UID]untakenClaim{}
	}
	u.claims[claim.UID] = untakenClaim{key: claim.Namespace + "/" + claim.Name, decline: decline}
	return true
}

// firstExplanation reports whether this node has not explained the claim
// yet, and if so records now as its explanation.
func (u *untaken) firstExplanation(uid types.UID, now time.Time) bool {
	return u.explain(uid, now, func(last time.Time) bool { return last.IsZero() })
}

// renewal reports whether this node explained the claim at least
// events.RefreshInterval ago, and if so records now as its explanation.
func (u *untaken) renewal(uid types.UID, now time.Time) bool {
	return u.explain(uid, now, func(last time.Time) bool {
		return !last.IsZero() && now.Sub(last) >= events.RefreshInterval
	})
}

func (u *untaken) explain(uid types.UID, now time.Time, due func(last time.Time) bool) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	c, ok := u.claims[uid]
	if !ok || !due(c.explained) {
		return false
	}
	c.explained = now
	u.claims[uid] = c
	return true
}

// startRetry reports whether no goroutine is posting the claim's event
// again yet, and if so records that one does.
func (u *untaken) startRetry(uid types.UID) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	c, ok := u.claims[uid]
	if !ok || c.retrying {
		return false
	}
	c.retrying = true
	u.claims[uid] = c
	return true
}

// endRetry records that the goroutine posting the claim's event again has
// stopped.
func (u *untaken) endRetry(uid types.UID) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if c, ok := u.claims[uid]; ok {
		c.retrying = false
		u.claims[uid] = c
	}
}

func (u *untaken) forget(uid types.UID) {
	u.mu.Lock()
	defer u.mu.Unlock()
	delete(u.claims, uid)
}

func (u *untaken) has(uid types.UID) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	_, ok := u.claims[uid]
	return ok
}

// mayFitAfter returns the UIDs and keys of the claims declined for
// capacity that may fit once freed bytes are free again: those whose
// request is at most the room the driver reported at the decline plus
// freed.
func (u *untaken) mayFitAfter(freed int64) map[types.UID]string {
	u.mu.Lock()
	defer u.mu.Unlock()
	out := map[types.UID]string{}
	for uid, c := range u.claims {
		if d := c.decline; d != nil && d.requested <= d.room+freed {
			out[uid] = c.key
		}
	}
	return out
}

// forget drops what this node keeps about a claim it will not take, has
// provisioned, or saw deleted: its delay and whether it explained it.
// Without node deployment (nd is nil) it does nothing.
func (nd *nodeDeployment) forget(uid types.UID) {
	if nd == nil {
		return
	}
	nd.delays.forget(uid)
	nd.untaken.forget(uid)
}

// watchFreedCapacity registers volumeDeleted on the volume informer.
func (p *Provisioner) watchFreedCapacity() error {
	_, err := p.volumeInf.AddEventHandler(cache.ResourceEventHandlerFuncs{DeleteFunc: p.volumeDeleted})
	return err
}

// volumeDeleted hands the claims this node declined for capacity back to
// the library when a volume of this node's driver on this node is deleted
// (its PV goes once DeleteVolume succeeded), if they may fit in the room
// the driver reported plus the volume's capacity. Otherwise they would
// wait for their next update or the library's resync. Each claim handed
// back costs a library worker its owner delay, so claims that cannot fit
// stay where they are.
func (p *Provisioner) volumeDeleted(obj interface{}) {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	pv, ok := obj.(*corev1.PersistentVolume)
	if !ok || pv.Spec.CSI == nil || pv.Spec.CSI.Driver != p.name {
		return
	}
	if mine, _ := p.node.owns(pv); !mine {
		return
	}
	size := pv.Spec.Capacity[corev1.ResourceStorage]
	for uid, key := range p.node.untaken.mayFitAfter(size.Value()) {
		item, exists, err := p.claimInf.GetStore().GetByKey(key)
		if err != nil || !exists {
			continue
		}
		if claim, ok := item.(*corev1.PersistentVolumeClaim); ok && claim.UID == uid && waiting(claim) {
			p.libraryClaims.requeue(claim)
		}
	}
}

// explainNoCapacity is called when this node declined claim for capacity
// (too little room; a GetCapacity that failed does not decline, see
// checkNodeCapacity). Unless a node (another, or this
// one later) takes the claim within the grace period, it posts the claim's
// one untaken-claim event with this node's reason. Declined again later (an update of the
// claim, the library's resync), it renews the event once its explanation
// is events.RefreshInterval old, so that a claim Pending for days keeps it
// (the API server drops events after an hour). Upstream posts nothing, and
// such a claim stays Pending with only kube-controller-manager's "waiting
// for a volume to be created" (external-provisioner's README says so).
func (p *Provisioner) explainNoCapacity(ctx context.Context, claim *corev1.PersistentVolumeClaim, decline capacityDecline) {
	grace := time.Duration(untakenGraceFactor * float64(p.node.MaxDelay))
	message := fmt.Sprintf("no node took the claim within %s: %s. In node deployment each node checks only its own capacity; a node tries again when one of its volumes is deleted, when the claim changes, and at the provisioning library's resync", grace, decline.reason)
	p.explainDeclined(ctx, claim, &decline, grace, message, false)
}

// explainNotAllowed is explainNoCapacity for a node that the class's
// allowedTopologies exclude. It waits untakenExcludedGraceFactor ×
// MaxDelay: a node the class allows declines within 1.5 × BaseDelay and
// explains 1.5 × MaxDelay later (at most 3 × MaxDelay in all), and its
// reason (capacity), not this node's, is the one the claim's single event
// must carry; this node's shows only when no allowed node explained the
// claim (allowedTopologies that match no node).
func (p *Provisioner) explainNotAllowed(ctx context.Context, claim *corev1.PersistentVolumeClaim, reason string) {
	grace := time.Duration(untakenExcludedGraceFactor * float64(p.node.MaxDelay))
	p.explainDeclined(ctx, claim, nil, grace, fmt.Sprintf("no node took the claim within %s: %s. In node deployment each node takes an Immediate claim only if the class's allowedTopologies allow its topology", grace, reason), true)
}

// explainDeclined records that this node declined claim (for capacity
// when decline is set) and, if the claim is still untaken grace later,
// posts message as the claim's untaken-claim event.
func (p *Provisioner) explainDeclined(ctx context.Context, claim *corev1.PersistentVolumeClaim, decline *capacityDecline, grace time.Duration, message string, keepOthers bool) {
	if !p.node.untaken.add(claim, decline) {
		if p.node.untaken.renewal(claim.UID, p.cfg.clock.Now()) {
			p.explainUntaken(ctx, claim, message, keepOthers)
		}
		return
	}
	// The library may end ctx with the sync (its ProvisionTimeout option
	// does); the wait is bounded by itself and ends with the sidecar, and
	// the post has its own timeout.
	timer := p.cfg.clock.NewTimer(grace)
	started := p.bg.run(ctx, func(ctx context.Context) {
		select {
		case <-timer.C():
		case <-ctx.Done():
			timer.Stop()
			return
		}
		cur, err := p.unowned(claim)
		if err != nil {
			return // taken, bound or gone: nothing to explain
		}
		if selectedNodeName(cur) == p.node.NodeName {
			// This node took it since (a volume of its own was deleted)
			// and is provisioning it.
			p.node.untaken.forget(cur.UID)
			return
		}
		if p.node.untaken.firstExplanation(cur.UID, p.cfg.clock.Now()) {
			p.explainUntaken(ctx, cur, message, keepOthers)
		}
	})
	if !started {
		timer.Stop() // the sidecar is stopping
	}
}

// explainImmediateOff posts the claim's untaken-claim event for an
// Immediate claim that no node takes because ImmediateBinding is off, and
// renews it as explainNoCapacity does.
func (p *Provisioner) explainImmediateOff(ctx context.Context, claim *corev1.PersistentVolumeClaim, className string) {
	now := p.cfg.clock.Now()
	p.node.untaken.add(claim, nil)
	if p.node.untaken.firstExplanation(claim.UID, now) || p.node.untaken.renewal(claim.UID, now) {
		p.explainUntaken(ctx, claim, fmt.Sprintf("no node takes this claim: its storageclass %q binds Immediately, and the provisioners of %s run on each node (--node-deployment) with --node-deployment-immediate-binding=false, so they provision only claims with a selected node; use a storage class with volumeBindingMode WaitForFirstConsumer", className, p.name), false)
	}
}

// explainUntaken posts the claim's untaken-claim event (postUntaken). If
// the post fails, a goroutine posts it again (retryUntaken), so that the
// claim does not stay Pending unexplained until the renewal, and the
// caller (a library worker) does not wait for the API server to come
// back.
func (p *Provisioner) explainUntaken(ctx context.Context, claim *corev1.PersistentVolumeClaim, message string, keepOthers bool) {
	if err := p.postUntaken(ctx, claim, message, keepOthers); err == nil || !p.node.untaken.startRetry(claim.UID) {
		return
	}
	// As the grace period's wait: not ended with the library's sync, but
	// with the sidecar.
	if !p.bg.run(ctx, func(ctx context.Context) { p.retryUntaken(ctx, claim, message, keepOthers) }) {
		p.node.untaken.endRetry(claim.UID)
	}
}

// retryUntaken posts the claim's event again after a failed post: after
// untakenRetryBase, then twice as long each time up to untakenRetryMax,
// until a post succeeds, the claim is taken, bound or gone (or this node
// forgot it), or events.RefreshInterval has passed since the failed post:
// then the renewal, at the claim's next decline, takes over.
func (p *Provisioner) retryUntaken(ctx context.Context, claim *corev1.PersistentVolumeClaim, message string, keepOthers bool) {
	defer p.node.untaken.endRetry(claim.UID)
	clk := p.cfg.clock
	giveUp := clk.Now().Add(events.RefreshInterval)
	for delay := untakenRetryBase; ; delay = min(2*delay, untakenRetryMax) {
		if !clk.Now().Add(delay).Before(giveUp) {
			return
		}
		timer := clk.NewTimer(delay)
		select {
		case <-timer.C():
		case <-ctx.Done():
			timer.Stop()
			return
		}
		cur, err := p.unowned(claim)
		if err != nil || selectedNodeName(cur) == p.node.NodeName || !p.node.untaken.has(cur.UID) {
			return
		}
		if p.postUntaken(ctx, cur, message, keepOthers) == nil {
			return
		}
	}
}

// postUntaken creates the claim's untaken-claim event (a Warning
// ProvisioningFailed from this node). If another node (or this one before a
// restart) created it, it renews it when its last time is
// events.RefreshInterval old: count + 1, the time, and this node's message
// unless keepOthers (a node the class excludes, whose reason must not
// replace an allowed node's); otherwise that node's explanation stands.
// It returns the error of a
// write that failed (logged); a write that another node's made needless is
// no error.
func (p *Provisioner) postUntaken(ctx context.Context, claim *corev1.PersistentVolumeClaim, message string, keepOthers bool) error {
	logger := klog.FromContext(ctx).WithValues("pvc", klog.KObj(claim))
	now := metav1.NewTime(p.cfg.clock.Now())
	name := string(claim.UID) + untakenEventSuffix
	source := corev1.EventSource{Component: EventSourceComponent, Host: p.node.NodeName}
	ev := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: claim.Namespace},
		InvolvedObject: corev1.ObjectReference{
			Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: claim.Namespace, Name: claim.Name,
			UID: claim.UID, ResourceVersion: claim.ResourceVersion,
		},
		Reason: reasonProvisioningFailed, Message: message, Type: corev1.EventTypeWarning,
		Source: source, FirstTimestamp: now, LastTimestamp: now, Count: 1,
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	client := p.client.CoreV1().Events(claim.Namespace)
	_, err := client.Create(ctx, ev, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		var cur *corev1.Event
		if cur, err = getEvent(ctx, client, name); err == nil {
			if now.Sub(cur.LastTimestamp.Time) < events.RefreshInterval {
				logger.V(4).Info("Another node already explained why no node takes the claim", "node", cur.Source.Host)
				return nil
			}
			cur.Count++
			cur.LastTimestamp = now
			// An excluded node (keepOthers) keeps another node's reason
			// alive instead of replacing it with its own.
			if !keepOthers || cur.Source.Host == p.node.NodeName {
				cur.Message, cur.Source = message, source
			}
			_, err = client.Update(ctx, cur, metav1.UpdateOptions{})
		}
		if apierrors.IsConflict(err) {
			logger.V(4).Info("Another node renewed the explanation of the claim at the same time")
			return nil
		}
	}
	if err != nil {
		logger.Error(err, "Could not post the event that explains why no node takes the claim", "message", message)
		return fmt.Errorf("post event %s for claim %s: %w", name, klog.KObj(claim), err)
	}
	logger.V(2).Info("No node takes the claim", "reason", message)
	return nil
}

// getEvent reads the event name with a list by name: upstream's ClusterRole
// grants list, watch, create, update and patch on events, not get.
func getEvent(ctx context.Context, client typedcorev1.EventInterface, name string) (*corev1.Event, error) {
	list, err := client.List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String()})
	if err != nil {
		return nil, err
	}
	for i := range list.Items {
		if list.Items[i].Name == name {
			return &list.Items[i], nil
		}
	}
	return nil, apierrors.NewNotFound(corev1.Resource("events"), name)
}
