package provisioner

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/util/workqueue"
	storagehelpers "k8s.io/component-helpers/storage/volume"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/sig-storage-lib-external-provisioner/v13/controller"

	"github.com/kube-storage/csi-provisioner/internal/testutil"
	"github.com/kube-storage/csi-provisioner/pkg/csiclient"
	"github.com/kube-storage/csi-provisioner/pkg/inflight"
)

// thisNode is the node of the provisioner under test; the nodes of
// cluster() are others. Its topology differs from all of theirs.
const thisNode = "n9"

var thisTopology = topo(keyRack, "r9", keyZone, "z9")

// testNodeDeployment is the tests' configuration: this node, immediate binding
// on, tiny delays.
func testNodeDeployment(mods ...func(*NodeDeployment)) NodeDeployment {
	nd := NodeDeployment{
		NodeName: thisNode, NodeID: "id-" + thisNode,
		Topology:         map[string]string{keyZone: "z9", keyRack: "r9"},
		ImmediateBinding: true,
		BaseDelay:        time.Millisecond, MaxDelay: 2 * time.Millisecond,
	}
	for _, mod := range mods {
		mod(&nd)
	}
	return nd
}

func withNode(mods ...func(*NodeDeployment)) Option {
	return WithNodeDeployment(testNodeDeployment(mods...))
}

// selectedFor is a claim of the test driver selected for node ("" for none).
func selectedFor(name, node string) *testutil.PVCBuilder {
	b := newClaim(name)
	if node != "" {
		b.Annotation(storagehelpers.AnnSelectedNode, node)
	}
	return b
}

func TestNodeDeploymentValidation(t *testing.T) {
	tests := []struct {
		name    string
		mod     func(*NodeDeployment)
		wantErr string
	}{
		{name: "valid", mod: func(*NodeDeployment) {}},
		{name: "equal delays", mod: func(nd *NodeDeployment) { nd.MaxDelay = nd.BaseDelay }},
		{name: "no node name", mod: func(nd *NodeDeployment) { nd.NodeName = "" }, wantErr: "new provisioner: node deployment: NodeName must not be empty"},
		{name: "zero base delay", mod: func(nd *NodeDeployment) { nd.BaseDelay = 0 }, wantErr: "node deployment: BaseDelay must be positive, got 0s"},
		{name: "negative base delay", mod: func(nd *NodeDeployment) { nd.BaseDelay = -time.Second }, wantErr: "BaseDelay must be positive, got -1s"},
		{
			name: "max delay below base delay", mod: func(nd *NodeDeployment) { nd.BaseDelay, nd.MaxDelay = 2*time.Second, time.Second },
			wantErr: "node deployment: MaxDelay 1s must not be shorter than BaseDelay 2s",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			client := fake.NewClientset()
			_, err := New(client, &fakeDriver{caps: topologyCaps()}, informers.NewSharedInformerFactory(client, 0), withNode(tt.mod))
			if (err == nil) != (tt.wantErr == "") || !strings.Contains(errString(err), tt.wantErr) {
				t.Fatalf("New = %v, want %q", err, tt.wantErr)
			}
		})
	}
}

// TestNodeDeploymentShouldProvision covers which claims a node accepts:
// its own, not another node's, and without a selected node only those with
// immediate binding when ImmediateBinding is on. Claims of other nodes are
// not errors: no event.
func TestNodeDeploymentShouldProvision(t *testing.T) {
	tests := []struct {
		selected  string
		lateBound bool
		immediate bool // NodeDeployment.ImmediateBinding
		want      bool
	}{
		{selected: thisNode, lateBound: true, immediate: true, want: true},
		{selected: thisNode, lateBound: true, immediate: false, want: true},
		{selected: thisNode, lateBound: false, immediate: true, want: true},
		{selected: thisNode, lateBound: false, immediate: false, want: true},
		{selected: "n1", lateBound: true, immediate: true, want: false},
		{selected: "n1", lateBound: true, immediate: false, want: false},
		{selected: "n1", lateBound: false, immediate: true, want: false},
		{selected: "n1", lateBound: false, immediate: false, want: false},
		{selected: "", lateBound: true, immediate: true, want: false},
		{selected: "", lateBound: true, immediate: false, want: false},
		// Raced for in ShouldProvision: see the subtest below (this claim
		// is not in the API, so it cannot be taken).
		{selected: "", lateBound: false, immediate: true, want: false},
		{selected: "", lateBound: false, immediate: false, want: false},
	}
	for _, tt := range tests {
		name := "selected=" + tt.selected
		if tt.selected == "" {
			name = "no selected node"
		}
		binding := map[bool]string{true: "WaitForFirstConsumer", false: "Immediate"}[tt.lateBound]
		t.Run(name+"/"+binding+"/immediateBinding="+map[bool]string{true: "on", false: "off"}[tt.immediate], func(t *testing.T) {
			class := newClass()
			if tt.lateBound {
				class.WaitForFirstConsumer()
			}
			h := newHarness(t, topologyCaps(), objs(class.Obj()), withNode(func(nd *NodeDeployment) { nd.ImmediateBinding = tt.immediate }))
			if got := h.p.ShouldProvision(h.ctx, selectedFor("c", tt.selected).Obj()); got != tt.want {
				t.Errorf("ShouldProvision = %v, want %v", got, tt.want)
			}
			if events := h.events(); len(events) > 0 {
				t.Errorf("events = %q, want none", events)
			}
		})
	}

	// A claim being deleted (it keeps the in-flight finalizer of the node
	// whose CreateVolume got a final answer) is not taken: that would only
	// create a volume to delete again.
	t.Run("no selected node, Immediate, being deleted: not taken", func(t *testing.T) {
		claim := newClaim("c").Finalizers(inflight.Finalizer).Deleted().Obj()
		h := newHarness(t, topologyCaps(), objs(newClass().Obj(), claim), withNode())
		if h.p.ShouldProvision(h.ctx, claim) {
			t.Error("ShouldProvision = true for a claim being deleted")
		}
		if got := selectedNodeName(h.liveClaim(claim)); got != "" {
			t.Errorf("selected-node = %q, want none: a claim being deleted was taken", got)
		}
	})

	// An immediate claim is taken in ShouldProvision, before the library
	// posts its Provisioning event: false while the informer has not
	// delivered the update, true for the claim that names this node.
	t.Run("no selected node, Immediate: taken in ShouldProvision", func(t *testing.T) {
		claim := newClaim("c").Obj()
		h := newHarness(t, topologyCaps(), objs(newClass().Obj(), claim), withNode())
		if h.p.ShouldProvision(h.ctx, claim) {
			t.Error("ShouldProvision = true for the claim this call took; want false until the update arrives")
		}
		live := h.liveClaim(claim)
		if got := selectedNodeName(live); got != thisNode {
			t.Fatalf("selected-node = %q after ShouldProvision, want %q", got, thisNode)
		}
		if !h.p.ShouldProvision(h.ctx, live) {
			t.Error("ShouldProvision = false for the claim selected for this node")
		}
		if creates := h.driver.createCalls(); len(creates) != 0 {
			t.Errorf("CreateVolume calls = %d, want none from ShouldProvision", len(creates))
		}
		if events := h.events(); len(events) > 0 {
			t.Errorf("events = %q, want none", events)
		}
	})

	// A failure to take an immediate claim other than losing the race (the
	// selected-node update fails: API server down, a webhook refuses it)
	// does not drop the claim silently until the library's resync: as
	// upstream, ShouldProvision lets Provision try again, whose error the
	// library reports in a Warning event and retries with backoff. Losing
	// the race (a conflict) still keeps the claim from Provision.
	for _, tt := range []struct {
		name string
		err  error
		want bool
	}{
		{name: "update fails otherwise: Provision tries again", err: apierrors.NewInternalError(errors.New("etcd down")), want: true},
		{name: "update conflicts: another writer won", err: apierrors.NewConflict(schema.GroupResource{Resource: "persistentvolumeclaims"}, "c", errors.New("stale"))},
	} {
		t.Run("no selected node, Immediate: "+tt.name, func(t *testing.T) {
			claim := newClaim("c").Obj()
			h := newHarness(t, topologyCaps(), objs(newClass().Obj(), claim), withNode())
			h.failOn("update", "persistentvolumeclaims", tt.err)
			if got := h.p.ShouldProvision(h.ctx, claim); got != tt.want {
				t.Errorf("ShouldProvision = %v, want %v", got, tt.want)
			}
			if creates := h.driver.createCalls(); len(creates) != 0 {
				t.Errorf("CreateVolume calls = %d, want none from ShouldProvision", len(creates))
			}
		})
	}

	// Without a selected node no node can tell that a misconfigured claim
	// is its own: none reports it.
	t.Run("no selected node, class of another provisioner: no event", func(t *testing.T) {
		h := newHarness(t, topologyCaps(), objs(newForeignClass()), withNode())
		if h.p.ShouldProvision(h.ctx, newClaim("c").Obj()) {
			t.Error("ShouldProvision = true")
		}
		if events := h.events(); len(events) > 0 {
			t.Errorf("events = %q, want none", events)
		}
	})
	t.Run("no selected node, class missing: no event", func(t *testing.T) {
		h := newHarness(t, topologyCaps(), nil, withNode())
		if h.p.ShouldProvision(h.ctx, newClaim("c").Obj()) {
			t.Error("ShouldProvision = true")
		}
		if events := h.events(); len(events) > 0 {
			t.Errorf("events = %q, want none", events)
		}
	})
}

// TestNodeDeploymentAllowedTopologies checks that a node whose topology the
// class's allowedTopologies exclude does not take an immediate-binding claim
// (as upstream's checkNode): had it taken it, the claim would stay selected
// for a node on which it can never be provisioned, and no node that the
// class allows would take it. A node the class allows takes it.
func TestNodeDeploymentAllowedTopologies(t *testing.T) {
	tests := []struct {
		name      string
		opts      []Option
		caps      func() csiclient.Capabilities
		class     *storagev1.StorageClass
		wantTaken bool
	}{
		{name: "other zone only", class: newClass().AllowedTopology(keyZone, "a").Obj()},
		{name: "other zone only, strict topology", opts: []Option{WithStrictTopology(true)}, class: newClass().AllowedTopology(keyZone, "a").Obj()},
		{name: "this zone allowed", class: newClass().AllowedTopology(keyZone, "a", "z9").Obj(), wantTaken: true},
		{name: "this rack allowed, strict topology", opts: []Option{WithStrictTopology(true)}, class: newClass().AllowedTopology(keyRack, "r9").Obj(), wantTaken: true},
		// Without VOLUME_ACCESSIBILITY_CONSTRAINTS allowedTopologies play
		// no part in provisioning, as upstream.
		{name: "driver without topology", caps: baseCaps, class: newClass().AllowedTopology(keyZone, "a").Obj(), wantTaken: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			caps := topologyCaps
			if tt.caps != nil {
				caps = tt.caps
			}
			for _, call := range []string{"ShouldProvision", "Provision"} {
				t.Run(call, func(t *testing.T) {
					claim := newClaim("c").Obj()
					h := newHarness(t, caps(), append(cluster(), claim, tt.class), append(tt.opts, withNode())...)
					if call == "ShouldProvision" {
						h.p.ShouldProvision(h.ctx, claim)
					} else {
						_, _, err := h.provision(claim, tt.class)
						if !tt.wantTaken && !isIgnored(err) {
							t.Errorf("Provision error = %v, want an IgnoredError", err)
						}
					}
					taken := selectedNodeName(h.liveClaim(claim)) == thisNode
					if taken != tt.wantTaken {
						t.Errorf("claim taken by this node = %v, want %v (writes %q)", taken, tt.wantTaken, h.writes())
					}
					if !tt.wantTaken && len(h.driver.createCalls()) != 0 {
						t.Errorf("CreateVolume calls = %d, want none", len(h.driver.createCalls()))
					}
				})
			}
		})
	}
}

// TestNodeDeploymentTopology checks that requests carry this node's
// topology only, from the static Node and CSINode, even when the API has
// other Nodes and CSINodes, and that no Node or CSINode informer runs.
func TestNodeDeploymentTopology(t *testing.T) {
	tests := []struct {
		name  string
		opts  []Option
		class *storagev1.StorageClass
		claim *corev1.PersistentVolumeClaim
		want  *csi.TopologyRequirement
	}{
		{
			name: "delayed binding, selected here", class: newClass().WaitForFirstConsumer().Obj(), claim: selectedFor("c", thisNode).Obj(),
			want: &csi.TopologyRequirement{Requisite: topos(thisTopology), Preferred: topos(thisTopology)},
		},
		{
			name: "strict topology", opts: []Option{WithStrictTopology(true)},
			class: newClass().WaitForFirstConsumer().Obj(), claim: selectedFor("c", thisNode).Obj(),
			want: &csi.TopologyRequirement{Requisite: topos(thisTopology), Preferred: topos(thisTopology)},
		},
		{
			name: "immediate binding, taken by this node", class: newClass().Obj(), claim: newClaim("c").Obj(),
			want: &csi.TopologyRequirement{Requisite: topos(thisTopology), Preferred: topos(thisTopology)},
		},
		{
			name: "allowed topologies", class: newClass().AllowedTopology(keyZone, "z9", "a").Obj(), claim: selectedFor("c", thisNode).Obj(),
			want: &csi.TopologyRequirement{Requisite: topos(zoneA, topo(keyZone, "z9")), Preferred: topos(topo(keyZone, "z9"), zoneA)},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, topologyCaps(), append(cluster(), tt.claim, tt.class), append(tt.opts, withNode())...)
			_, state, err := h.provision(tt.claim, tt.class)
			if err != nil || state != controller.ProvisioningFinished {
				t.Fatalf("Provision = %v, %v", state, err)
			}
			creates := h.driver.createCalls()
			if len(creates) != 1 {
				t.Fatalf("CreateVolume calls = %d, want 1", len(creates))
			}
			if got := creates[0].GetAccessibilityRequirements(); !proto.Equal(got, tt.want) {
				t.Errorf("accessibility requirements = %v, want %v", got, tt.want)
			}
		})
	}

	t.Run("static objects, no informers", func(t *testing.T) {
		h := newHarness(t, topologyCaps(), cluster(), withNode())
		for typ := range h.factory.WaitForCacheSync(t.Context().Done()) {
			if s := typ.String(); s == "*v1.Node" || s == "*v1.CSINode" {
				t.Errorf("informer %s runs in node deployment", s)
			}
		}
		if nodes, err := h.p.nodes.List(labels.Everything()); err != nil || len(nodes) != 1 || nodes[0].Name != thisNode ||
			!maps.Equal(nodes[0].Labels, thisTopology.GetSegments()) {
			t.Errorf("nodes = %v, %v; want only %s with its topology", nodes, err, thisNode)
		}
		csiNode, err := h.p.csiNodes.Get(thisNode)
		if err != nil {
			t.Fatal(err)
		}
		want := []storagev1.CSINodeDriver{{Name: testDriver, NodeID: "id-" + thisNode, TopologyKeys: []string{keyRack, keyZone}}}
		if got := csiNode.Spec.Drivers; len(got) != 1 || got[0].Name != want[0].Name || got[0].NodeID != want[0].NodeID ||
			!slices.Equal(got[0].TopologyKeys, want[0].TopologyKeys) {
			t.Errorf("CSINode drivers = %+v, want %+v", got, want)
		}
	})
}

// TestNodeDeploymentDelete covers which node deletes a volume: the one its
// node affinity allows; never anyone for a volume without node affinity.
// The others are turned down by ShouldDelete already, and Delete ignores
// them too.
func TestNodeDeploymentDelete(t *testing.T) {
	pv := func() *testutil.PVBuilder { return provisionedPV("", "") }
	withTerms := func(terms ...corev1.NodeSelectorTerm) *corev1.PersistentVolume {
		v := pv().Obj()
		v.Spec.NodeAffinity = &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: terms}}
		return v
	}
	in := func(key string, values ...string) corev1.NodeSelectorTerm {
		return corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: key, Operator: corev1.NodeSelectorOpIn, Values: values}}}
	}
	tests := []struct {
		name        string
		central     bool // without node deployment
		noTopology  bool // the driver reports no topology on this node
		pv          *corev1.PersistentVolume
		wantIgnored string
		wantEvent   string
	}{
		{name: "affinity of this node", pv: pv().NodeAffinity(keyZone, "z9").Obj()},
		{name: "one of several terms matches this node", pv: withTerms(in(keyZone, "a"), in(keyRack, "r9"))},
		{
			name: "node name field", pv: withTerms(corev1.NodeSelectorTerm{MatchFields: []corev1.NodeSelectorRequirement{{
				Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{thisNode},
			}}}),
		},
		{name: "affinity of another node", pv: pv().NodeAffinity(keyZone, "a").Obj(), wantIgnored: "does not allow node n9"},
		{name: "no terms", pv: withTerms(), wantIgnored: "does not allow node n9"},
		{name: "no node affinity", pv: pv().Obj(), wantIgnored: "the volume has no node affinity", wantEvent: "Warning VolumeFailedDelete node n9 does not delete this volume: it has no node affinity"},
		{name: "driver without topology: no node affinity", noTopology: true, pv: pv().Obj()},
		{name: "central provisioning: no node affinity", central: true, pv: pv().Obj()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var opts []Option
			if !tt.central {
				opts = append(opts, withNode(func(nd *NodeDeployment) {
					if tt.noTopology {
						nd.Topology = nil
					}
				}))
			}
			h := newHarness(t, baseCaps(), objs(tt.pv), opts...)
			// The library asks ShouldDelete first: a volume this node
			// ignores does not reach Delete (nor the library's metrics).
			if got, want := h.p.ShouldDelete(h.ctx, tt.pv), tt.wantIgnored == ""; got != want {
				t.Errorf("ShouldDelete = %v, want %v", got, want)
			}
			err := h.p.Delete(h.ctx, tt.pv)
			events := h.events()
			if tt.wantEvent == "" && len(events) > 0 || tt.wantEvent != "" && (len(events) != 1 || !strings.HasPrefix(events[0], tt.wantEvent)) {
				t.Errorf("events = %q, want %q", events, tt.wantEvent)
			}
			if tt.wantIgnored != "" {
				if !isIgnored(err) || !strings.Contains(err.Error(), tt.wantIgnored) {
					t.Fatalf("Delete = %v, want an IgnoredError %q", err, tt.wantIgnored)
				}
			} else if err != nil {
				t.Fatalf("Delete = %v", err)
			}
			calls := h.driver.deleteCalls()
			if wantCall := tt.wantIgnored == ""; (len(calls) == 1) != wantCall || len(calls) > 1 {
				t.Errorf("DeleteVolume calls = %d, want call %v", len(calls), wantCall)
			}
		})
	}
}

// TestNodeDeploymentGuard checks that the in-flight guard of a node leaves
// the claims of other nodes alone: it neither records them as seen without
// the finalizer nor queues them, and never releases them, since another
// node may have a CreateVolume in flight for them.
func TestNodeDeploymentGuard(t *testing.T) {
	t.Run("enqueue", func(t *testing.T) {
		for _, tt := range []struct {
			selected string
			want     bool
		}{{thisNode, true}, {"n1", false}, {"", false}} {
			h := newHarness(t, baseCaps(), objs(newClass().Obj()), withNode())
			queue := workqueue.NewTyped[string]()
			clean := selectedFor("c", tt.selected).Obj()
			h.p.enqueueClaim(queue, clean)
			h.p.attempts.mu.Lock()
			_, recorded := h.p.attempts.states[clean.UID]
			h.p.attempts.mu.Unlock()
			if recorded != tt.want {
				t.Errorf("selected %q: claim seen without the finalizer recorded = %v, want %v", tt.selected, recorded, tt.want)
			}
			h.p.enqueueClaim(queue, selectedFor("c", tt.selected).Finalizers(inflight.Finalizer).Deleted().Obj())
			if queued := queue.Len() == 1; queued != tt.want {
				t.Errorf("selected %q: claim with the finalizer queued = %v, want %v", tt.selected, queued, tt.want)
			}
			queue.ShutDown()
		}
	})

	// The claim changes hands between this node's read and its update: the
	// retry after the conflict leaves the finalizer to the other node.
	t.Run("removal races another node's selection", func(t *testing.T) {
		mine := selectedFor("c", thisNode).Finalizers(inflight.Finalizer).Obj()
		taken := selectedFor("c", "n1").Finalizers(inflight.Finalizer).Obj()
		h := newHarness(t, baseCaps(), objs(newClass().Obj(), taken), withNode())
		conflicts := 0
		h.client.PrependReactor("update", "persistentvolumeclaims", func(k8stesting.Action) (bool, runtime.Object, error) {
			if conflicts > 0 {
				return false, nil, nil
			}
			conflicts++
			return true, nil, apierrors.NewConflict(schema.GroupResource{Resource: "persistentvolumeclaims"}, "c", errors.New("selected by n1"))
		})
		if err := h.p.removeInflight(h.ctx, mine); err != nil {
			t.Fatalf("removeInflight = %v", err)
		}
		if live := h.liveClaim(taken); !inflight.Has(live) {
			t.Error("this node removed the in-flight finalizer of a claim node n1 took")
		}
	})

	// The claim leaves this node between its read and the update that adds
	// the finalizer before CreateVolume (an administrator released it, or
	// another node took it once released): the retry after the conflict
	// must not add the finalizer to a claim this node no longer owns, or
	// this node would send CreateVolume while another node takes the claim
	// and creates a second volume.
	for _, selected := range []string{"", "n1"} {
		t.Run("addition races the claim's release/selected="+selected, func(t *testing.T) {
			mine := selectedFor("c", thisNode).Obj()
			live := selectedFor("c", selected).Obj()
			h := newHarness(t, baseCaps(), objs(newClass().Obj(), live), withNode())
			conflicts := 0
			h.client.PrependReactor("update", "persistentvolumeclaims", func(k8stesting.Action) (bool, runtime.Object, error) {
				if conflicts > 0 {
					return false, nil, nil
				}
				conflicts++
				return true, nil, apierrors.NewConflict(schema.GroupResource{Resource: "persistentvolumeclaims"}, "c", errors.New("annotation removed"))
			})
			err := h.p.addInflight(h.ctx, mine)
			if !errors.Is(err, errNotSelected) {
				t.Errorf("addInflight = %v, want errNotSelected", err)
			}
			if got := h.liveClaim(live); inflight.Has(got) {
				t.Errorf("this node added the in-flight finalizer to a claim selected for %q", selected)
			}
		})
	}

	t.Run("sync", func(t *testing.T) {
		clean := func(l *ledger) { l.observeClean("uid-c") }
		final := func(l *ledger) { l.final("uid-c") }
		tests := []struct {
			name      string
			selected  string
			lateBound bool
			ledger    func(*ledger)
			wantKept  bool
		}{
			{name: "this node's, seen clean", selected: thisNode, ledger: clean},
			{name: "this node's, final answer", selected: thisNode, ledger: final},
			{name: "another node's, seen clean", selected: "n1", ledger: clean, wantKept: true},
			{name: "another node's, final answer", selected: "n1", ledger: final, wantKept: true},
			// No node takes a claim being deleted (unowned), so no
			// CreateVolume can start for it: this node, whose answer was
			// final, releases it even while no node has room for it.
			{name: "no selected node, immediate, final answer", ledger: final},
			{name: "no selected node, immediate, seen clean", ledger: clean, wantKept: true},
			{name: "no selected node, delayed binding, seen clean", lateBound: true, ledger: clean, wantKept: true},
			{name: "rescheduled by this node after a final answer", lateBound: true, ledger: final},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				class := newClass()
				if tt.lateBound {
					class.WaitForFirstConsumer()
				}
				claim := selectedFor("c", tt.selected).Finalizers(inflight.Finalizer).Deleted().Obj()
				h := newHarness(t, baseCaps(), objs(claim, class.Obj()), withNode())
				tt.ledger(h.p.attempts)
				queue := workqueue.NewTyped[string]()
				defer queue.ShutDown()
				h.p.enqueueClaim(queue, claim)
				if queued := queue.Len() == 1; queued == tt.wantKept {
					t.Errorf("queued = %v, want %v", queued, !tt.wantKept)
				}
				if err := h.p.guardSync(h.ctx, testNS+"/c"); err != nil {
					t.Fatalf("guardSync = %v", err)
				}
				if got := inflight.Has(h.liveClaim(claim)); got != tt.wantKept {
					t.Errorf("finalizer kept = %v, want %v", got, tt.wantKept)
				}
			})
		}
	})

	t.Run("run", func(t *testing.T) {
		theirs := selectedFor("theirs", "n1").Obj()
		mine := selectedFor("mine", thisNode).Obj()
		h := newHarness(t, baseCaps(), objs(newClass().Obj()), withNode())
		h.runGuard(t, 1)

		// Both are seen without the finalizer first: the guard processes
		// claim events in order, so once mine is recorded, theirs was seen.
		for _, c := range []*corev1.PersistentVolumeClaim{theirs, mine} {
			if _, err := h.client.CoreV1().PersistentVolumeClaims(testNS).Create(t.Context(), c, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		testutil.Eventually(t, 0, "this node's claim recorded as clean", func(context.Context) (bool, error) {
			h.p.attempts.mu.Lock()
			defer h.p.attempts.mu.Unlock()
			return h.p.attempts.states[mine.UID] == attemptClean, nil
		})
		// Then both get the finalizer (from their node) and are deleted:
		// theirs first, so that it would be released first.
		for _, c := range []*corev1.PersistentVolumeClaim{theirs, mine} {
			handed := c.DeepCopy()
			handed.Finalizers = []string{inflight.Finalizer}
			now := metav1.Now()
			handed.DeletionTimestamp = &now
			if _, err := h.client.CoreV1().PersistentVolumeClaims(testNS).Update(t.Context(), handed, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		testutil.Eventually(t, 0, "this node's claim released", func(ctx context.Context) (bool, error) {
			c, err := h.client.CoreV1().PersistentVolumeClaims(testNS).Get(ctx, "mine", metav1.GetOptions{})
			return err == nil && !inflight.Has(c), err
		})
		if !inflight.Has(h.liveClaim(theirs)) {
			t.Error("the guard released a claim of another node")
		}
	})
}

// TestNodeDeploymentDeclineLogNamesClaim checks that when a node declines an
// immediate-binding claim in ShouldProvision (the usual path), its V(2) log
// line names the claim: the README promises that each node logs its reason,
// and the reason alone ("node n9 has not enough capacity ...") does not say
// for which claim.
func TestNodeDeploymentDeclineLogNamesClaim(t *testing.T) {
	tests := []struct {
		name  string
		class *storagev1.StorageClass
		mod   func(*NodeDeployment)
	}{
		{
			name: "not enough capacity", class: newClass().Obj(),
			mod: func(nd *NodeDeployment) {
				nd.GetCapacity = (&fakeCapacity{resp: &csi.GetCapacityResponse{AvailableCapacity: 1}}).get
			},
		},
		{name: "class excludes this node", class: newClass().AllowedTopology(keyZone, "a").Obj(), mod: func(*NodeDeployment) {}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			claim := newClaim("c").Obj()
			h := newHarness(t, topologyCaps(), objs(claim, tt.class), withNode(tt.mod))
			logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.Verbosity(2), ktesting.BufferLogs(true)))
			if h.p.ShouldProvision(klog.NewContext(h.ctx, logger), claim) {
				t.Fatal("ShouldProvision = true")
			}
			text := logger.GetSink().(ktesting.Underlier).GetBuffer().String()
			var line string
			for l := range strings.Lines(text) {
				if strings.Contains(l, "Not taking the claim") {
					line = l
				}
			}
			if !strings.Contains(line, `pvc="ns/c"`) {
				t.Errorf("decline log line %q does not name the claim; log:\n%s", line, text)
			}
		})
	}
}

// TestNodeWithoutTopologyLeavesOtherNodesVolumes: a node whose driver
// reports no topology (a driver version mid-rollout, labels it could not
// find) must not delete a volume whose node affinity names another node:
// its driver does not have it and answers DeleteVolume with OK (CSI:
// idempotent), the library deletes the PV, and the volume stays on its
// node, leaked. A volume without node affinity is still any node's, as
// upstream.
func TestNodeWithoutTopologyLeavesOtherNodesVolumes(t *testing.T) {
	in := provisionedPV("", "").NodeAffinity(keyZone, "a").Obj() // another node's volume
	notIn := in.DeepCopy()                                       // an affinity that empty labels match
	notIn.Spec.NodeAffinity.Required.NodeSelectorTerms[0].MatchExpressions[0].Operator = corev1.NodeSelectorOpNotIn
	for name, pv := range map[string]*corev1.PersistentVolume{"In": in, "NotIn": notIn} {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t, baseCaps(), objs(pv), withNode(func(nd *NodeDeployment) { nd.Topology = nil }))
			if h.p.ShouldDelete(h.ctx, pv) {
				t.Errorf("ShouldDelete = true for a PV with node affinity %v on a node without topology", pv.Spec.NodeAffinity.Required)
			}
			_ = h.p.Delete(h.ctx, pv)
			if calls := h.driver.deleteCalls(); len(calls) > 0 {
				t.Errorf("this node (driver without topology) sent DeleteVolume %q for a volume with node affinity", calls[0].GetVolumeId())
			}
		})
	}
}

// TestNodeCapacityCheckWithoutAccessibility: CSI forbids
// GetCapacityRequest.accessible_topology for a plugin without
// VOLUME_ACCESSIBILITY_CONSTRAINTS, and upstream's node capacity check
// takes it from CreateVolume's requisite, nil for such a driver. One that
// still reports a topology in NodeGetInfo must not get it in GetCapacity.
func TestNodeCapacityCheckWithoutAccessibility(t *testing.T) {
	const baseDelay, maxDelay = 10 * time.Second, 20 * time.Second
	clk := clocktesting.NewFakeClock(time.Now())
	capacity := &fakeCapacity{resp: &csi.GetCapacityResponse{AvailableCapacity: 10 * gi}}
	nd := testNodeDeployment(func(nd *NodeDeployment) {
		nd.BaseDelay, nd.MaxDelay = baseDelay, maxDelay
		nd.GetCapacity = capacity.get
	})
	class := newClass().Obj()
	claim := newClaim("c").Obj()
	h := newHarness(t, baseCaps() /* no VOLUME_ACCESSIBILITY_CONSTRAINTS */, objs(claim, class), WithNodeDeployment(nd), WithClock(clk))
	res := make(chan provisionResult, 1)
	go func() { h.p.ShouldProvision(h.ctx, claim.DeepCopy()); res <- provisionResult{} }()
	drive(t, clk, res, func() {}, 2*maxDelay, 0)
	if len(capacity.reqs) != 1 {
		t.Fatalf("GetCapacity calls = %d, want 1", len(capacity.reqs))
	}
	if top := capacity.reqs[0].GetAccessibleTopology(); top != nil {
		t.Errorf("GetCapacity to a driver without VOLUME_ACCESSIBILITY_CONSTRAINTS got accessible_topology %v; CSI forbids it", top)
	}
}

// TestNodeDeploymentVolumeNameTakenNotTaken: in node deployment, an
// Immediate claim whose volume name another claim's PV has (a short
// --volume-name-uuid-length) is one this provisioner will never provision
// (1f803a5). ShouldProvision checks that only after becomeOwner has waited
// its owner delay, asked GetCapacity and written this node into the
// claim's selected-node: the node takes a claim it then refuses, and every
// other node sees it "taken by n9".
func TestNodeDeploymentVolumeNameTakenNotTaken(t *testing.T) {
	const baseDelay, maxDelay = 10 * time.Second, 20 * time.Second
	clk := clocktesting.NewFakeClock(time.Now())
	claim := newClaim("c").Obj() // UID uid-c: volume pvc-uidc when cut to 4
	taken := testutil.NewPV("pvc-uidc", testDriver).ClaimRef("other", "c2", "uid-c2").Obj()
	h := newHarness(t, baseCaps(), objs(claim, newClass().Obj(), taken), WithVolumeNameUUIDLength(4), WithClock(clk),
		withNode(func(nd *NodeDeployment) { nd.BaseDelay, nd.MaxDelay = baseDelay, maxDelay }))
	res := make(chan provisionResult, 1)
	go func() {
		got := h.p.ShouldProvision(h.ctx, claim.DeepCopy())
		if got {
			t.Error("ShouldProvision = true for a claim whose volume name is taken")
		}
		res <- provisionResult{}
	}()
	drive(t, clk, res, func() {}, 2*maxDelay, 0)
	if got := h.liveClaim(claim).Annotations[storagehelpers.AnnSelectedNode]; got != "" {
		t.Errorf("claim whose volume name is taken was taken for node %q (writes %v) although this provisioner refuses to provision it", got, h.writes())
	}
	var warned bool
	for _, e := range h.events() {
		warned = warned || strings.Contains(e, "of this claim is taken")
	}
	if !warned {
		t.Error("no Warning that the volume name is taken")
	}
}
