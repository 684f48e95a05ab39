package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kube-storage/csi-provisioner/internal/testutil"
	"github.com/kube-storage/csi-provisioner/pkg/inflight"
)

// truncatedNames are the flags under which PVs are named vol-<first 8
// characters of the claim UID>: the name no longer says which claim a
// volume belongs to, so the sidecar finds its volumes through the
// volume-by-claim index (internal/volindex).
var truncatedNames = []string{"--volume-name-prefix=vol", "--volume-name-uuid-length=8"}

// truncatedName is the PV name of the claim with uid under truncatedNames.
func truncatedName(uid types.UID) string {
	return "vol-" + strings.ReplaceAll(string(uid), "-", "")[:8]
}

// TestVolumeNames: with upstream's --volume-name-prefix and
// --volume-name-uuid-length, PVs (and the driver's volumes) are named
// <prefix>-<UID, maybe truncated> instead of pvc-<claim UID>; several
// claims are provisioned and bound to PVs of those names, the driver has
// exactly the PVs' volumes, and deleting the claims deletes PVs and
// volumes. With a full UID the sidecar finds a claim's volume by its name;
// with a truncated one through the index, which both cases exercise.
func TestVolumeNames(t *testing.T) {
	for _, tc := range []struct {
		name  string
		flags []string
		want  func(uid types.UID) string
	}{
		{"truncated", truncatedNames, truncatedName},
		{"prefix", []string{"--volume-name-prefix=vol"}, func(uid types.UID) string { return "vol-" + string(uid) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStack(t, stackConfig{memory: true, sidecarArgs: tc.flags})
			sc := s.class("names", nil)
			var claims []*corev1.PersistentVolumeClaim
			for _, name := range []string{"a", "b", "c"} {
				claims = append(claims, s.claim(testutil.NewPVC(s.ns, name).Class(sc.Name)))
			}
			var pvs, handles []string
			for _, claim := range claims {
				_, pv := s.waitBound(claim.Name)
				if want := tc.want(claim.UID); pv.Name != want {
					t.Errorf("claim %s is bound to PV %s, want %s", claim.Name, pv.Name, want)
				}
				if ref := pv.Spec.ClaimRef; ref == nil || ref.UID != claim.UID || ref.Name != claim.Name || ref.Namespace != s.ns {
					t.Errorf("PV %s claimRef = %+v, want claim %s with UID %s", pv.Name, ref, claim.Name, claim.UID)
				}
				if pv.Status.Phase != corev1.VolumeBound {
					t.Errorf("PV %s phase = %s, want Bound", pv.Name, pv.Status.Phase)
				}
				pvs = append(pvs, pv.Name)
				handles = append(handles, pv.Spec.CSI.VolumeHandle)
			}
			slices.Sort(handles)
			ids, err := s.driver.VolumeIDs(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(ids, handles) {
				t.Errorf("driver volumes = %v, want the PVs' handles %v", ids, handles)
			}
			for _, claim := range claims {
				if err := s.c.CoreV1().PersistentVolumeClaims(s.ns).Delete(t.Context(), claim.Name, metav1.DeleteOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			for i, claim := range claims {
				s.waitGone(claim.Name, pvs[i])
			}
		})
	}
}

// TestVolumeNamesDeleteDuringCreate: under truncatedNames, a claim is
// deleted while its CreateVolume is in flight (the driver answers 4s
// late), with the sidecar running or SIGKILLed and restarted while the
// claim is deleted (as TestKillDuringCreateVolume does with default names).
// The claim keeps the in-flight finalizer until the create is finished,
// and nothing leaks: no PV, no driver volume.
func TestVolumeNamesDeleteDuringCreate(t *testing.T) {
	for _, tc := range []struct {
		name string
		kill bool
	}{{"running", false}, {"killed", true}} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStack(t, stackConfig{
				driverArgs:  []string{"--create-latency=4s"},
				sidecarArgs: append([]string{"--timeout=30s"}, truncatedNames...),
			})
			ctx := t.Context()
			sc := s.class("slow", nil)
			claim := s.claim(testutil.NewPVC(s.ns, "slow").Class(sc.Name))
			// The driver answers 4s later.
			s.waitCreateVolumeStarted(claim)
			if tc.kill {
				s.kill()
			}
			if got := s.getClaim(claim.Name); !inflight.Has(got) {
				t.Fatalf("claim lacks the in-flight finalizer while CreateVolume runs: %v", got.Finalizers)
			}
			if err := s.c.CoreV1().PersistentVolumeClaims(s.ns).Delete(ctx, claim.Name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			if tc.kill {
				// The claim survives (Terminating) while the sidecar is down.
				if got := s.getClaim(claim.Name); got.DeletionTimestamp == nil {
					t.Fatalf("claim not being deleted: %+v", got.ObjectMeta)
				}
				if err := s.sidecar.Restart(); err != nil {
					t.Fatal(err)
				}
			}
			s.waitGone(claim.Name, truncatedName(claim.UID))
			if pv := s.pvOf(claim.UID); pv != nil {
				t.Errorf("PV %s of the deleted claim is left", pv.Name)
			}
		})
	}
}

// TestVolumeNameCollision: with --volume-name-uuid-length=1 there are 16
// volume names, so of 17 claims at least two share one. The claims are
// created one at a time, each waited for until it is Bound or told that
// its volume name is taken. A claim whose name is taken gets no volume
// (a CreateVolume of that name would return the other claim's), stays
// Pending with a Warning that names the PV and says what to do; deleting
// it, as the Warning says, leaves the other claim's volume alone.
func TestVolumeNameCollision(t *testing.T) {
	s := newStack(t, stackConfig{memory: true, sidecarArgs: []string{"--volume-name-uuid-length=1"}})
	ctx := t.Context()
	sc := s.class("short", nil)
	var bound, taken []*corev1.PersistentVolumeClaim
	for i := range 17 {
		claim := s.claim(testutil.NewPVC(s.ns, fmt.Sprintf("c-%02d", i)).Class(sc.Name))
		testutil.Eventually(t, 0, "claim "+claim.Name+" neither Bound nor told its volume name is taken", func(ctx context.Context) (bool, error) {
			got, err := s.c.CoreV1().PersistentVolumeClaims(s.ns).Get(ctx, claim.Name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			if got.Status.Phase == corev1.ClaimBound {
				bound = append(bound, got)
				return true, nil
			}
			for _, e := range s.events(s.ns, string(claim.UID)) {
				if strings.HasPrefix(e, "Warning ProvisioningFailed: the volume name pvc-") && strings.Contains(e, "of this claim is taken: PersistentVolume pvc-") &&
					strings.Contains(e, "--volume-name-uuid-length=1 keeps the first 1 characters of the claim's UID, which another claim shares. Delete this claim and create it again") {
					taken = append(taken, got)
					return true, nil
				}
			}
			return false, nil
		})
	}
	if len(taken) == 0 || len(bound)+len(taken) != 17 {
		t.Fatalf("%d claims Bound and %d told their volume name is taken, want 17 in all with at least one taken", len(bound), len(taken))
	}
	ids, err := s.driver.VolumeIDs(ctx)
	if err != nil || len(ids) != len(bound) {
		t.Fatalf("driver volumes = %v, %v; want one per Bound claim (%d)", ids, err, len(bound))
	}
	for _, c := range taken {
		if got := s.getClaim(c.Name); got.Spec.VolumeName != "" || got.Status.Phase != corev1.ClaimPending {
			t.Errorf("claim %s whose volume name is taken: volumeName %q, phase %s; want Pending without a volume", c.Name, got.Spec.VolumeName, got.Status.Phase)
		}
		if err := s.c.CoreV1().PersistentVolumeClaims(s.ns).Delete(ctx, c.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		s.waitClaimGone(c.Name, "claim "+c.Name+" whose volume name is taken not deleted")
	}
	after, err := s.driver.VolumeIDs(ctx)
	if err != nil || !slices.Equal(after, ids) {
		t.Fatalf("driver volumes after deleting the claims whose name was taken = %v, %v; want %v", after, err, ids)
	}
	for _, c := range bound {
		if got := s.getClaim(c.Name); got.Status.Phase != corev1.ClaimBound {
			t.Errorf("claim %s is %s after the others went, want Bound", c.Name, got.Status.Phase)
		}
		if err := s.c.CoreV1().PersistentVolumeClaims(s.ns).Delete(ctx, c.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range bound {
		s.waitGone(c.Name, c.Spec.VolumeName)
	}
}
