package provisioner

import (
	"fmt"
	"hash/fnv"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/types"
)

// term is one topology segment: keys and values that hold together (AND).
type term map[string]string

// String renders the term as sorted "key=value" pairs (for messages).
func (t term) String() string {
	parts := make([]string, 0, len(t))
	for _, k := range slices.Sorted(maps.Keys(t)) {
		parts = append(parts, k+"="+t[k])
	}
	return strings.Join(parts, ",")
}

// within reports whether every pair of t is also in other.
func (t term) within(other term) bool {
	for k, v := range t {
		if w, ok := other[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// topologyRequirement computes the accessibility requirements of a volume
// for claim in class, with selected the node picked by the scheduler ("" for
// immediate binding). It returns nil when the driver does not support
// topology or nothing restricts the volume. Errors from the listers are
// wrapped, so a missing selected Node or CSINode stays an apierrors
// NotFound for the caller.
//
// The rules are upstream's:
//   - requisite: with --strict-topology and a selected node, only that
//     node's segment (which must lie within one of the class's allowed
//     terms, if it has any); otherwise the class's allowedTopologies,
//     flattened; otherwise the segments of every Node labelled with all the
//     driver's topology keys (from the selected node's CSINode, or for
//     immediate binding from the first CSINode by name that has keys for the
//     driver) unless --immediate-topology=false and no node is selected.
//     Terms are sorted and de-duplicated.
//   - preferred: the requisite rotated so that the selected node's segment
//     comes first (strict: equal to requisite), or for immediate binding by
//     the StatefulSet spreading offset of the claim name.
func (p *Provisioner) topologyRequirement(claim *corev1.PersistentVolumeClaim, class *storagev1.StorageClass, selected string) (*csi.TopologyRequirement, error) {
	if !p.caps.VolumeAccessibility {
		return nil, nil
	}
	var (
		keys      []string
		nodeTerm  term
		requisite []term
		err       error
	)
	if selected != "" {
		if keys, nodeTerm, err = p.selectedNodeTopology(selected); err != nil {
			return nil, err
		}
		if p.cfg.strictTopology {
			inNode := func(t term) bool { return t.within(nodeTerm) }
			if len(class.AllowedTopologies) > 0 && !slices.ContainsFunc(flatten(class.AllowedTopologies), inNode) {
				return nil, fmt.Errorf("selected node %q topology %v is not in allowed topologies: %v", selected, nodeTerm, flatten(class.AllowedTopologies))
			}
			requisite = []term{nodeTerm}
		}
	}
	if requisite == nil {
		switch {
		case len(class.AllowedTopologies) > 0:
			requisite = flatten(class.AllowedTopologies)
		case selected == "" && !p.cfg.immediateTopology:
			return nil, nil
		default:
			if requisite, err = p.aggregate(keys); err != nil {
				return nil, err
			}
		}
	}
	if len(requisite) == 0 {
		return nil, nil
	}
	requisite = sortedUnique(requisite)

	var preferred []term
	switch {
	case selected == "":
		hash, index := spreadingOffset(claim.Name)
		preferred = rotate(requisite, int((hash+index)%uint32(len(requisite))))
	case p.cfg.strictTopology:
		preferred = rotate(requisite, 0)
	default:
		i := slices.IndexFunc(requisite, func(t term) bool { return t.within(nodeTerm) })
		if i < 0 {
			return nil, fmt.Errorf("topology %v from selected node %q is not in requisite: %v", nodeTerm, selected, requisite)
		}
		preferred = rotate(requisite, i)
	}
	return &csi.TopologyRequirement{Requisite: toCSI(requisite), Preferred: toCSI(preferred)}, nil
}

// selectedNodeTopology returns the driver's topology keys on node name and
// the node's segment for them.
func (p *Provisioner) selectedNodeTopology(name string) ([]string, term, error) {
	node, err := p.nodes.Get(name)
	if err != nil {
		return nil, nil, fmt.Errorf("get selected node: %w", err)
	}
	csiNode, err := p.csiNodes.Get(name)
	if err != nil {
		return nil, nil, fmt.Errorf("failed to get selected CSINode %s: %w", name, err)
	}
	keys := p.driverKeys(csiNode)
	if len(keys) == 0 {
		return nil, nil, fmt.Errorf("no topology key found for node %s", name)
	}
	t, ok := termOf(node, keys)
	if !ok {
		return nil, nil, fmt.Errorf("topology labels from selected node %v does not match topology keys from CSINode %v", node.Labels, keys)
	}
	return keys, t, nil
}

// aggregate returns the segments of every Node that carries all keys. With
// no keys (immediate binding) it takes the keys of the first CSINode, by
// name, on which the driver reports any. If there is none, no node runs the
// driver's node plugin yet, and the volume's place cannot be chosen: an
// error, as upstream ("no available topology found"), retried until a node
// reports its topology.
func (p *Provisioner) aggregate(keys []string) ([]term, error) {
	if len(keys) == 0 {
		csiNodes, err := p.csiNodes.List(labels.Everything())
		if err != nil {
			return nil, fmt.Errorf("list CSINodes: %w", err)
		}
		slices.SortFunc(csiNodes, func(a, b *storagev1.CSINode) int { return strings.Compare(a.Name, b.Name) })
		for _, n := range csiNodes {
			if keys = p.driverKeys(n); len(keys) > 0 {
				break
			}
		}
		if len(keys) == 0 {
			return nil, fmt.Errorf("no available topology found: no CSINode lists topology keys for driver %s (is its node plugin running?)", p.name)
		}
	}
	selector := labels.NewSelector()
	for _, k := range keys {
		req, err := labels.NewRequirement(k, selection.Exists, nil)
		if err != nil {
			return nil, fmt.Errorf("topology key %q: %w", k, err)
		}
		selector = selector.Add(*req)
	}
	nodes, err := p.nodes.List(selector)
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	terms := make([]term, 0, len(nodes))
	for _, n := range nodes {
		if t, ok := termOf(n, keys); ok {
			terms = append(terms, t)
		}
	}
	if len(terms) == 0 {
		return nil, fmt.Errorf("topologyKeys %v were not found on any nodes", keys)
	}
	return terms, nil
}

// driverKeys returns the topology keys this driver reports on csiNode.
func (p *Provisioner) driverKeys(csiNode *storagev1.CSINode) []string {
	for _, d := range csiNode.Spec.Drivers {
		if d.Name == p.name {
			return d.TopologyKeys
		}
	}
	return nil
}

// termOf returns node's segment for keys; false if a label is missing.
func termOf(node *corev1.Node, keys []string) (term, bool) {
	t := make(term, len(keys))
	for _, k := range keys {
		v, ok := node.Labels[k]
		if !ok {
			return nil, false
		}
		t[k] = v
	}
	return t, true
}

// flatten turns allowedTopologies (OR of terms, each an AND of keys, each an
// OR of values) into an OR of segments: the cross product of the values
// within each term.
func flatten(allowed []corev1.TopologySelectorTerm) []term {
	var out []term
	for _, st := range allowed {
		product := []term{{}}
		for _, req := range st.MatchLabelExpressions {
			next := make([]term, 0, len(product)*len(req.Values))
			for _, partial := range product {
				for _, v := range req.Values {
					t := maps.Clone(partial)
					t[req.Key] = v
					next = append(next, t)
				}
			}
			product = next
		}
		for _, t := range product {
			if len(t) > 0 {
				out = append(out, t)
			}
		}
	}
	return out
}

// compareTerms orders terms as upstream's topologyTerm.compare: fewer
// segments first, then pair by pair in key order, key before value.
func compareTerms(a, b term) int {
	if len(a) != len(b) {
		return len(a) - len(b)
	}
	ka, kb := slices.Sorted(maps.Keys(a)), slices.Sorted(maps.Keys(b))
	for i := range ka {
		if c := strings.Compare(ka[i], kb[i]); c != 0 {
			return c
		}
		if c := strings.Compare(a[ka[i]], b[kb[i]]); c != 0 {
			return c
		}
	}
	return 0
}

// sortedUnique returns the terms in upstream's order (compareTerms),
// without duplicates, in a new slice. The order decides which segment an
// immediate-binding claim prefers (see spreadingOffset) and, with a
// selected node, which of the terms within its segment comes first.
func sortedUnique(terms []term) []term {
	out := slices.Clone(terms)
	slices.SortFunc(out, compareTerms)
	return slices.CompactFunc(out, func(a, b term) bool { return compareTerms(a, b) == 0 })
}

// rotate returns a new slice that starts at terms[i] and wraps around.
func rotate(terms []term, i int) []term {
	out := make([]term, 0, len(terms))
	out = append(out, terms[i:]...)
	return append(out, terms[:i]...)
}

// spreadingOffset is the StatefulSet spreading heuristic of in-tree
// provisioning: a claim named "<claim>-<set>-<ordinal>" hashes only "<set>"
// (so the claims of one pod land together) and is offset by the ordinal (so
// the pods of a set spread over the segments); a name without a numeric
// suffix hashes whole. The hash is 32-bit FNV-1. An empty name gives 0.
func spreadingOffset(name string) (hash, index uint32) {
	if name == "" {
		return 0, 0
	}
	base := name
	if i := strings.LastIndexByte(name, '-'); i >= 0 {
		if ordinal, err := strconv.ParseUint(name[i+1:], 10, 32); err == nil {
			index = uint32(ordinal)
			base = name[:i]
			if j := strings.LastIndexByte(base, '-'); j >= 0 {
				base = base[j+1:]
			}
		}
	}
	h := fnv.New32()
	_, _ = h.Write([]byte(base))
	return h.Sum32(), index
}

// toCSI converts terms to CSI topologies with copies of their maps.
func toCSI(terms []term) []*csi.Topology {
	out := make([]*csi.Topology, 0, len(terms))
	for _, t := range terms {
		out = append(out, &csi.Topology{Segments: maps.Clone(t)})
	}
	return out
}

// nodeAffinity turns the accessible topology of a created volume into the
// PV's node affinity: one term per topology, an "In [value]" expression per
// segment key (sorted). Nil when the volume reports none.
func nodeAffinity(accessible []*csi.Topology) *corev1.VolumeNodeAffinity {
	var terms []corev1.NodeSelectorTerm
	for _, t := range accessible {
		if len(t.GetSegments()) == 0 {
			continue
		}
		var exprs []corev1.NodeSelectorRequirement
		for _, k := range slices.Sorted(maps.Keys(t.GetSegments())) {
			exprs = append(exprs, corev1.NodeSelectorRequirement{
				Key: k, Operator: corev1.NodeSelectorOpIn, Values: []string{t.GetSegments()[k]},
			})
		}
		terms = append(terms, corev1.NodeSelectorTerm{MatchExpressions: exprs})
	}
	if len(terms) == 0 {
		return nil
	}
	return &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: terms}}
}

// topologyCache remembers, per claim UID, the accessibility requirements of
// the CreateVolume sent for the claim, so that every retry of that create
// sends the identical request even if a Node or CSINode changed or
// vanished meanwhile (a different request for the same name could leak
// the first volume). An entry is added when a CreateVolume is sent and
// dropped on success, on a final answer, on rescheduling and when the claim
// is deleted (forgetClaim: a claim whose in-flight finalizer was removed
// by hand, or that was bound elsewhere, gets no further answer). Every
// read and write copies the requirement: callers never share memory with
// the cache.
type topologyCache struct {
	mu      sync.Mutex
	entries map[types.UID]*csi.TopologyRequirement // a nil value is a cached "no requirements"
}

func newTopologyCache() *topologyCache {
	return &topologyCache{entries: map[types.UID]*csi.TopologyRequirement{}}
}

func (c *topologyCache) get(uid types.UID) (*csi.TopologyRequirement, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	req, ok := c.entries[uid]
	return cloneRequirement(req), ok
}

func (c *topologyCache) put(uid types.UID, req *csi.TopologyRequirement) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.entries[uid] = cloneRequirement(req)
}

func (c *topologyCache) drop(uid types.UID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.entries, uid)
}

func cloneRequirement(req *csi.TopologyRequirement) *csi.TopologyRequirement {
	if req == nil {
		return nil
	}
	return proto.Clone(req).(*csi.TopologyRequirement)
}
