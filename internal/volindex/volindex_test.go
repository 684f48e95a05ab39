package volindex

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kube-storage/csi-provisioner/internal/testutil"
)

func TestVolumes(t *testing.T) {
	inf := informers.NewSharedInformerFactory(fake.NewClientset(), 0).Core().V1().PersistentVolumes().Informer()
	// Twice, as the provisioner and the binder both do.
	for range 2 {
		if err := Add(inf); err != nil {
			t.Fatal(err)
		}
	}
	for _, pv := range []*corev1.PersistentVolume{
		testutil.NewPV("pv-a", "d").ClaimRef("ns", "a", "uid-1").Obj(),
		testutil.NewPV("pv-a-old", "other-driver").ClaimRef("ns", "a", "uid-0").Obj(),
		testutil.NewPV("pv-b", "d").ClaimRef("ns", "b", "uid-2").Obj(),
		testutil.NewPV("pv-free", "d").Obj(),
	} {
		if err := inf.GetIndexer().Add(pv); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		key  string
		want []string
	}{
		{Key("ns", "a"), []string{"pv-a", "pv-a-old"}},
		{Key("ns", "b"), []string{"pv-b"}},
		{Key("other", "a"), nil},
		{Key("", "pv-free"), nil},
	} {
		var got []string
		for _, pv := range Volumes(inf, tc.key) {
			got = append(got, pv.Name)
		}
		slices.Sort(got)
		if !slices.Equal(got, tc.want) {
			t.Errorf("Volumes(%q) = %v, want %v", tc.key, got, tc.want)
		}
	}
}
