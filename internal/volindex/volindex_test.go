package volindex

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kube-storage/csi-provisioner/internal/testutil"
)

func TestVolumes(t *testing.T) {
	volumes := []*corev1.PersistentVolume{
		testutil.NewPV("pvc-uid-1", "d").ClaimRef("ns", "a", "uid-1").Obj(),
		testutil.NewPV("pvc-uid-0", "d").ClaimRef("ns", "a", "uid-0").Obj(), // an earlier claim "a"
		testutil.NewPV("pv-static", "d").ClaimRef("ns", "a", "uid-1").Obj(),
		testutil.NewPV("pv-a-old", "other-driver").ClaimRef("ns", "a", "uid-0").Obj(),
		testutil.NewPV("pvc-uid-9", "d").ClaimRef("ns", "b", "uid-2").Obj(), // claimRef edited
		testutil.NewPV("pvc-uid-3", "d").ClaimRef("ns", "c", "").Obj(),      // pre-bound by name
		testutil.NewPV("pv-free", "d").Obj(),
	}
	type lookup struct {
		ns, name string
		uid      types.UID
		want     []string
	}
	for _, tc := range []struct {
		prefix  string
		lookups []lookup
		indexed []string // volumes with an index entry
	}{{
		prefix: "",
		lookups: []lookup{
			{"ns", "a", "uid-1", []string{"pv-a-old", "pv-static", "pvc-uid-0", "pvc-uid-1"}},
			{"ns", "b", "uid-2", []string{"pvc-uid-9"}},
			{"ns", "c", "uid-3", []string{"pvc-uid-3"}},
			{"other", "a", "uid-1", nil},
			{"", "pv-free", "", nil},
		},
		indexed: []string{"pv-a-old", "pv-static", "pvc-uid-0", "pvc-uid-1", "pvc-uid-3", "pvc-uid-9"},
	}, {
		prefix: "pvc",
		lookups: []lookup{
			{"ns", "a", "uid-1", []string{"pv-a-old", "pv-static", "pvc-uid-1"}},
			{"ns", "a", "uid-0", []string{"pv-a-old", "pv-static", "pvc-uid-0"}},
			{"ns", "a", "", []string{"pv-a-old", "pv-static"}},
			{"ns", "b", "uid-2", []string{"pvc-uid-9"}},
			{"ns", "b", "uid-9", []string{"pvc-uid-9"}},
			{"ns", "c", "uid-3", []string{"pvc-uid-3"}},
			{"other", "a", "uid-1", nil}, // pvc-uid-1 is another claim's
			{"", "pv-free", "", nil},
		},
		indexed: []string{"pv-a-old", "pv-static", "pvc-uid-3", "pvc-uid-9"},
	}} {
		t.Run("prefix="+tc.prefix, func(t *testing.T) {
			inf := informers.NewSharedInformerFactory(fake.NewClientset(), 0).Core().V1().PersistentVolumes().Informer()
			// Twice, as the provisioner and the binder both do.
			var x *Index
			for range 2 {
				var err error
				if x, err = Add(inf, tc.prefix); err != nil {
					t.Fatal(err)
				}
			}
			if n := len(inf.GetIndexer().GetIndexers()); n != 2 { // with the namespace index
				t.Errorf("the informer has %d indexes, want 2", n)
			}
			for _, pv := range volumes {
				if err := inf.GetIndexer().Add(pv); err != nil {
					t.Fatal(err)
				}
			}
			for _, l := range tc.lookups {
				var got []string
				for _, pv := range x.Volumes(l.ns, l.name, l.uid) {
					got = append(got, pv.Name)
				}
				slices.Sort(got)
				if !slices.Equal(got, l.want) {
					t.Errorf("Volumes(%s/%s, %q) = %v, want %v", l.ns, l.name, l.uid, got, l.want)
				}
			}
			var indexed []string
			for _, key := range inf.GetIndexer().ListIndexFuncValues(x.Name()) {
				objs, _ := inf.GetIndexer().ByIndex(x.Name(), key)
				for _, o := range objs {
					indexed = append(indexed, o.(*corev1.PersistentVolume).Name)
				}
			}
			slices.Sort(indexed)
			if !slices.Equal(indexed, tc.indexed) {
				t.Errorf("indexed volumes %v, want %v", indexed, tc.indexed)
			}
		})
	}
}

func TestUIDOf(t *testing.T) {
	for _, tc := range []struct {
		prefix, name string
		uid          types.UID
		ok           bool
	}{
		{"pvc", "pvc-uid-1", "uid-1", true},
		{"pvc", "pvc-", "", false},
		{"pvc", "pvc", "", false},
		{"pvc", "pvcx-uid-1", "", false},
		{"pvc", "other-uid-1", "", false},
		{"", "pvc-uid-1", "", false},
	} {
		x := &Index{prefix: tc.prefix}
		if uid, ok := x.UIDOf(tc.name); uid != tc.uid || ok != tc.ok {
			t.Errorf("prefix %q: UIDOf(%q) = %q, %v; want %q, %v", tc.prefix, tc.name, uid, ok, tc.uid, tc.ok)
		}
		if tc.ok && x.VolumeName(tc.uid) != tc.name {
			t.Errorf("prefix %q: VolumeName(%q) = %q, want %q", tc.prefix, tc.uid, x.VolumeName(tc.uid), tc.name)
		}
	}
	x := &Index{prefix: "pvc"}
	if n := testing.AllocsPerRun(100, func() { x.UIDOf("pvc-uid-1") }); n != 0 {
		t.Errorf("UIDOf allocates %v times", n)
	}
}
