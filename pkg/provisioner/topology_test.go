package provisioner

import (
	"fmt"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/cache"
	storagehelpers "k8s.io/component-helpers/storage/volume"
	"sigs.k8s.io/sig-storage-lib-external-provisioner/v13/controller"

	"github.com/kube-storage/csi-provisioner/internal/testutil"
	"github.com/kube-storage/csi-provisioner/pkg/inflight"
)

const (
	keyZone = "topology.example.com/zone"
	keyRack = "topology.example.com/rack"
)

// cluster: n1 in zone a / rack r1, n2 and n3 in zone b / rack r2, n4 without
// the driver and without labels.
func cluster() []runtime.Object {
	return objs(
		testutil.NewNode("n1", map[string]string{keyZone: "a", keyRack: "r1"}),
		testutil.NewNode("n2", map[string]string{keyZone: "b", keyRack: "r2"}),
		testutil.NewNode("n3", map[string]string{keyZone: "b", keyRack: "r2", "other": "x"}),
		testutil.NewNode("n4", nil),
		testutil.NewCSINode("n1", testDriver, keyZone, keyRack),
		testutil.NewCSINode("n2", testDriver, keyZone, keyRack),
		testutil.NewCSINode("n3", testDriver, keyZone, keyRack),
		testutil.NewCSINode("n4", "other.example.com", keyZone),
	)
}

func topo(pairs ...string) *csi.Topology {
	t := &csi.Topology{Segments: map[string]string{}}
	for i := 0; i < len(pairs); i += 2 {
		t.Segments[pairs[i]] = pairs[i+1]
	}
	return t
}

func topos(ts ...*csi.Topology) []*csi.Topology { return ts }

var (
	topoA  = topo(keyRack, "r1", keyZone, "a")
	topoB  = topo(keyRack, "r2", keyZone, "b")
	zoneA  = topo(keyZone, "a")
	zoneB  = topo(keyZone, "b")
	zoneC  = topo(keyZone, "c")
	rackA1 = topo(keyRack, "r1", keyZone, "a")
	rackB1 = topo(keyRack, "r1", keyZone, "b")
)

// TestTopologyRequirement covers reference §2a "Topology – strict /
// non-strict / immediate": aggregation, allowedTopologies flattening,
// sorting and de-duplication, and the preferred order.
func TestTopologyRequirement(t *testing.T) {
	allowedZones := func(b *testutil.SCBuilder) *testutil.SCBuilder { return b.AllowedTopology(keyZone, "a", "b") }
	tests := []struct {
		name      string
		cluster   []runtime.Object
		noTopo    bool
		opts      []Option
		class     *storagev1.StorageClass
		claimName string
		selected  string
		want      *csi.TopologyRequirement
		wantErr   string
		notFound  bool
	}{
		{name: "driver without topology", noTopo: true, class: newClass().Obj()},
		{
			name: "immediate: aggregated, sorted and de-duplicated", class: newClass().Obj(), claimName: "data-web-0",
			want: &csi.TopologyRequirement{Requisite: topos(topoA, topoB), Preferred: rotated(topos(topoA, topoB), "data-web-0")},
		},
		{name: "immediate topology off", opts: []Option{WithImmediateTopology(false)}, class: newClass().Obj()},
		{
			name: "immediate topology off with allowed topologies", opts: []Option{WithImmediateTopology(false)},
			class: allowedZones(newClass()).Obj(), claimName: "x",
			want: &csi.TopologyRequirement{Requisite: topos(zoneA, zoneB), Preferred: rotated(topos(zoneA, zoneB), "x")},
		},
		{
			name:  "allowed topologies flattened as a cross product",
			class: newClass().AllowedTopology(keyZone, "c").Obj(), claimName: "x",
			want: &csi.TopologyRequirement{Requisite: topos(zoneC), Preferred: topos(zoneC)},
		},
		{
			name: "allowed topologies: cross product within a term, OR across terms",
			class: func() *storagev1.StorageClass {
				c := newClass().AllowedTopology(keyZone, "c").Obj()
				c.AllowedTopologies = append(c.AllowedTopologies, corev1.TopologySelectorTerm{MatchLabelExpressions: []corev1.TopologySelectorLabelRequirement{
					{Key: keyZone, Values: []string{"b", "a"}}, {Key: keyRack, Values: []string{"r1"}},
				}}, corev1.TopologySelectorTerm{MatchLabelExpressions: []corev1.TopologySelectorLabelRequirement{{Key: keyZone, Values: []string{"c"}}}})
				return c
			}(),
			claimName: "x",
			// Upstream's order (topologyTerm.compare): fewer segments first,
			// then key by key.
			want: &csi.TopologyRequirement{
				Requisite: topos(zoneC, rackA1, rackB1), Preferred: rotated(topos(zoneC, rackA1, rackB1), "x"),
			},
		},
		{
			// "a.b=..." sorts before "a=..." as a string, after it key by key.
			name:      "allowed topologies: keys compared whole, as upstream",
			class:     newClass().AllowedTopology("t/z", "1").AllowedTopology("t/z.x", "1").Obj(),
			claimName: "x",
			want: &csi.TopologyRequirement{
				Requisite: topos(topo("t/z", "1"), topo("t/z.x", "1")), Preferred: rotated(topos(topo("t/z", "1"), topo("t/z.x", "1")), "x"),
			},
		},
		{
			name: "late binding: the first term within the node's segment, fewest segments first, is preferred",
			class: func() *storagev1.StorageClass {
				c := newClass().Obj()
				c.AllowedTopologies = []corev1.TopologySelectorTerm{
					{MatchLabelExpressions: []corev1.TopologySelectorLabelRequirement{{Key: keyZone, Values: []string{"b"}}, {Key: keyRack, Values: []string{"r2"}}}},
					{MatchLabelExpressions: []corev1.TopologySelectorLabelRequirement{{Key: keyZone, Values: []string{"b"}}}},
				}
				return c
			}(),
			selected: "n2",
			want:     &csi.TopologyRequirement{Requisite: topos(zoneB, topoB), Preferred: topos(zoneB, topoB)},
		},
		{
			name: "late binding: aggregated, selected node first", class: newClass().Obj(), selected: "n2",
			want: &csi.TopologyRequirement{Requisite: topos(topoA, topoB), Preferred: topos(topoB, topoA)},
		},
		{
			name: "late binding with allowed topologies", class: allowedZones(newClass()).Obj(), selected: "n2",
			want: &csi.TopologyRequirement{Requisite: topos(zoneA, zoneB), Preferred: topos(zoneB, zoneA)},
		},
		{
			name: "late binding: selected node outside the allowed topologies", class: newClass().AllowedTopology(keyZone, "c").Obj(), selected: "n2",
			wantErr: "from selected node \"n2\" is not in requisite",
		},
		{
			name: "strict: only the selected node", opts: []Option{WithStrictTopology(true)}, class: newClass().Obj(), selected: "n2",
			want: &csi.TopologyRequirement{Requisite: topos(topoB), Preferred: topos(topoB)},
		},
		{
			name: "strict within allowed topologies", opts: []Option{WithStrictTopology(true)}, class: allowedZones(newClass()).Obj(), selected: "n1",
			want: &csi.TopologyRequirement{Requisite: topos(topoA), Preferred: topos(topoA)},
		},
		{
			name: "strict outside allowed topologies", opts: []Option{WithStrictTopology(true)}, class: newClass().AllowedTopology(keyZone, "c").Obj(), selected: "n1",
			wantErr: "is not in allowed topologies",
		},
		{
			name: "strict without a selected node is immediate", opts: []Option{WithStrictTopology(true)}, class: newClass().Obj(), claimName: "x",
			want: &csi.TopologyRequirement{Requisite: topos(topoA, topoB), Preferred: rotated(topos(topoA, topoB), "x")},
		},
		{name: "selected node missing", class: newClass().Obj(), selected: "gone", notFound: true},
		{
			name: "CSINode of the selected node missing", class: newClass().Obj(), selected: "n5", notFound: true,
			wantErr: "failed to get selected CSINode n5: ",
			cluster: append(cluster(), testutil.NewNode("n5", nil)),
		},
		{name: "selected node without the driver", class: newClass().Obj(), selected: "n4", wantErr: "no topology key found for node n4"},
		{
			name: "selected node without the labels", class: newClass().Obj(), selected: "n5",
			cluster: append(cluster(), testutil.NewNode("n5", map[string]string{keyZone: "a"}), testutil.NewCSINode("n5", testDriver, keyZone, keyRack)),
			wantErr: "does not match topology keys from CSINode",
		},
		{
			name: "immediate: no CSINode has keys", class: newClass().Obj(),
			cluster: objs(testutil.NewNode("n1", map[string]string{keyZone: "a"}), testutil.NewCSINode("n1", testDriver)),
			wantErr: "no available topology found",
		},
		{
			name: "immediate: keys on no node", class: newClass().Obj(),
			cluster: objs(testutil.NewNode("n1", nil), testutil.NewCSINode("n1", testDriver, keyZone)),
			wantErr: "were not found on any nodes",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			caps := topologyCaps()
			if tt.noTopo {
				caps = baseCaps()
			}
			c := tt.cluster
			if c == nil {
				c = cluster()
			}
			h := newHarness(t, caps, c, tt.opts...)
			claim := testutil.NewPVC(testNS, tt.claimName).UID("u").Obj()
			got, err := h.p.topologyRequirement(claim, tt.class, tt.selected)
			if tt.notFound {
				if !apierrors.IsNotFound(err) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error = %v, want NotFound containing %q", err, tt.wantErr)
				}
				return
			}
			if (tt.wantErr == "") != (err == nil) || !strings.Contains(errString(err), tt.wantErr) {
				t.Fatalf("error = %v, want %q", err, tt.wantErr)
			}
			if !proto.Equal(got, tt.want) {
				t.Errorf("requirement:\n%s\nwant:\n%s", prototext.Format(got), prototext.Format(tt.want))
			}
		})
	}
}

// rotated is requisite rotated by the spreading offset of name.
func rotated(requisite []*csi.Topology, name string) []*csi.Topology {
	h, i := spreadingOffset(name)
	n := int((h + i) % uint32(len(requisite)))
	return append(append([]*csi.Topology{}, requisite[n:]...), requisite[:n]...)
}

// TestStatefulSetSpreading covers the StatefulSet heuristic: claims of one
// pod hash alike, consecutive ordinals go to consecutive segments.
func TestStatefulSetSpreading(t *testing.T) {
	h0, i0 := spreadingOffset("data-web-0")
	h1, i1 := spreadingOffset("data-web-1")
	hl, il := spreadingOffset("logs-web-1")
	if h0 != h1 || h1 != hl || i0 != 0 || i1 != 1 || il != 1 {
		t.Errorf("offsets: data-web-0 (%d,%d) data-web-1 (%d,%d) logs-web-1 (%d,%d); want one hash, ordinals 0 and 1", h0, i0, h1, i1, hl, il)
	}
	if h, i := spreadingOffset("plain"); i != 0 || h == h0 {
		t.Errorf("plain name offset = (%d,%d)", h, i)
	}
	if h, i := spreadingOffset("web-7"); i != 7 || h != h0 {
		t.Errorf("web-7 offset = (%d,%d), want the hash of web and ordinal 7", h, i)
	}
	if h, i := spreadingOffset(""); h != 0 || i != 0 {
		t.Errorf("empty name offset = (%d,%d)", h, i)
	}

	// Three zones: ordinals 0, 1, 2 of one set start in three different zones.
	h := newHarness(t, topologyCaps(), objs(
		testutil.NewNode("n1", map[string]string{keyZone: "a"}), testutil.NewCSINode("n1", testDriver, keyZone),
		testutil.NewNode("n2", map[string]string{keyZone: "b"}), testutil.NewCSINode("n2", testDriver, keyZone),
		testutil.NewNode("n3", map[string]string{keyZone: "c"}), testutil.NewCSINode("n3", testDriver, keyZone),
	))
	first := map[string]bool{}
	for _, name := range []string{"data-web-0", "data-web-1", "data-web-2"} {
		req, err := h.p.topologyRequirement(testutil.NewPVC(testNS, name).Obj(), newClass().Obj(), "")
		if err != nil {
			t.Fatal(err)
		}
		first[req.GetPreferred()[0].GetSegments()[keyZone]] = true
	}
	if len(first) != 3 {
		t.Errorf("preferred zones of three ordinals = %v, want three different", first)
	}
}

// TestTopologyCache covers the per-claim cache: a retry after InProgress
// sends the identical request after the selected Node and CSINode vanished;
// a final answer drops the entry; reads never alias the cache.
func TestTopologyCache(t *testing.T) {
	claim := newClaim("c").Annotation(storagehelpers.AnnSelectedNode, "n2").Finalizers(inflight.Finalizer).Obj()
	class := newClass().WaitForFirstConsumer().Obj()
	h := newHarness(t, topologyCaps(), append(cluster(), claim, class))
	h.driver.createAnswers = []createAnswer{{err: csiErr(codes.DeadlineExceeded)}, {err: csiErr(codes.DeadlineExceeded)}, {err: csiErr(codes.Internal)}}

	if _, state, _ := h.provision(claim, class); state != controller.ProvisioningInBackground {
		t.Fatalf("first state = %v, want InBackground", state)
	}
	node, _ := h.p.nodes.Get("n2")
	csiNode, _ := h.p.csiNodes.Get("n2")
	if err := h.factory.Core().V1().Nodes().Informer().GetIndexer().Delete(node); err != nil {
		t.Fatal(err)
	}
	if err := h.factory.Storage().V1().CSINodes().Informer().GetIndexer().Delete(csiNode); err != nil {
		t.Fatal(err)
	}

	// The cache hands out copies.
	cached, ok := h.p.topologies.get(claim.UID)
	if !ok {
		t.Fatal("no cached topology after InProgress")
	}
	cached.Preferred[0].Segments[keyZone] = "mutated"
	cached.Requisite = nil

	if _, state, _ := h.provision(claim, class); state != controller.ProvisioningInBackground {
		t.Fatalf("second state = %v, want InBackground", state)
	}
	if _, state, _ := h.provision(claim, class); state != controller.ProvisioningFinished {
		t.Fatalf("third state = %v, want Finished", state)
	}
	calls := h.driver.createCalls()
	if len(calls) != 3 {
		t.Fatalf("CreateVolume calls = %d, want 3", len(calls))
	}
	for i := 1; i < 3; i++ {
		if !proto.Equal(calls[0], calls[i]) {
			t.Errorf("request %d differs from the first:\n%s\nfirst:\n%s", i, prototext.Format(calls[i]), prototext.Format(calls[0]))
		}
	}
	if want := (&csi.TopologyRequirement{Requisite: topos(topoA, topoB), Preferred: topos(topoB, topoA)}); !proto.Equal(calls[0].GetAccessibilityRequirements(), want) {
		t.Errorf("requirements = %s", prototext.Format(calls[0].GetAccessibilityRequirements()))
	}
	if _, ok := h.p.topologies.get(claim.UID); ok {
		t.Error("topology still cached after a final answer")
	}
	// Without the cache the vanished node now means rescheduling.
	if _, state, err := h.provision(claim, class); state != controller.ProvisioningReschedule || !apierrors.IsNotFound(err) {
		t.Errorf("after the final answer: %v, %v; want Reschedule with NotFound", state, err)
	}
}

// TestTopologyCacheForgottenWithClaim: the requirements cached for a
// claim whose CreateVolume got no final answer are dropped when the claim
// is deleted (also through a tombstone). Nothing else drops them once the
// claim is gone: no further Provision for it reaches CreateVolume, so a
// sidecar that runs for months kept one entry per such claim for ever.
func TestTopologyCacheForgottenWithClaim(t *testing.T) {
	for _, tombstone := range []bool{false, true} {
		t.Run(fmt.Sprintf("tombstone=%v", tombstone), func(t *testing.T) {
			claim := newClaim("c").Annotation(storagehelpers.AnnSelectedNode, "n2").Finalizers(inflight.Finalizer).Obj()
			class := newClass().WaitForFirstConsumer().Obj()
			h := newHarness(t, topologyCaps(), append(cluster(), claim, class))
			h.driver.createAnswers = []createAnswer{{err: csiErr(codes.DeadlineExceeded)}}
			if _, state, _ := h.provision(claim, class); state != controller.ProvisioningInBackground {
				t.Fatalf("state = %v, want InBackground", state)
			}
			if _, ok := h.p.topologies.get(claim.UID); !ok {
				t.Fatal("no cached topology after InProgress")
			}
			var deleted interface{} = claim
			if tombstone {
				deleted = cache.DeletedFinalStateUnknown{Key: claim.Namespace + "/" + claim.Name, Obj: claim}
			}
			h.p.forgetClaim(deleted)
			if _, ok := h.p.topologies.get(claim.UID); ok {
				t.Error("topology of a deleted claim still cached")
			}
		})
	}
}

// TestSelectedNodeGone covers "fail with selected node but node doesn't
// exist": ProvisioningReschedule, no CreateVolume.
func TestSelectedNodeGone(t *testing.T) {
	for _, node := range []string{"gone", "n5"} {
		t.Run(node, func(t *testing.T) {
			claim := newClaim("c").Annotation(storagehelpers.AnnSelectedNode, node).Obj()
			class := newClass().WaitForFirstConsumer().Obj()
			h := newHarness(t, topologyCaps(), append(cluster(), claim, class, testutil.NewNode("n5", nil)))
			pv, state, err := h.provision(claim, class)
			if pv != nil || state != controller.ProvisioningReschedule || err == nil {
				t.Errorf("Provision = %v, %v, %v; want Reschedule", pv != nil, state, err)
			}
			if n := len(h.driver.createCalls()); n != 0 {
				t.Errorf("CreateVolume calls = %d", n)
			}
		})
	}
}

func TestNodeAffinity(t *testing.T) {
	if got := nodeAffinity(nil); got != nil {
		t.Errorf("nodeAffinity(nil) = %v", got)
	}
	if got := nodeAffinity(topos(topo())); got != nil {
		t.Errorf("nodeAffinity(empty segments) = %v", got)
	}
	got := nodeAffinity(topos(topo(keyZone, "a", keyRack, "r1"), topo(keyZone, "b")))
	want := &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{
		{MatchExpressions: []corev1.NodeSelectorRequirement{
			{Key: keyRack, Operator: corev1.NodeSelectorOpIn, Values: []string{"r1"}},
			{Key: keyZone, Operator: corev1.NodeSelectorOpIn, Values: []string{"a"}},
		}},
		{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: keyZone, Operator: corev1.NodeSelectorOpIn, Values: []string{"b"}}}},
	}}}
	if got.String() != want.String() {
		t.Errorf("nodeAffinity = %v, want %v", got, want)
	}
}

// TestTopologyOff: with WithTopology(false) (--feature-gates=Topology=false)
// a driver with VOLUME_ACCESSIBILITY_CONSTRAINTS is treated as one without,
// as upstream's supportsTopology: no accessibility requirements, no node
// affinity from the accessible topology, ResourceExhausted final instead of
// a reschedule, and no Node or CSINode informer.
func TestTopologyOff(t *testing.T) {
	claim := newClaim("c").Annotation(storagehelpers.AnnSelectedNode, "n2").Obj()
	class := newClass().WaitForFirstConsumer().Obj()
	h := newHarness(t, topologyCaps(), append(cluster(), claim, class), WithTopology(false))
	if h.p.nodes != nil || h.p.csiNodes != nil {
		t.Error("Node and CSINode listers set with topology off")
	}
	h.driver.createAnswers = []createAnswer{
		{err: csiErr(codes.ResourceExhausted)},
		{vol: &csi.Volume{VolumeId: "v1", AccessibleTopology: topos(zoneB)}},
	}
	if _, state, _ := h.provision(claim, class); state != controller.ProvisioningFinished {
		t.Errorf("ResourceExhausted: state %v, want Finished (no reschedule without topology)", state)
	}
	pv, state, err := h.provision(claim, class)
	if err != nil || state != controller.ProvisioningFinished {
		t.Fatalf("Provision = %v, %v", state, err)
	}
	for i, req := range h.driver.createCalls() {
		if req.GetAccessibilityRequirements() != nil {
			t.Errorf("request %d has requirements %s", i, prototext.Format(req.GetAccessibilityRequirements()))
		}
	}
	if pv.Spec.NodeAffinity != nil {
		t.Errorf("PV node affinity %v, want none", pv.Spec.NodeAffinity)
	}
}
