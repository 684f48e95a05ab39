package capacity

import (
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/klog/v2"
)

// segment is one topology segment of the driver: the values of the driver's
// topology keys on some node. It is empty for a driver without topology
// keys: its one segment is every node, and its objects' node topology
// selects all nodes, as upstream's.
type segment map[string]string

// String returns the canonical form of s: "key=value" pairs sorted by key
// and joined by commas. Label keys and values contain neither "," nor "=",
// so equal segments, and only those, have equal strings.
func (s segment) String() string {
	keys := slices.Sorted(maps.Keys(s))
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(k)
		b.WriteByte('=')
		b.WriteString(s[k])
	}
	return b.String()
}

// topologyKeys returns the topology keys driverName reports in csiNode
// (none for a driver without topology), and false when the driver is not
// installed on that node.
func topologyKeys(csiNode *storagev1.CSINode, driverName string) ([]string, bool) {
	for _, d := range csiNode.Spec.Drivers {
		if d.Name == driverName {
			return d.TopologyKeys, true
		}
	}
	return nil, false
}

// nodeSegments derives the segments of driverName from csiNodes and the
// Nodes of the same names, deduplicated and keyed by their canonical string.
//
// A CSINode contributes a segment when it lists the driver and its Node
// exists with every topology key of the driver as a label; the segment holds
// those keys with the Node's values (none: the empty segment, for a driver
// without topology keys). Any other CSINode contributes
// nothing (logged at V(3) when the Node is the reason). A lister error other
// than NotFound is treated like a missing Node: the next Node or CSINode
// event computes the segments again.
func nodeSegments(logger klog.Logger, driverName string, csiNodes []*storagev1.CSINode, nodes corelisters.NodeLister) map[string]segment {
	segments := map[string]segment{}
	for _, csiNode := range csiNodes {
		keys, installed := topologyKeys(csiNode, driverName)
		if !installed {
			continue
		}
		node, err := nodes.Get(csiNode.Name)
		if err != nil {
			if apierrors.IsNotFound(err) {
				logger.V(3).Info("CSINode has no Node; no topology segment", "csiNode", klog.KObj(csiNode))
			} else {
				logger.V(3).Info("Cannot read the Node of CSINode; no topology segment", "csiNode", klog.KObj(csiNode), "err", err)
			}
			continue
		}
		seg := make(segment, len(keys))
		for _, k := range keys {
			v, ok := node.Labels[k]
			if !ok {
				logger.V(3).Info("Node lacks a topology label; no topology segment", "node", klog.KObj(node), "label", k)
				seg = nil
				break
			}
			seg[k] = v
		}
		if seg != nil {
			segments[seg.String()] = seg
		}
	}
	return segments
}

// classWanted reports whether objects are published for class: it must be
// provisioned by driverName and bind WaitForFirstConsumer, or Immediate when
// immediate is set. A class without a binding mode binds Immediate (the API
// server's default).
func classWanted(class *storagev1.StorageClass, driverName string, immediate bool) bool {
	if class.Provisioner != driverName {
		return false
	}
	mode := storagev1.VolumeBindingImmediate
	if class.VolumeBindingMode != nil {
		mode = *class.VolumeBindingMode
	}
	switch mode {
	case storagev1.VolumeBindingWaitForFirstConsumer:
		return true
	case storagev1.VolumeBindingImmediate:
		return immediate
	default:
		return false
	}
}

// item is one desired CSIStorageCapacity: a storage class and a segment.
type item struct {
	class   string
	segment segment
}

// Queue keys. Class names are DNS subdomains and object names are generated,
// so neither contains "/"; the segment string may.
const (
	itemKeyPrefix   = "item/"
	objectKeyPrefix = "object/"
)

// itemKey returns the queue key of the item (class, seg).
func itemKey(class string, seg segment) string {
	return itemKeyPrefix + class + "/" + seg.String()
}

// objectKey returns the queue key of the CSIStorageCapacity named name.
func objectKey(name string) string { return objectKeyPrefix + name }

// desiredItems returns the cross product of the wanted classes and segments,
// keyed by item key.
func desiredItems(classes []*storagev1.StorageClass, segments map[string]segment, driverName string, immediate bool) map[string]item {
	items := map[string]item{}
	for _, class := range classes {
		if !classWanted(class, driverName, immediate) {
			continue
		}
		for _, seg := range segments {
			items[itemKey(class.Name, seg)] = item{class: class.Name, segment: seg}
		}
	}
	return items
}

// itemKeyOf returns the key of the item obj is for, or false when obj cannot
// be for any item (no node topology, or one with match expressions).
func itemKeyOf(obj *storagev1.CSIStorageCapacity) (string, bool) {
	if obj.NodeTopology == nil || len(obj.NodeTopology.MatchExpressions) > 0 {
		return "", false
	}
	return itemKey(obj.StorageClassName, obj.NodeTopology.MatchLabels), true
}

// compatible reports whether a volume with affinity may be accessible from
// seg, so that creating or deleting it may change seg's capacity. It is when
// affinity has no required terms, or when in some required term every
// expression with operator In on a key of seg lists seg's value. Other
// operators and keys seg does not have are ignored: the answer errs towards
// refreshing too much rather than too little.
func compatible(seg segment, affinity *corev1.VolumeNodeAffinity) bool {
	if affinity == nil || affinity.Required == nil || len(affinity.Required.NodeSelectorTerms) == 0 {
		return true
	}
	for _, term := range affinity.Required.NodeSelectorTerms {
		if termAllows(seg, term) {
			return true
		}
	}
	return false
}

func termAllows(seg segment, term corev1.NodeSelectorTerm) bool {
	for _, expr := range term.MatchExpressions {
		if expr.Operator != corev1.NodeSelectorOpIn {
			continue
		}
		v, ok := seg[expr.Key]
		if !ok {
			continue
		}
		if !slices.Contains(expr.Values, v) {
			return false
		}
	}
	return true
}
