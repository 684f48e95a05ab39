package capacity

import (
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/kube-storage/csi-provisioner/internal/testutil"
)

func TestPVRefresh(t *testing.T) {
	objs := objects(one(wffc("fast"), wffc("bulk")), zoneNode("n1", "a"), zoneNode("n2", "b"), zoneNode("n3", "c"))
	pv := func(name string) *testutil.PVBuilder { return testutil.NewPV(name, testDriver).Class("fast") }
	itemsOf := func(classes []string, zones ...string) []string {
		var keys []string
		for _, class := range classes {
			for _, z := range zones {
				keys = append(keys, itemKey(class, zone(z)))
			}
		}
		slices.Sort(keys)
		return keys
	}
	// fast: the volume's class only; both: every class, since a volume
	// placed in a segment uses storage that every class shares there.
	fast := func(zones ...string) []string { return itemsOf([]string{"fast"}, zones...) }
	both := func(zones ...string) []string { return itemsOf([]string{"bulk", "fast"}, zones...) }
	twoZones := pv("pv").Obj()
	twoZones.Spec.NodeAffinity = &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{
		{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: zoneKey, Operator: corev1.NodeSelectorOpIn, Values: []string{"a"}}}},
		{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: zoneKey, Operator: corev1.NodeSelectorOpIn, Values: []string{"c"}}}},
	}}}
	onNode := pv("pv").NodeAffinity("kubernetes.io/hostname", "n2").Obj()

	tests := []struct {
		name  string
		event func(c *Controller)
		want  []string
	}{
		{
			name:  "added without affinity: every segment of its class",
			event: func(c *Controller) { c.onVolume(pv("pv").Obj()) },
			want:  fast("a", "b", "c"),
		},
		{
			name:  "added in one zone: every class there",
			event: func(c *Controller) { c.onVolume(pv("pv").NodeAffinity(zoneKey, "b").Obj()) },
			want:  both("b"),
		},
		{
			name:  "added with two terms",
			event: func(c *Controller) { c.onVolume(twoZones) },
			want:  both("a", "c"),
		},
		{
			name:  "affinity on a key segments do not have",
			event: func(c *Controller) { c.onVolume(onNode) },
			want:  both("a", "b", "c"),
		},
		{
			name:  "zone without segment",
			event: func(c *Controller) { c.onVolume(pv("pv").NodeAffinity(zoneKey, "z").Obj()) },
		},
		{
			name:  "other driver",
			event: func(c *Controller) { c.onVolume(testutil.NewPV("pv", "other.csi.example.com").Class("fast").Obj()) },
		},
		{
			name:  "not a CSI volume",
			event: func(c *Controller) { c.onVolume(pv("pv").NotCSI().Obj()) },
		},
		{
			name:  "class with no items",
			event: func(c *Controller) { c.onVolume(testutil.NewPV("pv", testDriver).Class("gone").Obj()) },
		},
		{
			name: "class with no items, in one zone: the other classes there",
			event: func(c *Controller) {
				c.onVolume(testutil.NewPV("pv", testDriver).Class("gone").NodeAffinity(zoneKey, "a").Obj())
			},
			want: both("a"),
		},
		{
			name:  "no class",
			event: func(c *Controller) { c.onVolume(testutil.NewPV("pv", testDriver).Obj()) },
		},
		{
			name: "update, not deleting",
			event: func(c *Controller) {
				c.onVolumeUpdate(pv("pv").Obj(), pv("pv").RV("2").Phase(corev1.VolumeBound).Obj())
			},
		},
		{
			name: "update to deleting",
			event: func(c *Controller) {
				c.onVolumeUpdate(pv("pv").NodeAffinity(zoneKey, "a").Obj(), pv("pv").NodeAffinity(zoneKey, "a").Deleted().Obj())
			},
			want: both("a"),
		},
		{
			name:  "update while deleting",
			event: func(c *Controller) { c.onVolumeUpdate(pv("pv").Deleted().Obj(), pv("pv").RV("2").Deleted().Obj()) },
		},
		{
			name:  "deleted",
			event: func(c *Controller) { c.onVolumeDelete(pv("pv").NodeAffinity(zoneKey, "c").Obj()) },
			want:  both("c"),
		},
		{
			name: "deleted, tombstone",
			event: func(c *Controller) {
				c.onVolumeDelete(cache.DeletedFinalStateUnknown{Key: "pv", Obj: pv("pv").NodeAffinity(zoneKey, "b").Obj()})
			},
			want: both("b"),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, objs, &fakeDriver{})
			tt.event(h.c)
			if diff := cmp.Diff(tt.want, h.drain()); diff != "" {
				t.Errorf("queued (-want +got):\n%s", diff)
			}
		})
	}
}

// TestClaimRescheduledRefresh covers which claim updates refresh capacity:
// only the removal of selected-node from an unbound claim, and then the
// items of the claim's class in every segment.
func TestClaimRescheduledRefresh(t *testing.T) {
	objs := objects(one(wffc("fast"), wffc("bulk")), zoneNode("n1", "a"), zoneNode("n2", "b"))
	claim := func(class string) *testutil.PVCBuilder { return testutil.NewPVC("ns", "c").Class(class) }
	selected := func(class string) *testutil.PVCBuilder { return claim(class).Annotation(annSelectedNode, "n1") }
	tests := []struct {
		name     string
		old, new *corev1.PersistentVolumeClaim
		want     []string
	}{
		{
			name: "selected node removed", old: selected("fast").Obj(), new: claim("fast").RV("2").Obj(),
			want: []string{itemKey("fast", zone("a")), itemKey("fast", zone("b"))},
		},
		{name: "selected node removed, class without items", old: selected("gone").Obj(), new: claim("gone").RV("2").Obj()},
		{name: "selected node set", old: claim("fast").Obj(), new: selected("fast").RV("2").Obj()},
		{name: "selected node kept", old: selected("fast").Obj(), new: selected("fast").RV("2").Obj()},
		{name: "bound", old: selected("fast").Obj(), new: claim("fast").RV("2").VolumeName("pv").Obj()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, objs, &fakeDriver{})
			h.c.onClaimUpdate(tt.old, tt.new)
			if diff := cmp.Diff(tt.want, h.drain()); diff != "" {
				t.Errorf("queued (-want +got):\n%s", diff)
			}
		})
	}
}

func TestTopologyEvents(t *testing.T) {
	objs := objects(one(wffc("fast")), zoneNode("n1", "a"), zoneNode("n2", "b"))
	existing := csc("csisc-b", "fast", "b", 1)
	objs = append(objs, existing)
	node := func(name string, labels map[string]string) *corev1.Node {
		n := testutil.NewNode(name, labels)
		n.Labels["kubernetes.io/hostname"] = name
		return n
	}

	tests := []struct {
		name   string
		change func(t *testing.T, h *harness)
		want   []string
	}{
		{
			name: "node in a new zone",
			change: func(t *testing.T, h *harness) {
				for _, o := range zoneNode("n3", "c") {
					h.cache(t, o)
				}
				h.c.onTopologyChange(node("n3", map[string]string{zoneKey: "c"}))
			},
			want: []string{itemKey("fast", zone("c"))},
		},
		{
			name: "node in an existing zone",
			change: func(t *testing.T, h *harness) {
				for _, o := range zoneNode("n3", "a") {
					h.cache(t, o)
				}
				h.c.onTopologyChange(node("n3", map[string]string{zoneKey: "a"}))
			},
		},
		{
			name: "last node of a zone moves: new item, old object obsolete",
			change: func(t *testing.T, h *harness) {
				moved := node("n2", map[string]string{zoneKey: "d"})
				moved.ResourceVersion = "2"
				h.cache(t, moved)
				h.c.onNodeUpdate(node("n2", map[string]string{zoneKey: "b"}), moved)
			},
			want: []string{itemKey("fast", zone("d")), objectKey("csisc-b")},
		},
		{
			name: "node update without label change is ignored",
			change: func(t *testing.T, h *harness) {
				// The cache has a change the handler must not look at.
				h.cache(t, node("n2", map[string]string{zoneKey: "d"}))
				old := node("n2", map[string]string{zoneKey: "b"})
				updated := old.DeepCopy()
				updated.ResourceVersion = "2"
				updated.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
				h.c.onNodeUpdate(old, updated)
			},
		},
		{
			name: "driver removed from a CSINode",
			change: func(t *testing.T, h *harness) {
				updated := testutil.NewCSINode("n2", "other.csi.example.com", zoneKey)
				updated.ResourceVersion = "2"
				h.cache(t, updated)
				h.c.onCSINodeUpdate(testutil.NewCSINode("n2", testDriver, zoneKey), updated)
			},
			want: []string{objectKey("csisc-b")},
		},
		{
			name: "CSINode update of another driver is ignored",
			change: func(t *testing.T, h *harness) {
				old := testutil.NewCSINode("n2", testDriver, zoneKey)
				updated := old.DeepCopy()
				updated.Spec.Drivers = append(updated.Spec.Drivers, storagev1.CSINodeDriver{Name: "other.csi.example.com", NodeID: "n2"})
				h.cache(t, testutil.NewCSINode("n2", "other.csi.example.com"))
				h.c.onCSINodeUpdate(old, updated)
			},
		},
		{
			name: "new class",
			change: func(t *testing.T, h *harness) {
				h.cache(t, wffc("bulk"))
				h.c.onTopologyChange(wffc("bulk"))
			},
			want: []string{itemKey("bulk", zone("a")), itemKey("bulk", zone("b"))},
		},
		{
			name: "class deleted: its objects queued",
			change: func(t *testing.T, h *harness) {
				class := wffc("fast")
				if err := h.factory.Storage().V1().StorageClasses().Informer().GetStore().Delete(class); err != nil {
					t.Fatal(err)
				}
				h.c.onTopologyChange(cache.DeletedFinalStateUnknown{Key: "fast", Obj: class})
			},
			want: []string{objectKey("csisc-b")},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, objs, &fakeDriver{})
			tt.change(t, h)
			if diff := cmp.Diff(tt.want, h.drain()); diff != "" {
				t.Errorf("queued (-want +got):\n%s", diff)
			}
		})
	}
}

func TestObjectEvents(t *testing.T) {
	objs := objects(one(wffc("fast")), zoneNode("n1", "a"))
	ka := itemKey("fast", zone("a"))

	tests := []struct {
		name   string
		cached []*storagev1.CSIStorageCapacity
		event  func(c *Controller)
		want   []string
	}{
		{
			name:   "desired object added: nothing",
			cached: []*storagev1.CSIStorageCapacity{csc("x", "fast", "a", 1)},
			event:  func(c *Controller) { c.onObject(csc("x", "fast", "a", 1)) },
		},
		{
			name:   "obsolete object added",
			cached: []*storagev1.CSIStorageCapacity{csc("x", "gone", "a", 1)},
			event:  func(c *Controller) { c.onObject(csc("x", "gone", "a", 1)) },
			want:   []string{objectKey("x")},
		},
		{
			name:   "second object of an item",
			cached: []*storagev1.CSIStorageCapacity{csc("x", "fast", "a", 1), csc("y", "fast", "a", 1)},
			event:  func(c *Controller) { c.onObject(csc("y", "fast", "a", 1)) },
			want:   []string{ka},
		},
		{
			name:  "last object of an item deleted",
			event: func(c *Controller) { c.onObjectDelete(csc("x", "fast", "a", 1)) },
			want:  []string{ka},
		},
		{
			name:  "last object of an item deleted, tombstone",
			event: func(c *Controller) { c.onObjectDelete(cache.DeletedFinalStateUnknown{Obj: csc("x", "fast", "a", 1)}) },
			want:  []string{ka},
		},
		{
			name:   "duplicate deleted: nothing",
			cached: []*storagev1.CSIStorageCapacity{csc("x", "fast", "a", 1)},
			event:  func(c *Controller) { c.onObjectDelete(csc("y", "fast", "a", 1)) },
		},
		{
			name:  "obsolete object deleted: nothing",
			event: func(c *Controller) { c.onObjectDelete(csc("x", "gone", "a", 1)) },
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, objs, &fakeDriver{})
			for _, o := range tt.cached {
				h.cache(t, o)
			}
			tt.event(h.c)
			if diff := cmp.Diff(tt.want, h.drain()); diff != "" {
				t.Errorf("queued (-want +got):\n%s", diff)
			}
		})
	}
}

// TestStartQueuesObsolete checks the first pass: every item and every
// obsolete object is queued.
func TestStartQueuesObsolete(t *testing.T) {
	objs := objects(one(wffc("fast")), zoneNode("n1", "a"), one(
		csc("keep", "fast", "a", 1),
		csc("old", "slow", "a", 1),
	))
	objs = append(objs, &storagev1.CSIStorageCapacity{
		ObjectMeta:       metav1.ObjectMeta{Name: "no-topology", Namespace: testNamespace},
		StorageClassName: "fast",
	})
	h := newHarness(t, objs, &fakeDriver{})
	h.c.mu.Lock()
	h.c.started = false
	h.c.desired = nil
	h.c.mu.Unlock()
	h.c.start(testContext(t))
	want := []string{itemKey("fast", zone("a")), objectKey("no-topology"), objectKey("old")}
	if diff := cmp.Diff(want, h.drain()); diff != "" {
		t.Errorf("queued (-want +got):\n%s", diff)
	}
}
