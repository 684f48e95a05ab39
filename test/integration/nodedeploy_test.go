package integration

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kube-storage/csi-provisioner/internal/controlplane"
	"github.com/kube-storage/csi-provisioner/internal/e2e"
	"github.com/kube-storage/csi-provisioner/internal/testutil"
)

// selectedNodeAnn is the scheduler's annotation that names a claim's node.
const selectedNodeAnn = "volume.kubernetes.io/selected-node"

// TestNodeDeployment runs distributed provisioning as a DaemonSet would: two
// nodes, each with its own hostpath driver (which can only create volumes
// on its node) and its own sidecar with --node-deployment and NODE_NAME, and
// kube-controller-manager's binder (the built-in one is off in this mode).
// A WaitForFirstConsumer claim for node B gets its volume from node B's
// driver only. Immediate claims are taken by exactly one node each: the
// claim names it (selected-node), its volume is in that node's driver and
// nowhere else, and the PV's node affinity names that node. Each node
// publishes the CSIStorageCapacity of its own segment (10Gi less its
// volumes of either class, refreshed by PV events). Deleting the claims
// deletes every volume through the sidecar of its node only: with
// node B's sidecar down, B's PVs stay and B's volumes with
// them, until B's sidecar is back; no driver keeps a volume. A claim no
// node has room for gets one Warning that says so. GetCapacity gets the
// class's parameters without the sidecar's own.
func TestNodeDeployment(t *testing.T) {
	const immediate = 6
	cp := controlplane.StartForTest(t, controlplane.Config{
		Controllers: append([]string{controlplane.PVBinderController}, controlplane.DefaultControllers...),
	})
	e := newEnv(t, cp)
	nodes := map[string]*stack{}
	for _, n := range []string{"a", "b"} {
		name := e.name("node-" + n)
		nodes[name] = e.startNodeStack(name)
	}
	nodeA, nodeB := e.name("node-a"), e.name("node-b")
	// The classes carry a parameter for the sidecar (fstype): the driver
	// refuses it, so GetCapacity (capacity objects, the node's check before
	// taking a claim) must leave it out, as CreateVolume does.
	wffc := e.createClass(testutil.NewSC(e.name("wffc"), e.driver).WaitForFirstConsumer().Param("csi.storage.k8s.io/fstype", "ext4"))
	imm := e.createClass(testutil.NewSC(e.name("immediate"), e.driver).Param("csi.storage.k8s.io/fstype", "ext4"))

	e.createClaim(testutil.NewPVC(e.ns, "wffc-b").Class(wffc.Name).Annotation(selectedNodeAnn, nodeB))
	for i := range immediate {
		e.createClaim(testutil.NewPVC(e.ns, fmt.Sprintf("imm-%d", i)).Class(imm.Name))
	}

	claims := e.waitAllBound(immediate + 1)

	// Nodes race for Immediate claims before the library posts its
	// Provisioning event: every claim's Provisioning events come from one
	// node's sidecar, the one that took it.
	events, err := e.c.CoreV1().Events(e.ns).List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sources := map[string]map[string]bool{}
	for _, ev := range events.Items {
		if ev.Reason != "Provisioning" {
			continue
		}
		if sources[ev.InvolvedObject.Name] == nil {
			sources[ev.InvolvedObject.Name] = map[string]bool{}
		}
		sources[ev.InvolvedObject.Name][ev.Source.Component] = true
	}
	for claim, from := range sources {
		if len(from) > 1 {
			t.Errorf("claim %s: Provisioning events from %d sidecars %v, want only the node that took it", claim, len(from), slices.Collect(maps.Keys(from)))
		}
	}

	// A claim neither node has room for (each has 10Gi) stays Pending, and
	// one event, from whichever node posts it first, says why; the other
	// node's create of the same event finds it there.
	tooBig := e.createClaim(testutil.NewPVC(e.ns, "too-big").Class(imm.Name).Size("20Gi"))
	var posted string
	testutil.Eventually(t, 0, "the event that explains claim too-big", func(ctx context.Context) (bool, error) {
		ev, err := e.c.CoreV1().Events(e.ns).Get(ctx, string(tooBig.UID)+".no-node-takes-it", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		if _, ok := nodes[ev.Source.Host]; !ok || ev.Type != corev1.EventTypeWarning || ev.Reason != "ProvisioningFailed" ||
			ev.InvolvedObject.UID != tooBig.UID ||
			!strings.Contains(ev.Message, fmt.Sprintf("no node took the claim within 600ms: node %s has not enough capacity: ", ev.Source.Host)) {
			return false, fmt.Errorf("event %s: %s %s %q from %q", ev.Name, ev.Type, ev.Reason, ev.Message, ev.Source.Host)
		}
		posted = ev.Source.Host
		return true, nil
	})
	for node, s := range nodes {
		want := "Another node already explained why no node takes the claim"
		if node == posted {
			want = "No node takes the claim"
		}
		if err := s.sidecar.WaitLog(t.Context(), want); err != nil {
			t.Errorf("node %s: %v", node, err)
		}
	}
	if c, err := e.c.CoreV1().PersistentVolumeClaims(e.ns).Get(t.Context(), tooBig.Name, metav1.GetOptions{}); err != nil || c.Spec.VolumeName != "" || c.Annotations[selectedNodeAnn] != "" {
		t.Errorf("claim too-big: %v, %v; want it Pending, taken by no node", c, err)
	}

	// Each volume is in the driver of the claim's node, and only there.
	want := map[string][]string{nodeA: nil, nodeB: nil}
	for _, c := range claims {
		node := c.Annotations[selectedNodeAnn]
		if _, ok := want[node]; !ok {
			t.Errorf("claim %s: selected-node %q, want one of the two nodes", c.Name, node)
			continue
		}
		if c.Name == "wffc-b" && node != nodeB {
			t.Errorf("claim wffc-b moved to %s", node)
		}
		pv := e.getPV(c.Spec.VolumeName)
		if got := affinityNodes(pv); !slices.Equal(got, []string{node}) {
			t.Errorf("claim %s on %s: PV %s node affinity %v, want [%s]", c.Name, node, pv.Name, got, node)
		}
		want[node] = append(want[node], pv.Spec.CSI.VolumeHandle)
	}
	for node, s := range nodes {
		s.waitVolumeIDs(want[node]...)
		t.Logf("node %s: %d volumes", node, len(want[node]))
	}

	// Each node publishes the capacity of its own segment for the
	// WaitForFirstConsumer class: 10Gi less its 1Gi volumes, whatever their
	// class (the poll interval is an hour: the PV events refresh it).
	testutil.Eventually(t, 0, "each node's CSIStorageCapacity", func(ctx context.Context) (bool, error) {
		list, err := e.c.StorageV1().CSIStorageCapacities(e.ns).List(ctx, metav1.ListOptions{})
		if err != nil || len(list.Items) != len(nodes) {
			return false, err
		}
		for _, c := range list.Items {
			node := c.NodeTopology.MatchLabels[e2e.TopologyKey]
			left := resource.MustParse(fmt.Sprintf("%dGi", 10-len(want[node])))
			if _, ok := nodes[node]; !ok || c.StorageClassName != wffc.Name || c.Labels["csi.storage.k8s.io/managed-by"] != "external-provisioner-"+node ||
				c.Capacity == nil || c.Capacity.Cmp(left) != 0 {
				t.Logf("object %s: node %q, class %s, managed-by %q, capacity %v (want %s)", c.Name, node, c.StorageClassName, c.Labels["csi.storage.k8s.io/managed-by"], c.Capacity, left.String())
				return false, nil
			}
		}
		return true, nil
	})

	// Node B's sidecar is down while every claim is deleted: node A
	// deletes its own volumes and leaves B's PVs alone, whatever their phase (its driver would
	// call B's volumes deleted, and the PVs would go while the volumes
	// stay on B). B, restarted, deletes its own.
	if err := nodes[nodeB].sidecar.Stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	pvsOf := map[string][]string{}
	for _, c := range claims {
		pvsOf[c.Annotations[selectedNodeAnn]] = append(pvsOf[c.Annotations[selectedNodeAnn]], c.Spec.VolumeName)
		e.deleteClaim(c.Name)
	}
	e.waitPVsGone(pvsOf[nodeA]...)
	nodes[nodeA].waitVolumeIDs()
	for _, name := range pvsOf[nodeB] {
		if _, err := e.c.CoreV1().PersistentVolumes().Get(t.Context(), name, metav1.GetOptions{}); err != nil {
			t.Errorf("PV %s of node B while node B's sidecar is down: %v; want it kept (its volume is still on node B)", name, err)
		}
	}
	if err := nodes[nodeB].sidecar.Restart(); err != nil {
		t.Fatal(err)
	}
	e.waitPVsGone(pvsOf[nodeB]...)
	nodes[nodeB].waitVolumeIDs()
}

// TestNodeDeploymentFreedCapacity checks that a claim a node declined for
// capacity is provisioned as soon as a volume of that node is deleted: one
// node with 10Gi, a 6Gi claim bound, a second 6Gi claim declined (its
// Warning says why), then the first claim deleted. The provisioning library
// would sync the declined claim again only at its resync, minutes later.
func TestNodeDeploymentFreedCapacity(t *testing.T) {
	cp := controlplane.StartForTest(t, controlplane.Config{
		Controllers: append([]string{controlplane.PVBinderController}, controlplane.DefaultControllers...),
	})
	e := newEnv(t, cp)
	node := e.name("node")
	s := e.startNodeStack(node)
	imm := e.createClass(testutil.NewSC(e.name("immediate"), e.driver))

	first := e.createClaim(testutil.NewPVC(e.ns, "first").Class(imm.Name).Size("6Gi"))
	e.waitAllBound(1)
	second := e.createClaim(testutil.NewPVC(e.ns, "second").Class(imm.Name).Size("6Gi"))
	testutil.Eventually(t, 0, "the event that explains claim second", func(ctx context.Context) (bool, error) {
		ev, err := e.c.CoreV1().Events(e.ns).Get(ctx, string(second.UID)+".no-node-takes-it", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return err == nil && strings.Contains(ev.Message, "node "+node+" has not enough capacity: "), err
	})

	e.deleteClaim(first.Name)
	claims := e.waitAllBound(1)
	if claims[0].UID != second.UID || claims[0].Annotations[selectedNodeAnn] != node {
		t.Errorf("bound claim %s (selected-node %q), want second on %s", claims[0].Name, claims[0].Annotations[selectedNodeAnn], node)
	}
	s.waitVolumeIDs(e.getPV(claims[0].Spec.VolumeName).Spec.CSI.VolumeHandle)
}

// waitPVsGone waits until none of the named PVs exists.
func (e *env) waitPVsGone(names ...string) {
	e.t.Helper()
	testutil.Eventually(e.t, 0, "PVs of deleted claims still exist", func(ctx context.Context) (bool, error) {
		for _, name := range names {
			_, err := e.c.CoreV1().PersistentVolumes().Get(ctx, name, metav1.GetOptions{})
			if !apierrors.IsNotFound(err) {
				return false, err
			}
		}
		return true, nil
	})
}

// startNodeStack starts, for node, a hostpath driver (10Gi) that reports
// node as its node ID and topology, registers the node (Node and CSINode,
// as the kubelet would), and starts a sidecar with --node-deployment,
// NODE_NAME=node and --enable-capacity in the test's namespace. Short
// delays let Immediate claims be taken quickly. extraArgs are added to the
// sidecar's flags.
func (e *env) startNodeStack(node string, extraArgs ...string) *stack {
	e.t.Helper()
	return e.startStackWith(e.nodeStackConfig(node, extraArgs...))
}

// nodeStackConfig is the stack that startNodeStack starts.
func (e *env) nodeStackConfig(node string, extraArgs ...string) stackConfig {
	return stackConfig{
		driver: e2e.DriverConfig{Topology: true, NodeID: node, Args: []string{"--capacity=10Gi"}},
		sidecarArgs: append([]string{"-v=4", "--node-deployment", "--node-deployment-base-delay=50ms", "--node-deployment-max-delay=400ms",
			"--retry-interval-start=200ms", "--retry-interval-max=2s",
			"--enable-capacity", "--capacity-ownerref-level=-1", "--capacity-poll-interval=1h"}, extraArgs...),
		sidecarEnv: []string{"NODE_NAME=" + node, "NAMESPACE=" + e.ns},
	}
}

// affinityNodes returns the values of the driver's topology key in the
// PV's required node affinity.
func affinityNodes(pv *corev1.PersistentVolume) []string {
	var out []string
	if pv.Spec.NodeAffinity == nil || pv.Spec.NodeAffinity.Required == nil {
		return nil
	}
	for _, term := range pv.Spec.NodeAffinity.Required.NodeSelectorTerms {
		for _, expr := range term.MatchExpressions {
			if expr.Key == e2e.TopologyKey {
				out = append(out, expr.Values...)
			}
		}
	}
	return out
}

// TestNodeDeploymentVolumeWithoutAffinity: in node deployment with a driver
// that reports topology, a Released PV of the driver with reclaim policy
// Delete but no node affinity is deleted by no node: each node posts a
// Warning VolumeFailedDelete that says why, and the PV and its volume in
// node A's driver stay, also when the nodes sync the PV again (node B's
// driver, which does not have the volume, would call it deleted). A control
// PV of node A with node affinity, Released at the same time, is deleted.
func TestNodeDeploymentVolumeWithoutAffinity(t *testing.T) {
	cp := controlplane.StartForTest(t, controlplane.Config{
		Controllers: append([]string{controlplane.PVBinderController}, controlplane.DefaultControllers...),
	})
	e := newEnv(t, cp)
	nodeA, nodeB := e.name("node-a"), e.name("node-b")
	nodes := map[string]*stack{nodeA: e.startNodeStack(nodeA), nodeB: e.startNodeStack(nodeB)}

	// Both claimRefs name a claim that no longer exists: the binder of
	// kube-controller-manager releases the volumes at once.
	released := func(name, id string) *testutil.PVBuilder {
		return nodes[nodeA].staticPV(e.name(name), id).ReclaimPolicy(corev1.PersistentVolumeReclaimDelete).
			Annotation(annProvisionedBy, e.driver).ClaimRef(e.ns, name, "6d3c3f9e-0000-4000-8000-000000000000")
	}
	orphanID := nodes[nodeA].createVolume(e.name("orphan"))
	controlID := nodes[nodeA].createVolume(e.name("control"))
	orphan := e.createPV(released("orphan", orphanID))
	control := e.createPV(released("control", controlID).NodeAffinity(e2e.TopologyKey, nodeA))

	e.waitPVGone(control.Name)
	// Each node says why it does not delete the PV; the test stops at once
	// if one deletes it instead.
	var last []string
	testutil.Eventually(t, 0, "a Warning VolumeFailedDelete from each node", func(ctx context.Context) (bool, error) {
		pv, err := e.c.CoreV1().PersistentVolumes().Get(ctx, orphan.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			return false, fmt.Errorf("PV %s without node affinity was deleted (events %q)", orphan.Name, last)
		case err != nil:
			return false, err
		case pv.DeletionTimestamp != nil:
			return false, fmt.Errorf("PV %s without node affinity is being deleted (events %q)", orphan.Name, last)
		}
		if last, err = e.events(ctx, orphan.UID); err != nil {
			return false, err
		}
		for node := range nodes {
			want := "Warning VolumeFailedDelete: node " + node + " does not delete this volume: it has no node affinity, " +
				"and in node deployment no node can tell whether the volume is its own"
			if !slices.ContainsFunc(last, func(ev string) bool { return strings.HasPrefix(ev, want) }) {
				return false, nil
			}
		}
		return true, nil
	})

	// Each node syncs the PV again (an update of it) and declines again:
	// its log says so once more, naming the PV.
	declined := `Not deleting a volume without node affinity in node deployment: no node can tell whether the volume is its own" pv="` + orphan.Name + `"`
	before := map[string]int{}
	for node, s := range nodes {
		before[node] = s.logCount(declined)
	}
	if _, err := e.c.CoreV1().PersistentVolumes().Patch(t.Context(), orphan.Name, types.MergePatchType,
		[]byte(`{"metadata":{"labels":{"touched":"yes"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	for node, s := range nodes {
		testutil.Eventually(t, 0, "node "+node+" did not sync the touched PV", func(context.Context) (bool, error) {
			return s.logCount(declined) > before[node], nil
		})
		t.Logf("node %s: %q logged %d times before the update, %d after", node, declined, before[node], s.logCount(declined))
	}

	got := e.getPV(orphan.Name)
	if got.DeletionTimestamp != nil || got.Status.Phase != corev1.VolumeReleased {
		t.Errorf("PV without node affinity: deletionTimestamp %v, phase %s; want nil, Released", got.DeletionTimestamp, got.Status.Phase)
	}
	for node, s := range nodes {
		want := []string(nil)
		if node == nodeA {
			want = []string{orphanID}
		}
		if ids, err := s.volumeIDs(t.Context()); err != nil || !slices.Equal(ids, want) {
			t.Errorf("node %s: driver volumes %v (%v), want %v", node, ids, err, want)
		}
	}
}

// TestNodeDeploymentImmediateBindingOff: with
// --node-deployment-immediate-binding=false no node takes an Immediate
// claim. The claim gets at once one Warning ProvisioningFailed, named
// <claim UID>.no-node-takes-it and posted by one of the two nodes, that
// says why and what to do; once both nodes have declined it, it is Pending
// with no selected node and no volume. A WaitForFirstConsumer claim with a
// selected node is still provisioned by that node.
func TestNodeDeploymentImmediateBindingOff(t *testing.T) {
	cp := controlplane.StartForTest(t, controlplane.Config{
		Controllers: append([]string{controlplane.PVBinderController}, controlplane.DefaultControllers...),
	})
	e := newEnv(t, cp)
	nodeA, nodeB := e.name("node-a"), e.name("node-b")
	nodes := map[string]*stack{
		nodeA: e.startNodeStack(nodeA, "--node-deployment-immediate-binding=false"),
		nodeB: e.startNodeStack(nodeB, "--node-deployment-immediate-binding=false"),
	}
	imm := e.createClass(testutil.NewSC(e.name("immediate"), e.driver))
	wffc := e.createClass(testutil.NewSC(e.name("wffc"), e.driver).WaitForFirstConsumer())

	claim := e.createClaim(testutil.NewPVC(e.ns, "immediate").Class(imm.Name))
	var ev *corev1.Event
	testutil.Eventually(t, 0, "the event that explains claim immediate", func(ctx context.Context) (bool, error) {
		cur, err := e.c.CoreV1().PersistentVolumeClaims(e.ns).Get(ctx, claim.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if node := cur.Annotations[selectedNodeAnn]; node != "" || cur.Spec.VolumeName != "" {
			return false, fmt.Errorf("claim taken: selected node %q, volume %q", node, cur.Spec.VolumeName)
		}
		ev, err = e.c.CoreV1().Events(e.ns).Get(ctx, string(claim.UID)+".no-node-takes-it", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return err == nil, err
	})
	want := fmt.Sprintf("no node takes this claim: its storageclass %q binds Immediately, and the provisioners of %s run on each node (--node-deployment) "+
		"with --node-deployment-immediate-binding=false, so they provision only claims with a selected node; use a storage class with volumeBindingMode WaitForFirstConsumer",
		imm.Name, e.driver)
	if _, ok := nodes[ev.Source.Host]; !ok || ev.Type != corev1.EventTypeWarning || ev.Reason != "ProvisioningFailed" ||
		ev.InvolvedObject.UID != claim.UID || ev.Message != want || ev.Count != 1 {
		t.Errorf("event %s: %s %s %q from %q, count %d; want Warning ProvisioningFailed %q from one of the nodes, count 1",
			ev.Name, ev.Type, ev.Reason, ev.Message, ev.Source.Host, ev.Count, want)
	}
	// Both nodes have seen the claim: one posted the event, the other found
	// it there.
	for node, s := range nodes {
		msg := "Another node already explained why no node takes the claim"
		if node == ev.Source.Host {
			msg = "No node takes the claim"
		}
		if err := s.sidecar.WaitLog(t.Context(), msg); err != nil {
			t.Errorf("node %s: %v", node, err)
		}
	}

	// Control: a claim with a selected node is provisioned by its node.
	e.createClaim(testutil.NewPVC(e.ns, "wffc").Class(wffc.Name).Annotation(selectedNodeAnn, nodeB))
	bound := e.waitClaim("wffc", "Bound", isBound)
	nodes[nodeB].waitVolumeIDs(e.getPV(bound.Spec.VolumeName).Spec.CSI.VolumeHandle)

	got := e.getClaim(claim.Name)
	if got.Status.Phase != corev1.ClaimPending || got.Spec.VolumeName != "" || metav1.HasAnnotation(got.ObjectMeta, selectedNodeAnn) {
		t.Errorf("immediate claim: phase %s, volumeName %q, annotations %v; want Pending, no volume, no selected node",
			got.Status.Phase, got.Spec.VolumeName, got.Annotations)
	}
	if ids, err := nodes[nodeA].volumeIDs(t.Context()); err != nil || len(ids) != 0 {
		t.Errorf("node %s: driver volumes %v (%v), want none", nodeA, ids, err)
	}
	pvs, err := e.c.CoreV1().PersistentVolumes().List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(pvs.Items) != 1 || pvs.Items[0].Name != bound.Spec.VolumeName {
		t.Errorf("%d PVs, want only %s of the claim with a selected node", len(pvs.Items), bound.Spec.VolumeName)
	}
	var count int32
	if evs, err := e.c.CoreV1().Events(e.ns).List(t.Context(), metav1.ListOptions{FieldSelector: "involvedObject.uid=" + string(claim.UID)}); err != nil {
		t.Fatal(err)
	} else {
		for _, ev := range evs.Items {
			if ev.Reason == "ProvisioningFailed" {
				count += ev.Count
			}
		}
	}
	if count != 1 {
		t.Errorf("immediate claim: %d ProvisioningFailed events, want 1", count)
	}
}

// TestNodeDeploymentNoTopologyDeletes: with a driver that reports no
// topology, volumes are not tied to a node, so in node deployment a
// Released Delete PV of the driver without node affinity is deleted, its
// volume with it, as upstream does.
func TestNodeDeploymentNoTopologyDeletes(t *testing.T) {
	cp := controlplane.StartForTest(t, controlplane.Config{
		Controllers: append([]string{controlplane.PVBinderController}, controlplane.DefaultControllers...),
	})
	e := newEnv(t, cp)
	node := e.name("node")
	s := e.startStackWith(stackConfig{
		driver: e2e.DriverConfig{NodeID: node},
		sidecarArgs: []string{"-v=4", "--node-deployment", "--node-deployment-base-delay=50ms", "--node-deployment-max-delay=400ms",
			"--retry-interval-start=200ms", "--retry-interval-max=2s"},
		sidecarEnv: []string{"NODE_NAME=" + node},
	})
	id := s.createVolume(e.name("orphan"))
	orphan := e.createPV(s.staticPV(e.name("orphan"), id).ReclaimPolicy(corev1.PersistentVolumeReclaimDelete).
		Annotation(annProvisionedBy, e.driver).ClaimRef(e.ns, "gone", "6d3c3f9e-0000-4000-8000-000000000000"))
	testutil.Eventually(t, 0, "PV "+orphan.Name+" not deleted", func(ctx context.Context) (bool, error) {
		evs, err := e.events(ctx, orphan.UID)
		if err != nil {
			return false, err
		}
		if i := slices.IndexFunc(evs, func(ev string) bool { return strings.HasPrefix(ev, "Warning ") }); i >= 0 {
			return false, fmt.Errorf("event of the PV: %q", evs[i])
		}
		_, err = e.c.CoreV1().PersistentVolumes().Get(ctx, orphan.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, err
	})
	s.waitVolumeIDs()
}

// TestNodeDeploymentExplainUntakenRetried: the event that explains an
// Immediate claim no node takes is posted even when kube-apiserver fails
// its first create. The sidecar (--node-deployment-immediate-binding=false)
// reaches kube-apiserver through a proxy that answers every event create
// with 503 until the sidecar has logged the failed post; the explanation
// must then appear within the retry's few seconds, not at the renewal half
// an hour later, and only once.
func TestNodeDeploymentExplainUntakenRetried(t *testing.T) {
	cp := controlplane.StartForTest(t, controlplane.Config{
		Controllers: append([]string{controlplane.PVBinderController}, controlplane.DefaultControllers...),
	})
	e := newEnv(t, cp)
	var failEvents atomic.Bool
	failEvents.Store(true)
	_, kubeconfig := startFaultProxy(t, cp, 1, func(r *http.Request, watch bool, _ *rand.Rand) fault {
		if !watch && r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/events") && failEvents.Load() {
			return fault503
		}
		return faultNone
	})
	node := e.name("node")
	cfg := e.nodeStackConfig(node, "--node-deployment-immediate-binding=false")
	cfg.kubeconfig = kubeconfig
	s := e.startStackWith(cfg)
	imm := e.createClass(testutil.NewSC(e.name("immediate"), e.driver))

	claim := e.createClaim(testutil.NewPVC(e.ns, "immediate").Class(imm.Name))
	if err := s.sidecar.WaitLog(t.Context(), "Could not post the event that explains why no node takes the claim"); err != nil {
		t.Fatal(err)
	}
	failEvents.Store(false)
	var ev *corev1.Event
	testutil.Eventually(t, time.Minute, "the event that explains claim immediate, posted again", func(ctx context.Context) (bool, error) {
		var err error
		ev, err = e.c.CoreV1().Events(e.ns).Get(ctx, string(claim.UID)+".no-node-takes-it", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return err == nil, err
	})
	if ev.Source.Host != node || ev.Type != corev1.EventTypeWarning || ev.Reason != "ProvisioningFailed" || ev.Count != 1 ||
		!strings.HasPrefix(ev.Message, "no node takes this claim: its storageclass") {
		t.Errorf("event %s: %s %s %q from %q, count %d; want Warning ProvisioningFailed \"no node takes this claim...\" from %s, count 1",
			ev.Name, ev.Type, ev.Reason, ev.Message, ev.Source.Host, ev.Count, node)
	}
	if err := s.sidecar.WaitLog(t.Context(), "No node takes the claim"); err != nil {
		t.Error(err)
	}
}

// TestNodeDeploymentLostNodeClaim checks the README's recovery of a claim
// taken by a node that is gone for good: an Immediate claim whose
// selected-node names a node without a sidecar (no Node, no CSINode) is
// left alone by the live node (it logs why) and stays Pending, taken by
// nobody else; once an administrator removes the annotation, the live node
// takes it and provisions it.
func TestNodeDeploymentLostNodeClaim(t *testing.T) {
	cp := controlplane.StartForTest(t, controlplane.Config{
		Controllers: append([]string{controlplane.PVBinderController}, controlplane.DefaultControllers...),
	})
	e := newEnv(t, cp)
	node, lost := e.name("node"), e.name("lost")
	s := e.startNodeStack(node)
	imm := e.createClass(testutil.NewSC(e.name("immediate"), e.driver))

	claim := e.createClaim(testutil.NewPVC(e.ns, "stranded").Class(imm.Name).Annotation(selectedNodeAnn, lost))
	if err := s.sidecar.WaitLog(t.Context(), `"Not provisioning a claim selected for another node" pvc="`+e.ns+`/stranded" selectedNode="`+lost+`"`); err != nil {
		t.Fatal(err)
	}
	got := e.getClaim(claim.Name)
	if got.Spec.VolumeName != "" || got.Annotations[selectedNodeAnn] != lost {
		t.Errorf("claim of the lost node: volume %q, selected-node %q; want none, %s", got.Spec.VolumeName, got.Annotations[selectedNodeAnn], lost)
	}

	// As the README says: guarded by the resourceVersion of the read that
	// showed no in-flight finalizer.
	if inflight := "csi-provisioner.kube-storage.io/provisioning"; slices.Contains(got.Finalizers, inflight) {
		t.Fatalf("claim of the lost node has finalizer %s", inflight)
	}
	if _, err := e.c.CoreV1().PersistentVolumeClaims(e.ns).Patch(t.Context(), claim.Name, types.MergePatchType,
		[]byte(`{"metadata":{"resourceVersion":"`+got.ResourceVersion+`","annotations":{"`+selectedNodeAnn+`":null}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	bound := e.waitClaim(claim.Name, "Bound", isBound)
	if bound.Annotations[selectedNodeAnn] != node {
		t.Errorf("released claim: selected-node %q, want %s", bound.Annotations[selectedNodeAnn], node)
	}
	s.waitVolumeIDs(e.getPV(bound.Spec.VolumeName).Spec.CSI.VolumeHandle)
}
