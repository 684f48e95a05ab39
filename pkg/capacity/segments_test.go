package capacity

import (
	"maps"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2/ktesting"

	"github.com/kube-storage/csi-provisioner/internal/testutil"
)

func TestSegments(t *testing.T) {
	node := func(name string, labels map[string]string) *corev1.Node { return testutil.NewNode(name, labels) }
	csiNode := func(name string, keys ...string) *storagev1.CSINode {
		return testutil.NewCSINode(name, testDriver, keys...)
	}
	twoDrivers := csiNode("n1", zoneKey)
	twoDrivers.Spec.Drivers = append([]storagev1.CSINodeDriver{{Name: "other.csi.example.com", NodeID: "n1", TopologyKeys: []string{rackKey}}},
		twoDrivers.Spec.Drivers...)

	tests := []struct {
		name     string
		csiNodes []*storagev1.CSINode
		nodes    []*corev1.Node
		want     []string
	}{
		{
			name: "nothing",
		},
		{
			name:     "one node",
			csiNodes: []*storagev1.CSINode{csiNode("n1", zoneKey)},
			nodes:    []*corev1.Node{node("n1", map[string]string{zoneKey: "a", "other": "x"})},
			want:     []string{zoneKey + "=a"},
		},
		{
			name:     "driver missing on the CSINode",
			csiNodes: []*storagev1.CSINode{testutil.NewCSINode("n1", "other.csi.example.com", zoneKey)},
			nodes:    []*corev1.Node{node("n1", map[string]string{zoneKey: "a"})},
		},
		{
			// One empty segment, for all nodes, as upstream.
			name:     "driver without topology keys",
			csiNodes: []*storagev1.CSINode{csiNode("n1"), csiNode("n2")},
			nodes:    []*corev1.Node{node("n1", map[string]string{zoneKey: "a"}), node("n2", nil)},
			want:     []string{""},
		},
		{
			name:     "node missing",
			csiNodes: []*storagev1.CSINode{csiNode("n1", zoneKey)},
			nodes:    []*corev1.Node{node("n2", map[string]string{zoneKey: "a"})},
		},
		{
			name:     "key missing on the node",
			csiNodes: []*storagev1.CSINode{csiNode("n1", zoneKey, rackKey)},
			nodes:    []*corev1.Node{node("n1", map[string]string{zoneKey: "a"})},
		},
		{
			name:     "empty label value is a value",
			csiNodes: []*storagev1.CSINode{csiNode("n1", zoneKey)},
			nodes:    []*corev1.Node{node("n1", map[string]string{zoneKey: ""})},
			want:     []string{zoneKey + "="},
		},
		{
			name:     "duplicates merged, two zones",
			csiNodes: []*storagev1.CSINode{csiNode("n1", zoneKey), csiNode("n2", zoneKey), csiNode("n3", zoneKey)},
			nodes: []*corev1.Node{
				node("n1", map[string]string{zoneKey: "a"}),
				node("n2", map[string]string{zoneKey: "b"}),
				node("n3", map[string]string{zoneKey: "a"}),
			},
			want: []string{zoneKey + "=a", zoneKey + "=b"},
		},
		{
			name:     "two keys, sorted",
			csiNodes: []*storagev1.CSINode{csiNode("n1", zoneKey, rackKey), csiNode("n2", rackKey, zoneKey)},
			nodes: []*corev1.Node{
				node("n1", map[string]string{zoneKey: "a", rackKey: "r1"}),
				node("n2", map[string]string{zoneKey: "a", rackKey: "r1"}),
			},
			want: []string{rackKey + "=r1," + zoneKey + "=a"},
		},
		{
			name:     "only this driver's keys count",
			csiNodes: []*storagev1.CSINode{twoDrivers},
			nodes:    []*corev1.Node{node("n1", map[string]string{zoneKey: "a"})},
			want:     []string{zoneKey + "=a"},
		},
		{
			name:     "one good node among bad ones",
			csiNodes: []*storagev1.CSINode{csiNode("n1", zoneKey), csiNode("n2", zoneKey), csiNode("n3", zoneKey)},
			nodes: []*corev1.Node{
				node("n1", map[string]string{"other": "a"}),
				node("n3", map[string]string{zoneKey: "c"}),
			},
			want: []string{zoneKey + "=c"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			indexer := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
			for _, n := range tt.nodes {
				if err := indexer.Add(n); err != nil {
					t.Fatal(err)
				}
			}
			got := nodeSegments(ktesting.NewLogger(t, ktesting.NewConfig()), testDriver, tt.csiNodes, corelisters.NewNodeLister(indexer))
			for k, seg := range got {
				if k != seg.String() {
					t.Errorf("segment %v keyed %q", seg, k)
				}
			}
			if diff := cmp.Diff(tt.want, slices.Sorted(maps.Keys(got))); diff != "" {
				t.Errorf("segments (-want +got):\n%s", diff)
			}
		})
	}
}

func TestSegmentString(t *testing.T) {
	tests := []struct {
		seg  segment
		want string
	}{
		{seg: nil, want: ""},
		{seg: segment{"b": "2", "a": "1", "c/d": "3"}, want: "a=1,b=2,c/d=3"},
	}
	for _, tt := range tests {
		if got := tt.seg.String(); got != tt.want {
			t.Errorf("%v.String() = %q, want %q", map[string]string(tt.seg), got, tt.want)
		}
	}
}

func TestDesiredItems(t *testing.T) {
	noMode := testutil.NewSC("nomode", testDriver).NoBindingMode().Obj()
	otherWFFC := testutil.NewSC("other", "other.csi.example.com").WaitForFirstConsumer().Obj()
	classes := []*storagev1.StorageClass{wffc("fast"), immediate("slow"), noMode, otherWFFC}
	segments := map[string]segment{zone("a").String(): zone("a"), zone("b").String(): zone("b")}

	tests := []struct {
		name      string
		classes   []*storagev1.StorageClass
		segments  map[string]segment
		immediate bool
		want      []string
	}{
		{
			name:     "WaitForFirstConsumer only",
			classes:  classes,
			segments: segments,
			want:     []string{itemKey("fast", zone("a")), itemKey("fast", zone("b"))},
		},
		{
			name:      "with immediate binding",
			classes:   classes,
			segments:  segments,
			immediate: true,
			want: []string{
				itemKey("fast", zone("a")), itemKey("fast", zone("b")),
				itemKey("nomode", zone("a")), itemKey("nomode", zone("b")),
				itemKey("slow", zone("a")), itemKey("slow", zone("b")),
			},
		},
		{
			name:     "other provisioners never",
			classes:  []*storagev1.StorageClass{otherWFFC},
			segments: segments,
		},
		{
			name:    "no segments",
			classes: classes,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := desiredItems(tt.classes, tt.segments, testDriver, tt.immediate)
			for k, it := range got {
				if k != itemKey(it.class, it.segment) {
					t.Errorf("item %+v keyed %q", it, k)
				}
			}
			if diff := cmp.Diff(tt.want, slices.Sorted(maps.Keys(got))); diff != "" {
				t.Errorf("items (-want +got):\n%s", diff)
			}
		})
	}
}

func TestCompatible(t *testing.T) {
	req := func(key string, op corev1.NodeSelectorOperator, values ...string) corev1.NodeSelectorRequirement {
		return corev1.NodeSelectorRequirement{Key: key, Operator: op, Values: values}
	}
	affinity := func(terms ...[]corev1.NodeSelectorRequirement) *corev1.VolumeNodeAffinity {
		a := &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{}}
		for _, t := range terms {
			a.Required.NodeSelectorTerms = append(a.Required.NodeSelectorTerms, corev1.NodeSelectorTerm{MatchExpressions: t})
		}
		return a
	}
	terms := func(reqs ...corev1.NodeSelectorRequirement) []corev1.NodeSelectorRequirement { return reqs }
	seg := segment{zoneKey: "a", rackKey: "r1"}

	tests := []struct {
		name     string
		affinity *corev1.VolumeNodeAffinity
		want     bool
	}{
		{name: "no affinity", want: true},
		{name: "no required terms", affinity: &corev1.VolumeNodeAffinity{}, want: true},
		{name: "matching zone", affinity: affinity(terms(req(zoneKey, corev1.NodeSelectorOpIn, "b", "a"))), want: true},
		{name: "other zone", affinity: affinity(terms(req(zoneKey, corev1.NodeSelectorOpIn, "b")))},
		{name: "all expressions of a term must match", affinity: affinity(terms(req(zoneKey, corev1.NodeSelectorOpIn, "a"), req(rackKey, corev1.NodeSelectorOpIn, "r2")))},
		{name: "some term suffices", affinity: affinity(terms(req(zoneKey, corev1.NodeSelectorOpIn, "b")), terms(req(zoneKey, corev1.NodeSelectorOpIn, "a"))), want: true},
		{name: "keys outside the segment are ignored", affinity: affinity(terms(req("kubernetes.io/hostname", corev1.NodeSelectorOpIn, "n9"), req(zoneKey, corev1.NodeSelectorOpIn, "a"))), want: true},
		{name: "other operators are ignored", affinity: affinity(terms(req(zoneKey, corev1.NodeSelectorOpNotIn, "a"))), want: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := compatible(seg, tt.affinity); got != tt.want {
				t.Errorf("compatible: got %v, want %v", got, tt.want)
			}
		})
	}
}
