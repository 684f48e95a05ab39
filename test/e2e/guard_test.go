package e2e

import (
	"context"
	"fmt"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/kube-storage/csi-provisioner/internal/testutil"
	"github.com/kube-storage/csi-provisioner/pkg/inflight"
)

// TestKillDuringCreateVolumeThenBoundElsewhere: the sidecar is killed while
// the driver creates a claim's volume, and before it restarts the claim is
// bound to another (static) volume. The restarted sidecar cannot know
// whether a volume was created, so the claim keeps the in-flight finalizer
// and gets a Warning that says what to check; the claim works (Bound to the
// static volume). Following the Warning (delete the backend volume, remove
// the finalizer) lets the claim be deleted, and nothing is left.
func TestKillDuringCreateVolumeThenBoundElsewhere(t *testing.T) {
	s := newStack(t, stackConfig{driverArgs: []string{"--create-latency=4s"}, sidecarArgs: []string{"--timeout=30s"}})
	sc := s.class("slow", nil)
	claim := s.claim(testutil.NewPVC(s.ns, "rebound").Class(sc.Name))
	ctx := t.Context()
	s.waitCreateVolumeStarted(claim)
	s.kill()

	// An administrator binds the claim to a static volume meanwhile.
	static := testutil.NewPV(s.ns+"-static", s.driver.Name).RV("").Class(sc.Name).Size("1Gi").
		ReclaimPolicy(corev1.PersistentVolumeReclaimRetain).ClaimRef(s.ns, claim.Name, string(claim.UID)).Obj()
	static.Spec.CSI.VolumeHandle = "not-in-the-driver"
	if _, err := s.c.CoreV1().PersistentVolumes().Create(ctx, static, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = s.c.CoreV1().PersistentVolumes().Delete(context.Background(), static.Name, metav1.DeleteOptions{})
	})
	s.updateClaim(claim.Name, func(c *corev1.PersistentVolumeClaim) { c.Spec.VolumeName = static.Name })

	if err := s.sidecar.Restart(); err != nil {
		t.Fatal(err)
	}
	s.waitEvent(s.ns, string(claim.UID), "Warning", "ProvisioningFailed",
		"may have been in progress; finalizer "+inflight.Finalizer+" stays so that a volume named pvc-"+string(claim.UID)+" of driver "+s.driver.Name+" cannot leak")
	got, _ := s.waitBound(claim.Name)
	if got.Spec.VolumeName != static.Name || !inflight.Has(got) {
		t.Fatalf("claim bound to %q with finalizers %v, want %s with %s", got.Spec.VolumeName, got.Finalizers, static.Name, inflight.Finalizer)
	}
	vols, err := s.driver.ListVolumes(ctx)
	if err != nil || len(vols) != 1 {
		t.Fatalf("driver volumes = %v, %v; want the one whose create was in flight", vols, err)
	}

	// Follow the Warning.
	if err := s.driver.DeleteVolume(ctx, vols[0].GetVolumeId()); err != nil {
		t.Fatal(err)
	}
	s.updateClaim(claim.Name, func(c *corev1.PersistentVolumeClaim) { inflight.Remove(c) })
	if err := s.c.CoreV1().PersistentVolumeClaims(s.ns).Delete(ctx, claim.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	s.waitGone(claim.Name, "")
	s.waitPVPhase(static.Name, corev1.VolumeReleased) // Retain: kept, Released
}

// TestKillDuringCreateVolumeThenClassDeleted: the sidecar is killed while
// the driver creates a claim's volume, and before it restarts the claim's
// StorageClass and then the claim are deleted. The restarted sidecar
// cannot ask the driver again without the class (its parameters and
// secrets), so the claim stays with the in-flight finalizer and gets a
// Warning that says why and what to do. Recreating the class lets the
// provisioner finish: the volume gets its PV, which is reclaimed, and the
// claim goes with nothing left.
func TestKillDuringCreateVolumeThenClassDeleted(t *testing.T) {
	s := newStack(t, stackConfig{driverArgs: []string{"--create-latency=4s"}, sidecarArgs: []string{"--timeout=30s"}})
	sc := s.class("gone", nil)
	claim := s.claim(testutil.NewPVC(s.ns, "orphan").Class(sc.Name))
	ctx := t.Context()
	s.waitCreateVolumeStarted(claim)
	s.kill()

	classes := s.c.StorageV1().StorageClasses()
	if err := classes.Delete(ctx, sc.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := s.c.CoreV1().PersistentVolumeClaims(s.ns).Delete(ctx, claim.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := s.sidecar.Restart(); err != nil {
		t.Fatal(err)
	}
	s.waitEvent(s.ns, string(claim.UID), "Warning", "ProvisioningFailed",
		"its StorageClass "+sc.Name+" no longer exists, so the provisioner cannot ask the driver again; finalizer "+inflight.Finalizer+
			" stays so that a volume named pvc-"+string(claim.UID)+" of driver "+s.driver.Name+" cannot leak: recreate the class")
	if got := s.getClaim(claim.Name); got == nil || !inflight.Has(got) {
		t.Fatalf("claim = %v, want it kept by %s", got, inflight.Finalizer)
	}

	// Follow the Warning: recreate the class.
	sc.ResourceVersion, sc.UID = "", ""
	if _, err := classes.Create(ctx, sc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	s.waitGone(claim.Name, "pvc-"+string(claim.UID))
}

// updateClaim applies change to the claim name, retrying on conflicts.
func (s *stack) updateClaim(name string, change func(*corev1.PersistentVolumeClaim)) {
	s.t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		c, err := s.c.CoreV1().PersistentVolumeClaims(s.ns).Get(s.t.Context(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		change(c)
		_, err = s.c.CoreV1().PersistentVolumeClaims(s.ns).Update(s.t.Context(), c, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		s.t.Fatalf("update claim %s: %v", name, err)
	}
}

// TestRefusedPVExplained: the API server refuses the PV of a created
// volume (here a ValidatingAdmissionPolicy, as a policy engine would).
// The library retries the save and only logs; the claim stays Pending with
// the in-flight finalizer and a Warning that says why. Once the policy
// goes, the retry saves the PV and the claim binds.
func TestRefusedPVExplained(t *testing.T) {
	s := newStack(t, stackConfig{})
	ctx := t.Context()
	sc := s.class("refused", nil)
	name := "refuse-pvs-of-" + s.ns
	policy := &admissionregistrationv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionregistrationv1.RuleWithOperations{
					Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
					Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"persistentvolumes"}},
				},
			}}},
			Validations: []admissionregistrationv1.Validation{{
				Expression: fmt.Sprintf("!has(object.spec.claimRef) || object.spec.claimRef.namespace != %q", s.ns),
				Message:    "PersistentVolumes of namespace " + s.ns + " must carry label team",
			}},
		},
	}
	admission := s.c.AdmissionregistrationV1()
	if _, err := admission.ValidatingAdmissionPolicies().Create(ctx, policy, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName: name, ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
		},
	}
	if _, err := admission.ValidatingAdmissionPolicyBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	removed := false
	remove := func() {
		removed = true
		_ = admission.ValidatingAdmissionPolicyBindings().Delete(context.Background(), name, metav1.DeleteOptions{})
		_ = admission.ValidatingAdmissionPolicies().Delete(context.Background(), name, metav1.DeleteOptions{})
	}
	t.Cleanup(func() {
		if !removed {
			remove()
		}
	})
	// The API server takes the policy in from a watch: wait until a
	// dry-run create of such a PV is refused.
	probe := testutil.NewPV(s.ns+"-probe", s.driver.Name).RV("").Class(sc.Name).Size("1Gi").ClaimRef(s.ns, "probe", "").Obj()
	testutil.Eventually(t, 0, "the policy never refused a PV", func(ctx context.Context) (bool, error) {
		_, err := s.c.CoreV1().PersistentVolumes().Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return apierrors.IsInvalid(err) || apierrors.IsForbidden(err), nil
	})

	claim := s.claim(testutil.NewPVC(s.ns, "refused").Class(sc.Name))
	s.waitEvent(s.ns, string(claim.UID), "Warning", "ProvisioningFailed",
		"could not be saved (retried with backoff; the claim keeps finalizer "+inflight.Finalizer+" until it is)")
	s.waitEvent(s.ns, string(claim.UID), "Warning", "ProvisioningFailed", "must carry label team")
	got, err := s.c.CoreV1().PersistentVolumeClaims(s.ns).Get(ctx, claim.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Status.Phase != corev1.ClaimPending || !inflight.Has(got) {
		t.Fatalf("claim %s with finalizers %v, want Pending with %s while its PV is refused", got.Status.Phase, got.Finalizers, inflight.Finalizer)
	}

	remove()
	bound, pv := s.waitBound(claim.Name)
	if pv.Name != "pvc-"+string(claim.UID) || bound.Spec.VolumeName != pv.Name {
		t.Errorf("claim bound to %q (PV %s), want pvc-%s", bound.Spec.VolumeName, pv.Name, claim.UID)
	}
}
