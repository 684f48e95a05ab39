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

// FuzzUIDOf checks the round trip of volume names and claim UIDs: a name
// made for a UID gives that UID back, and a name that gives a UID is the
// name made for it (so no name maps to two UIDs, nor two names to one).
// Without a prefix, or for an empty UID, there is no name.
func FuzzUIDOf(f *testing.F) {
	f.Add("pvc", "pvc-uid-1")
	f.Add("pvc", "pvc-")
	f.Add("pvc", "pvcx-uid-1")
	f.Add("", "pvc-uid-1")
	f.Add("a-b", "a-b-c")
	f.Fuzz(func(t *testing.T, prefix, name string) {
		x := &Index{prefix: prefix}
		uid, ok := x.UIDOf(name)
		switch {
		case ok && (uid == "" || x.VolumeName(uid) != name):
			t.Errorf("prefix %q: UIDOf(%q) = %q, whose name is %q", prefix, name, uid, x.VolumeName(uid))
		case !ok && uid != "":
			t.Errorf("prefix %q: UIDOf(%q) = %q without ok", prefix, name, uid)
		}
		// name read as a UID.
		made := x.VolumeName(types.UID(name))
		if (made == "") != (prefix == "" || name == "") {
			t.Fatalf("prefix %q: VolumeName(%q) = %q", prefix, name, made)
		}
		if made != "" {
			if back, ok := x.UIDOf(made); !ok || back != types.UID(name) {
				t.Errorf("prefix %q: UIDOf(VolumeName(%q)) = %q, %v", prefix, name, back, ok)
			}
		}
	})
}

// FuzzVolumes builds volumes from data, four bytes each (name, claimRef
// namespace, name and UID drawn from small sets, so that they collide) and
// checks Volumes against its promise, with and without a prefix: the
// volumes whose claimRef names the claim, except those named after a
// claimRef UID other than the one looked up.
func FuzzVolumes(f *testing.F) {
	f.Add("pvc", []byte{0, 1, 0, 1, 1, 1, 0, 2, 4, 1, 0, 1, 5, 0, 0, 0}, uint8(1), uint8(0), uint8(1))
	f.Add("", []byte{0, 1, 0, 1, 2, 1, 1, 3}, uint8(1), uint8(1), uint8(3))
	f.Add("pvc", []byte{3, 1, 0, 0, 6, 2, 1, 2}, uint8(2), uint8(1), uint8(0))
	f.Fuzz(func(t *testing.T, prefix string, data []byte, ns, name, uid uint8) {
		namespaces := []string{"", "ns", "other"}
		claims := []string{"a", "b"}
		uids := []types.UID{"", "u1", "u2", "u-1"}
		names := []string{
			prefix + "-u1", prefix + "-u2", prefix + "-u-1", prefix + "-",
			prefix, "static", prefix + "x-u1", "pvc-u1",
		}
		type ref struct {
			ns, name string
			uid      types.UID
		}
		refs := map[string]*ref{} // by volume name, nil without a claimRef
		var volumes []*corev1.PersistentVolume
		for i := 0; i+4 <= len(data) && len(volumes) < 32; i += 4 {
			n := names[int(data[i])%len(names)]
			if _, dup := refs[n]; n == "" || dup {
				continue
			}
			b := testutil.NewPV(n, "d")
			var r *ref
			if data[i+1]%4 != 0 { // else no claimRef
				r = &ref{namespaces[int(data[i+1])%len(namespaces)], claims[int(data[i+2])%len(claims)], uids[int(data[i+3])%len(uids)]}
				b = b.ClaimRef(r.ns, r.name, string(r.uid))
			}
			refs[n] = r
			volumes = append(volumes, b.Obj())
		}
		inf := informers.NewSharedInformerFactory(fake.NewClientset(), 0).Core().V1().PersistentVolumes().Informer()
		x, err := Add(inf, prefix)
		if err != nil {
			t.Fatal(err)
		}
		for _, pv := range volumes {
			if err := inf.GetIndexer().Add(pv); err != nil {
				t.Fatal(err)
			}
		}
		lns, lname, luid := namespaces[int(ns)%len(namespaces)], claims[int(name)%len(claims)], uids[int(uid)%len(uids)]
		var want []string
		for _, pv := range volumes {
			r := refs[pv.Name]
			if r == nil || r.ns != lns || r.name != lname {
				continue
			}
			// Named after its claimRef's UID, which is another claim's.
			if prefix != "" && r.uid != "" && pv.Name == prefix+"-"+string(r.uid) && r.uid != luid {
				continue
			}
			want = append(want, pv.Name)
		}
		var got []string
		for _, pv := range x.Volumes(lns, lname, luid) {
			got = append(got, pv.Name)
		}
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("prefix %q: Volumes(%q, %q, %q) = %v, want %v", prefix, lns, lname, luid, got, want)
		}
	})
}
