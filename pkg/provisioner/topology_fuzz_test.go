package provisioner

import (
	"fmt"
	"maps"
	"slices"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/kube-storage/csi-provisioner/internal/testutil"
)

// fuzzKeys and fuzzValues are few, so that segments collide.
var (
	fuzzKeys   = []string{keyZone, keyRack, "topology.example.com/row"}
	fuzzValues = []string{"a", "b", "c"}
)

// fuzzCluster builds up to six nodes from three bytes each: b0 the labels
// present (bits 0-2) and the node's CSINode (bits 3-4: none, another
// driver's, ours with the keys of b2, ours without keys), b1 the label
// values (two bits a key), b2 the driver's keys (bits 0-2, bit 3 reverses
// their order).
func fuzzCluster(data []byte) (nodes []*corev1.Node, csiNodes []*storagev1.CSINode) {
	for i := 0; i+3 <= len(data) && len(nodes) < 6; i += 3 {
		b0, b1, b2 := data[i], data[i+1], data[i+2]
		name := fmt.Sprintf("n%d", len(nodes))
		labels := map[string]string{}
		for j, k := range fuzzKeys {
			if b0&(1<<j) != 0 {
				labels[k] = fuzzValues[int(b1>>(2*j)&3)%len(fuzzValues)]
			}
		}
		nodes = append(nodes, testutil.NewNode(name, labels))
		var keys []string
		for j, k := range fuzzKeys {
			if b2&(1<<j) != 0 {
				keys = append(keys, k)
			}
		}
		if b2&8 != 0 {
			slices.Reverse(keys)
		}
		switch b0 >> 3 & 3 {
		case 1:
			csiNodes = append(csiNodes, testutil.NewCSINode(name, "other.example.com", keys...))
		case 2:
			csiNodes = append(csiNodes, testutil.NewCSINode(name, testDriver, keys...))
		case 3:
			csiNodes = append(csiNodes, testutil.NewCSINode(name, testDriver))
		}
	}
	return nodes, csiNodes
}

// fuzzAllowed builds up to two allowedTopologies terms from two bytes each:
// b0 the keys (bits 0-2) and for each a second value (bits 3-5), b1 the
// first value of each key (two bits a key).
func fuzzAllowed(data []byte) []corev1.TopologySelectorTerm {
	var out []corev1.TopologySelectorTerm
	for i := 0; i+2 <= len(data) && len(out) < 2; i += 2 {
		b0, b1 := data[i], data[i+1]
		var st corev1.TopologySelectorTerm
		for j, k := range fuzzKeys {
			if b0&(1<<j) == 0 {
				continue
			}
			v := int(b1 >> (2 * j) & 3)
			values := []string{fuzzValues[v%len(fuzzValues)]}
			if b0&(8<<j) != 0 {
				values = append(values, fuzzValues[(v+1)%len(fuzzValues)])
			}
			st.MatchLabelExpressions = append(st.MatchLabelExpressions, corev1.TopologySelectorLabelRequirement{Key: k, Values: values})
		}
		if len(st.MatchLabelExpressions) > 0 {
			out = append(out, st)
		}
	}
	return out
}

// allows reports whether segment t is one that allowed lists: exactly the
// keys of one of its terms, each with one of that key's values.
func allows(allowed []corev1.TopologySelectorTerm, t map[string]string) bool {
	return slices.ContainsFunc(allowed, func(st corev1.TopologySelectorTerm) bool {
		if len(st.MatchLabelExpressions) != len(t) {
			return false
		}
		for _, e := range st.MatchLabelExpressions {
			if v, ok := t[e.Key]; !ok || !slices.Contains(e.Values, v) {
				return false
			}
		}
		return true
	})
}

// isSubset reports whether every pair of a is in b.
func isSubset(a, b map[string]string) bool {
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// FuzzTopologyRequirement computes the requirement for random clusters
// (nodes with and without labels, CSINodes with and without the driver),
// allowedTopologies, --strict-topology, --immediate-topology, selected
// node and claim name, and checks what upstream's rules promise whenever
// there is no error: the same inputs give the same requirement;
// requisite has no duplicate; preferred is requisite reordered; with a
// selected node its segment comes first, and is the only one with strict
// topology (and then lies within an allowed term); otherwise every segment
// is one the class allows, or without allowedTopologies the segment of a
// node labelled with all the driver's keys; without a selected node,
// allowedTopologies or --immediate-topology there is no requirement.
func FuzzTopologyRequirement(f *testing.F) {
	// The cluster of the table tests: n1 zone a rack r1, n2 and n3 zone b
	// rack r2, n4 another driver's.
	tableCluster := []byte{0x13, 0x00, 0x03, 0x13, 0x05, 0x03, 0x13, 0x05, 0x03, 0x08, 0x00, 0x01}
	f.Add(tableCluster, []byte{}, uint8(0), uint8(0), "data")
	f.Add(tableCluster, []byte{}, uint8(1), uint8(1), "data")
	f.Add(tableCluster, []byte{0x09, 0x00}, uint8(0), uint8(2), "www-web-3")
	f.Add(tableCluster, []byte{0x09, 0x00}, uint8(3), uint8(4), "data")
	f.Add(tableCluster, []byte{0x01, 0x02}, uint8(1), uint8(0), "data")
	f.Add([]byte{0x11, 0x00, 0x09, 0x02, 0x00, 0x00}, []byte{}, uint8(2), uint8(0), "data-0")
	f.Fuzz(func(t *testing.T, clusterData, allowedData []byte, flags, selectedIndex uint8, claimName string) {
		nodes, csiNodes := fuzzCluster(clusterData)
		allowed := fuzzAllowed(allowedData)
		strict, immediate := flags&1 != 0, flags&2 != 0
		selected := ""
		if i := int(selectedIndex) % (len(nodes) + 1); i < len(nodes) {
			selected = nodes[i].Name
		}
		nodeIndexer := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
		for _, n := range nodes {
			if err := nodeIndexer.Add(n); err != nil {
				t.Fatal(err)
			}
		}
		csiNodeIndexer := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
		for _, n := range csiNodes {
			if err := csiNodeIndexer.Add(n); err != nil {
				t.Fatal(err)
			}
		}
		cfg := defaultConfig()
		cfg.strictTopology, cfg.immediateTopology = strict, immediate
		p := &Provisioner{
			caps: topologyCaps(), name: testDriver, cfg: cfg,
			nodes: corelisters.NewNodeLister(nodeIndexer), csiNodes: storagelisters.NewCSINodeLister(csiNodeIndexer),
		}
		class := newClass().Obj()
		class.AllowedTopologies = allowed
		claim := testutil.NewPVC(testNS, claimName).UID("u").Obj()

		req, err := p.topologyRequirement(claim, class, selected)
		req2, err2 := p.topologyRequirement(claim, class, selected)
		if (err == nil) != (err2 == nil) || !proto.Equal(req, req2) {
			t.Fatalf("not deterministic: %v, %v and %v, %v", req, err, req2, err2)
		}
		if err != nil {
			return
		}
		if selected == "" && len(allowed) == 0 && !immediate && req != nil {
			t.Fatalf("--immediate-topology=false, no node selected, no allowedTopologies: got %v, want none", req)
		}
		if req == nil {
			if len(allowed) > 0 || selected != "" || immediate {
				// Each of these either gives segments or fails.
				t.Fatalf("no requirement and no error (allowed %v, selected %q, immediate %v)", allowed, selected, immediate)
			}
			return
		}
		requisite, preferred := segments(req.GetRequisite()), segments(req.GetPreferred())
		if len(requisite) == 0 || len(preferred) != len(requisite) {
			t.Fatalf("requisite %v, preferred %v", requisite, preferred)
		}
		for i, s := range requisite {
			if slices.ContainsFunc(requisite[i+1:], func(o map[string]string) bool { return maps.Equal(o, s) }) {
				t.Fatalf("requisite %v repeats %v", requisite, s)
			}
			if !slices.ContainsFunc(preferred, func(o map[string]string) bool { return maps.Equal(o, s) }) {
				t.Fatalf("preferred %v lacks %v of requisite", preferred, s)
			}
		}

		var nodeTerm map[string]string
		var keys []string
		if selected != "" {
			node, _ := p.nodes.Get(selected)
			csiNode, _ := p.csiNodes.Get(selected)
			keys = p.driverKeys(csiNode)
			nodeTerm = map[string]string{}
			for _, k := range keys {
				nodeTerm[k] = node.Labels[k]
			}
			if !isSubset(preferred[0], nodeTerm) {
				t.Fatalf("selected node %s (%v): preferred starts with %v", selected, nodeTerm, preferred[0])
			}
		}
		switch {
		case strict && selected != "":
			if len(requisite) != 1 || !maps.Equal(requisite[0], nodeTerm) {
				t.Fatalf("strict topology, node %s (%v): requisite %v", selected, nodeTerm, requisite)
			}
			if len(allowed) > 0 && !slices.ContainsFunc(allowed, func(st corev1.TopologySelectorTerm) bool {
				for _, e := range st.MatchLabelExpressions {
					if !slices.Contains(e.Values, nodeTerm[e.Key]) {
						return false
					}
				}
				return true
			}) {
				t.Fatalf("strict topology: node segment %v lies within no allowed term %v", nodeTerm, allowed)
			}
		case len(allowed) > 0:
			for _, s := range requisite {
				if !allows(allowed, s) {
					t.Fatalf("segment %v is not allowed by %v", s, allowed)
				}
			}
		default:
			for _, s := range requisite {
				if selected != "" && len(s) != len(keys) {
					t.Fatalf("segment %v: want the keys %v of the selected node's CSINode", s, keys)
				}
				if !slices.ContainsFunc(nodes, func(n *corev1.Node) bool { return maps.Equal(s, pick(n.Labels, s)) }) {
					t.Fatalf("segment %v is no node's", s)
				}
			}
		}
	})
}

// segments returns the segments of topologies.
func segments(ts []*csi.Topology) []map[string]string {
	out := make([]map[string]string, 0, len(ts))
	for _, t := range ts {
		out = append(out, t.GetSegments())
	}
	return out
}

// pick returns the labels with the keys of s.
func pick(labels, s map[string]string) map[string]string {
	out := map[string]string{}
	for k := range s {
		if v, ok := labels[k]; ok {
			out[k] = v
		}
	}
	return out
}
