package provisioner

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corelisters "k8s.io/client-go/listers/core/v1"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	storagehelpers "k8s.io/component-helpers/storage/volume"
	"k8s.io/klog/v2"
	"sigs.k8s.io/sig-storage-lib-external-provisioner/v13/controller"

	"github.com/kube-storage/csi-provisioner/pkg/csiclient"
)

// minOwnerPoll is the shortest interval at which a node waiting to take an
// immediate-binding claim looks whether another node took it, as upstream.
const minOwnerPoll = 10 * time.Millisecond

// NodeDeployment configures distributed provisioning (upstream's
// --node-deployment): one provisioner runs on every node next to a driver
// instance that can only create volumes on that node, and provisions only
// the claims of its node. See the package documentation.
type NodeDeployment struct {
	// NodeName is this sidecar's Kubernetes node (NODE_NAME). Required.
	NodeName string
	// NodeID is the driver's node ID (NodeGetInfo).
	NodeID string
	// Topology is the driver's accessible topology on this node
	// (NodeGetInfo); may be empty.
	Topology map[string]string
	// ImmediateBinding also takes claims with Immediate binding, by racing
	// the other nodes to set the selected-node annotation
	// (--node-deployment-immediate-binding).
	ImmediateBinding bool
	// BaseDelay and MaxDelay bound the wait before taking an
	// immediate-binding claim (--node-deployment-base-delay, -max-delay):
	// BaseDelay on the first attempt for a claim, doubling with each
	// further attempt up to MaxDelay, plus a random jitter of up to 50%.
	// Required: 0 < BaseDelay <= MaxDelay.
	BaseDelay, MaxDelay time.Duration
	// GetCapacity, when not nil (the driver has GET_CAPACITY), is asked
	// before an immediate-binding claim is taken, with the class's
	// parameters and Topology as accessible topology. It must honour ctx.
	GetCapacity func(ctx context.Context, req *csi.GetCapacityRequest) (*csi.GetCapacityResponse, error)
}

// WithNodeDeployment turns on distributed provisioning for node
// nd.NodeName (--node-deployment). New fails when nd.NodeName is empty or
// the delays are not 0 < BaseDelay <= MaxDelay.
func WithNodeDeployment(nd NodeDeployment) Option {
	nd.Topology = maps.Clone(nd.Topology)
	return func(c *config) { c.node = &nd }
}

func (nd *NodeDeployment) validate() error {
	var errs []error
	if nd.NodeName == "" {
		errs = append(errs, errors.New("NodeName must not be empty"))
	}
	if nd.BaseDelay <= 0 {
		errs = append(errs, fmt.Errorf("BaseDelay must be positive, got %v", nd.BaseDelay))
	} else if nd.MaxDelay < nd.BaseDelay {
		errs = append(errs, fmt.Errorf("MaxDelay %v must not be shorter than BaseDelay %v", nd.MaxDelay, nd.BaseDelay))
	}
	if len(errs) > 0 {
		return fmt.Errorf("node deployment: %w", errors.Join(errs...))
	}
	return nil
}

// nodeDeployment is the state of distributed provisioning.
type nodeDeployment struct {
	NodeDeployment
	// node is this node as the topology code and Delete see it: its name
	// and the driver's topology as labels.
	node     *corev1.Node
	nodes    corelisters.NodeLister
	csiNodes storagelisters.CSINodeLister
	delays   *ownerDelays
	poll     time.Duration
	// untaken holds the claims this node declined and explained, or
	// will (nodewait.go).
	untaken untaken
}

// newNodeDeployment builds the static Node and CSINode of this node
// (upstream's fake informers): the Node is labelled with the driver's
// topology, the CSINode lists driver with its node ID and topology keys.
// Their listers replace the shared informers', so that the sidecar of every
// node does not watch every Node.
func newNodeDeployment(nd NodeDeployment, driver string) (*nodeDeployment, error) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nd.NodeName, Labels: maps.Clone(nd.Topology)}}
	csiNode := &storagev1.CSINode{
		ObjectMeta: metav1.ObjectMeta{Name: nd.NodeName},
		Spec: storagev1.CSINodeSpec{Drivers: []storagev1.CSINodeDriver{{
			Name: driver, NodeID: nd.NodeID, TopologyKeys: slices.Sorted(maps.Keys(nd.Topology)),
		}}},
	}
	// One indexer each: both kinds are cluster-scoped and share the key.
	nodes := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	if err := nodes.Add(node); err != nil {
		return nil, fmt.Errorf("node deployment: static node: %w", err)
	}
	csiNodes := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	if err := csiNodes.Add(csiNode); err != nil {
		return nil, fmt.Errorf("node deployment: static CSINode: %w", err)
	}
	return &nodeDeployment{
		NodeDeployment: nd,
		node:           node,
		nodes:          corelisters.NewNodeLister(nodes),
		csiNodes:       storagelisters.NewCSINodeLister(csiNodes),
		delays:         newOwnerDelays(nd.BaseDelay, nd.MaxDelay, rand.Float64),
		poll:           max(nd.BaseDelay/100, minOwnerPoll),
	}, nil
}

// selectedNodeName is the claim's selected node, "" for none.
func selectedNodeName(claim *corev1.PersistentVolumeClaim) string {
	n, _ := selectedNode(claim)
	return n
}

func lateBinding(class *storagev1.StorageClass) bool {
	return class.VolumeBindingMode != nil && *class.VolumeBindingMode == storagev1.VolumeBindingWaitForFirstConsumer
}

// nodeShouldProvision is ShouldProvision's part for node deployment: a
// claim selected for this node goes on; one selected for another node does
// not; one without a selected node only when its class (of this driver)
// binds immediately and ImmediateBinding is on: then this node races the
// others for it here (becomeOwner), before the library posts its
// "Provisioning" event, which every node would otherwise post for every
// claim it tries to take, as upstream does in ShouldProvision. A claim
// taken by this call is provisioned when the informer delivers it with this
// node selected. Claims of other nodes are not errors: no event, a V(4) log.
// An unexpected failure to take the claim (not a lost race, not a decline)
// gives true, so that Provision tries again and its error is reported.
func (p *Provisioner) nodeShouldProvision(ctx context.Context, claim *corev1.PersistentVolumeClaim) bool {
	logger := klog.FromContext(ctx).WithValues("pvc", klog.KObj(claim))
	switch selected := selectedNodeName(claim); selected {
	case p.node.NodeName:
		return true
	case "":
	default:
		logger.V(4).Info("Not provisioning a claim selected for another node", "selectedNode", selected)
		return false
	}
	className := storagehelpers.GetPersistentVolumeClaimClass(claim)
	class, err := p.classes.Get(className)
	switch {
	case err != nil:
		logger.V(4).Info("Not taking a claim without a selected node: its class cannot be read", "class", className, "err", err)
		return false
	case !p.ownsClass(class):
		logger.V(4).Info("Not taking a claim without a selected node: its class names another provisioner", "class", className, "provisioner", class.Provisioner)
		return false
	case lateBinding(class):
		logger.V(4).Info("Not provisioning a claim with delayed binding before the scheduler selects a node")
		return false
	case !p.node.ImmediateBinding:
		logger.V(4).Info("Not taking a claim with immediate binding: immediate binding is off in node deployment")
		p.explainImmediateOff(ctx, claim, className)
		return false
	}
	// becomeOwner's own log lines (why this node declines) name the claim.
	owned, taken, _, err := p.becomeOwner(klog.NewContext(ctx, logger), claim, class)
	switch {
	case err != nil && !isIgnoredError(err) && ctx.Err() == nil:
		// Not a reason to leave the claim to others (the selected-node
		// update failed otherwise): as upstream, Provision tries again, and
		// the library reports its error in a Warning event and retries with
		// backoff. False would leave the claim, unexplained, until its next
		// update or the library's resync.
		logger.V(2).Info("Could not take the claim in advance; trying again in Provision", "err", err)
		return true
	case err != nil:
		logger.V(4).Info("Not taking the claim", "reason", err)
		return false
	case taken:
		logger.V(4).Info("Took the claim for this node; provisioning it when the informer delivers the update")
		return false
	}
	return selectedNodeName(owned) == p.node.NodeName // an earlier call's write has arrived
}

// nodeCheckProvision is CheckProvision's part for node deployment: only a
// claim selected for this node may get the in-flight finalizer before
// Provision sends its CreateVolume; an immediate-binding claim gets it
// from the node that takes it.
func (p *Provisioner) nodeCheckProvision(claim *corev1.PersistentVolumeClaim) error {
	if selected := selectedNodeName(claim); selected != p.node.NodeName {
		return fmt.Errorf("claim %s is not selected for node %s (selected: %q); in node deployment only the selected node provisions it", klog.KObj(claim), p.node.NodeName, selected)
	}
	return nil
}

// takeClaim is Provision's first step in node deployment. It returns the
// claim to provision on this node, and whether this call wrote the
// selected-node annotation (the informer may not have that copy yet).
// A claim selected for another node, or that no node may take, gives an
// *controller.IgnoredError. An immediate-binding claim without a selected
// node is taken with becomeOwner.
func (p *Provisioner) takeClaim(ctx context.Context, claim *corev1.PersistentVolumeClaim, class *storagev1.StorageClass) (*corev1.PersistentVolumeClaim, bool, controller.ProvisioningState, error) {
	selected := selectedNodeName(claim)
	var reason string
	switch {
	case selected == p.node.NodeName:
		return claim, false, controller.ProvisioningFinished, nil
	case selected != "":
		reason = fmt.Sprintf("the claim is selected for node %s", selected)
	case class == nil:
		reason = "the claim's class is unknown"
	case lateBinding(class):
		reason = "the claim waits for the scheduler to select a node"
	case !p.node.ImmediateBinding:
		reason = "immediate binding is off in node deployment"
	default:
		return p.becomeOwner(ctx, claim, class)
	}
	return nil, false, controller.ProvisioningFinished, &controller.IgnoredError{Reason: reason}
}

// becomeOwner tries to take an immediate-binding claim for this node, in
// competition with the provisioners of the other nodes:
//
//  0. A node that the class's allowedTopologies exclude gives up at once
//     (ProvisioningFinished and an IgnoredError; see notAllowedOnThisNode).
//  1. It waits a delay that grows with each attempt for the claim (see
//     ownerDelays), looking at the informer's copy every poll interval. If
//     another node selected itself meanwhile, or the claim is gone or
//     bound, it stops with ProvisioningFinished and an IgnoredError.
//  2. With GetCapacity, it asks the driver for the capacity on this node;
//     too little (or an error) gives ProvisioningNoChange and an
//     IgnoredError: another node may take the claim, and this one tries
//     again when the library next syncs the claim.
//  3. It sets selected-node to this node with an update of the informer's
//     copy. A conflict (or NotFound) means that another writer came
//     first: ProvisioningNoChange and an IgnoredError.
//
// On success it returns the updated claim and true. If the informer's copy
// already names this node (an earlier call won), it returns that copy at
// once, and false. A done ctx gives ProvisioningNoChange and its error.
func (p *Provisioner) becomeOwner(ctx context.Context, claim *corev1.PersistentVolumeClaim, class *storagev1.StorageClass) (*corev1.PersistentVolumeClaim, bool, controller.ProvisioningState, error) {
	logger := klog.FromContext(ctx)
	cur, err := p.unowned(claim)
	if err != nil {
		return nil, false, controller.ProvisioningFinished, err
	}
	if selectedNodeName(cur) == p.node.NodeName {
		return cur, false, controller.ProvisioningFinished, nil
	}
	if reason := p.notAllowedOnThisNode(cur, class); reason != "" {
		logger.V(2).Info("Not taking the claim", "reason", reason)
		p.explainNotAllowed(ctx, cur, reason)
		return nil, false, controller.ProvisioningFinished, &controller.IgnoredError{Reason: reason}
	}

	clk := p.cfg.clock
	delay := p.node.delays.next(claim.UID)
	logger.V(4).Info("Waiting before taking a claim with immediate binding for this node", "delay", delay)
	deadline := clk.Now().Add(delay)
	for {
		remaining := deadline.Sub(clk.Now())
		if remaining <= 0 {
			break
		}
		timer := clk.NewTimer(min(p.node.poll, remaining))
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil, false, controller.ProvisioningNoChange, fmt.Errorf("wait before taking claim %s: %w", klog.KObj(claim), ctx.Err())
		case <-timer.C():
		}
		if cur, err = p.unowned(claim); err != nil {
			logger.V(4).Info("Not taking the claim", "reason", err)
			return nil, false, controller.ProvisioningFinished, err
		}
		if selectedNodeName(cur) == p.node.NodeName {
			return cur, false, controller.ProvisioningFinished, nil // an earlier call's write arrived
		}
	}

	if p.node.GetCapacity != nil {
		if decline := p.checkNodeCapacity(ctx, cur, class); decline != nil {
			logger.V(2).Info("Not taking the claim", "reason", decline.reason)
			p.explainNoCapacity(ctx, cur, *decline)
			return nil, false, controller.ProvisioningNoChange, &controller.IgnoredError{Reason: decline.reason}
		}
	}

	clone := cur.DeepCopy()
	metav1.SetMetaDataAnnotation(&clone.ObjectMeta, storagehelpers.AnnSelectedNode, p.node.NodeName)
	updated, err := p.client.CoreV1().PersistentVolumeClaims(clone.Namespace).Update(ctx, clone, metav1.UpdateOptions{FieldManager: FieldManager})
	switch {
	case apierrors.IsConflict(err), apierrors.IsNotFound(err):
		logger.V(4).Info("Another writer changed the claim before this node could take it", "err", err)
		return nil, false, controller.ProvisioningNoChange, &controller.IgnoredError{
			Reason: fmt.Sprintf("the claim changed before node %s could take it: %v", p.node.NodeName, err),
		}
	case err != nil:
		return nil, false, controller.ProvisioningNoChange, fmt.Errorf("set %s on claim %s: %w", storagehelpers.AnnSelectedNode, klog.KObj(claim), err)
	}
	logger.V(2).Info("Took the claim for this node", "node", p.node.NodeName, "delay", delay)
	return updated, true, controller.ProvisioningFinished, nil
}

// notAllowedOnThisNode says why class's allowedTopologies exclude this
// node's topology, or "" when they do not, so that this node does not take
// an immediate-binding claim that it could never provision: the
// requirement computed for this node as selected node would fail in
// Provision, for ever, and no node the class allows would take the claim
// (upstream's checkNode makes the same test). Without topology support
// allowedTopologies play no part, as in Provision.
func (p *Provisioner) notAllowedOnThisNode(claim *corev1.PersistentVolumeClaim, class *storagev1.StorageClass) string {
	if len(class.AllowedTopologies) == 0 || !p.caps.VolumeAccessibility {
		return ""
	}
	if _, err := p.topologyRequirement(claim, class, p.node.NodeName); err != nil {
		return fmt.Sprintf("storage class %s does not allow node %s: %v", class.Name, p.node.NodeName, err)
	}
	return ""
}

// unowned returns the informer's copy of claim, or an IgnoredError when the
// claim is gone, bound, or selected for another node; then the claim's
// delay is forgotten.
func (p *Provisioner) unowned(claim *corev1.PersistentVolumeClaim) (*corev1.PersistentVolumeClaim, error) {
	var reason string
	cur, err := p.claims.PersistentVolumeClaims(claim.Namespace).Get(claim.Name)
	switch {
	case err != nil || cur.UID != claim.UID:
		reason = "the claim no longer exists"
	case cur.Spec.VolumeName != "":
		reason = fmt.Sprintf("the claim is bound to volume %s", cur.Spec.VolumeName)
	default:
		selected := selectedNodeName(cur)
		switch {
		case selected == p.node.NodeName:
			return cur, nil
		case selected == "" && cur.DeletionTimestamp != nil:
			// Taking it would only create a volume to delete again; the
			// node whose CreateVolume got the last, final answer releases
			// its in-flight finalizer (nodeGuards).
			reason = "the claim is being deleted"
		case selected == "":
			return cur, nil
		default:
			reason = fmt.Sprintf("node %s took the claim", selected)
		}
	}
	p.node.forget(claim.UID)
	return nil, &controller.IgnoredError{Reason: reason}
}

// capacityDecline is why this node did not take a claim for capacity.
type capacityDecline struct {
	reason    string
	requested int64 // bytes
	// room is the size the driver could create on this node then
	// (available, or the maximum volume size when that was the limit).
	room int64
}

// checkNodeCapacity asks the driver whether this node has room for claim.
// It returns nil if so, or if the driver cannot tell (as upstream: a
// capacity check that fails does not keep the node from taking the claim;
// CreateVolume then answers), otherwise why not.
func (p *Provisioner) checkNodeCapacity(ctx context.Context, claim *corev1.PersistentVolumeClaim, class *storagev1.StorageClass) *capacityDecline {
	request := claim.Spec.Resources.Requests[corev1.ResourceStorage]
	requested := request.Value()
	req := &csi.GetCapacityRequest{Parameters: csiclient.DriverParameters(class.Parameters)}
	// The capabilities the volume will be created with, as upstream asks:
	// a driver may have room for a block volume and not for a filesystem.
	// A class or claim they cannot be made of fails CreateVolume later
	// with its own error; the capacity question goes without them.
	if fsType, err := p.fsType(logr.Discard(), class.Parameters); err == nil {
		if caps, err := p.volumeCapabilities(claim, class, fsType); err == nil {
			req.VolumeCapabilities = caps
		}
	}
	if p.caps.VolumeAccessibility && len(p.node.Topology) > 0 {
		req.AccessibleTopology = &csi.Topology{Segments: maps.Clone(p.node.Topology)}
	}
	resp, err := p.node.GetCapacity(ctx, req)
	if err != nil {
		klog.FromContext(ctx).V(2).Info("Taking the claim although the capacity check failed", "pvc", klog.KObj(claim), "err", err)
		return nil
	}
	if maxSize := resp.GetMaximumVolumeSize(); maxSize != nil && maxSize.GetValue() < requested {
		return &capacityDecline{
			reason:    fmt.Sprintf("node %s has not enough capacity: maximum volume size %d bytes, %d requested", p.node.NodeName, maxSize.GetValue(), requested),
			requested: requested, room: maxSize.GetValue(),
		}
	}
	if available := resp.GetAvailableCapacity(); available < requested {
		return &capacityDecline{
			reason:    fmt.Sprintf("node %s has not enough capacity: %d bytes available, %d requested", p.node.NodeName, available, requested),
			requested: requested, room: available,
		}
	}
	return nil
}

// ownedCopy returns the copy of claim that Provision goes on with in node
// deployment: the informer's copy cur if it names this node, otherwise the
// copy from this call's own selected-node write (taken), which the
// informer has not delivered yet. A claim that no longer names this node
// (it was rescheduled since the library's copy was made) gives an
// IgnoredError.
func (p *Provisioner) ownedCopy(cur, claim *corev1.PersistentVolumeClaim, taken bool) (*corev1.PersistentVolumeClaim, error) {
	switch {
	case selectedNodeName(cur) == p.node.NodeName:
		return cur, nil
	case taken:
		return claim, nil
	}
	return nil, &controller.IgnoredError{Reason: fmt.Sprintf("the claim is no longer selected for node %s", p.node.NodeName)}
}

// nodeGuards reports whether the in-flight guard of this node may act on
// claim. The ledger assumes that only this process sends CreateVolume for
// the claims it records, which in node deployment holds for the claims
// selected for this node; another node may send CreateVolume for the
// others. One exception: a claim without a selected node whose last
// CreateVolume this node sent and got a final answer to (this node
// rescheduled it), when it has delayed binding or is being deleted. No
// node takes such a claim (until the scheduler selects one, or at all:
// see unowned), so no CreateVolume can be in flight for it, and without
// this exception nobody would release it if it is deleted meanwhile: with
// immediate binding, while no node has room for it, it would stay
// Terminating.
func (p *Provisioner) nodeGuards(claim *corev1.PersistentVolumeClaim) bool {
	switch selected := selectedNodeName(claim); selected {
	case p.node.NodeName:
		return true
	case "":
		if !p.attempts.isFinal(claim.UID) {
			return false
		}
		if claim.DeletionTimestamp != nil {
			return true
		}
		class, err := p.classes.Get(storagehelpers.GetPersistentVolumeClaimClass(claim))
		return err == nil && lateBinding(class)
	default:
		// Another node took it: this one will not try to.
		p.node.forget(claim.UID)
		return false
	}
}

// isFinal reports whether the last CreateVolume this process sent for the
// claim got a final answer (and the claim was not released since).
func (l *ledger) isFinal(uid types.UID) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.states[uid] == attemptFinal
}

// checkVolumeNode is Delete's part for node deployment: only the node that
// the volume's node affinity allows deletes it; for the others it returns
// an IgnoredError. A volume without node affinity is never deleted in node
// deployment: every node's driver would answer "deleted" for a volume it
// does not have, and the PV would go while the real volume leaks.
func (p *Provisioner) checkVolumeNode(ctx context.Context, pv *corev1.PersistentVolume) error {
	logger := klog.FromContext(ctx)
	mine, reason := p.node.owns(pv)
	switch {
	case mine:
		return nil
	case pv.Spec.NodeAffinity == nil || pv.Spec.NodeAffinity.Required == nil:
		logger.V(2).Info("Not deleting a volume without node affinity in node deployment: no node can tell whether the volume is its own", "pv", klog.KObj(pv))
		p.recorder.Event(pv, corev1.EventTypeWarning, reasonVolumeFailedDelete,
			fmt.Sprintf("node %s does not delete this volume: it has no node affinity, and in node deployment no node can tell whether the volume is its own (another node's driver would report it deleted while it stays); delete it on its node's storage and remove the PV by hand", p.node.NodeName))
	default:
		logger.V(4).Info("Not deleting a volume of another node", "pv", klog.KObj(pv), "reason", reason)
	}
	return &controller.IgnoredError{Reason: reason}
}

// owns reports whether pv's volume is on this node, and if not, why not.
// A volume without node affinity is not tied to a node: the node of a
// driver that reports no topology may delete it, as upstream; for any other
// node it is nobody's. A volume with node affinity is this node's only when
// this node has a topology and the affinity allows it: a node without one
// cannot tell (an affinity with NotIn or DoesNotExist would match its empty
// labels), and its driver would answer DeleteVolume for another node's
// volume with OK.
func (nd *nodeDeployment) owns(pv *corev1.PersistentVolume) (bool, string) {
	if pv.Spec.NodeAffinity == nil || pv.Spec.NodeAffinity.Required == nil {
		if len(nd.Topology) == 0 {
			return true, "" // no node-local volumes: any node deletes them, as upstream
		}
		return false, "the volume has no node affinity; in node deployment no node can tell whether it is its own"
	}
	if len(nd.Topology) == 0 {
		return false, fmt.Sprintf("the volume has node affinity and the driver of node %s reports no topology", nd.NodeName)
	}
	selector, err := nodeaffinity.NewNodeSelector(pv.Spec.NodeAffinity.Required)
	if err != nil {
		return false, fmt.Sprintf("the volume's node affinity is invalid: %v", err)
	}
	if !selector.Match(nd.node) {
		return false, fmt.Sprintf("the volume's node affinity does not allow node %s", nd.NodeName)
	}
	return true, ""
}

// ownerDelays is the per-claim delay before a node tries to take an
// immediate-binding claim: base on the first attempt, doubling with each
// further one up to max, plus a random jitter of up to 50% (added after
// the cap, so that nodes at the cap still spread; a wait lasts at most
// 1.5 × max). Entries are keyed by claim UID and forgotten when the claim
// is provisioned, gone, or taken by another node.
type ownerDelays struct {
	// limiter counts the attempts per claim and doubles the delay from
	// base up to max (client-go's per-item exponential backoff).
	limiter workqueue.TypedRateLimiter[types.UID]
	jitter  func() float64 // in [0, 1)
	base    time.Duration
}

func newOwnerDelays(base, maxDelay time.Duration, jitter func() float64) *ownerDelays {
	return &ownerDelays{limiter: workqueue.NewTypedItemExponentialFailureRateLimiter[types.UID](base, maxDelay), jitter: jitter, base: base}
}

// next returns the delay of the next attempt for uid and counts it.
func (d *ownerDelays) next(uid types.UID) time.Duration {
	delay := d.limiter.When(uid)
	// As upstream: minus up to one base delay, so that the first attempt
	// waits 0..base and none more than max.
	return max(0, delay-time.Duration(d.jitter()*float64(d.base)))
}

func (d *ownerDelays) forget(uid types.UID) { d.limiter.Forget(uid) }

// counted reports whether an attempt for uid is counted.
func (d *ownerDelays) counted(uid types.UID) bool { return d.limiter.NumRequeues(uid) > 0 }
