package chaos

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kube-storage/csi-provisioner/internal/testutil"
)

// TestRecorderGap: objects that disappeared during a gap of the watch get
// a deletion record whose place in the history never invents a violation.
// Before the gap a claim is Bound to its PV (the claim's last write after
// the PV's, as the binder writes them); in the gap the claim is deleted,
// then its PV released and deleted; the lists after the gap show neither.
// If the claim is still listed, the PV's deletion while it exists is seen.
func TestRecorderGap(t *testing.T) {
	for _, tc := range []struct {
		name       string
		claimAfter bool // the claim is still listed after the gap
		want       []string
	}{
		{name: "claim and PV deleted in the gap"},
		{name: "only the PV deleted in the gap", claimAfter: true, want: []string{InvNoEarlyDelete + ": pv pv-a"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			claim := func(rv string, phase corev1.PersistentVolumeClaimPhase, volume string) *corev1.PersistentVolumeClaim {
				return testutil.NewPVC("ns", "a").UID("u1").RV(rv).Phase(phase).VolumeName(volume).Obj()
			}
			pv := testutil.NewPV("pv-a", testDriver).UID("pv-uid").RV("3").ClaimRef("ns", "a", "u1").Obj()
			pv.Status.Phase = corev1.VolumeBound
			bound := claim("4", corev1.ClaimBound, "pv-a")

			client := fake.NewClientset()
			client.PrependReactor("list", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
				list := metav1.ListMeta{ResourceVersion: "20"}
				switch a.GetResource().Resource {
				case "persistentvolumes":
					return true, &corev1.PersistentVolumeList{ListMeta: list}, nil
				case "persistentvolumeclaims":
					l := &corev1.PersistentVolumeClaimList{ListMeta: list}
					if tc.claimAfter {
						l.Items = append(l.Items, *bound)
					}
					return true, l, nil
				}
				return false, nil, nil
			})
			r := NewRecorder(client)
			r.add(claim("1", corev1.ClaimPending, ""), false)
			r.add(pv, false)
			r.add(bound, false)
			for _, kind := range []string{"pvc", "pv"} {
				if _, err := r.list(t.Context(), kind, true); err != nil {
					t.Fatal(err)
				}
			}
			assertViolations(t, CheckHistory(r.Records()), tc.want)
		})
	}
}
