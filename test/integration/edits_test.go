package integration

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kube-storage/csi-provisioner/internal/controlplane"
	"github.com/kube-storage/csi-provisioner/internal/testutil"
	"github.com/kube-storage/csi-provisioner/pkg/binder"
)

// holdVolumeUpdates returns a wrapper for the binder's transport that fails
// its updates of the named volume's spec (not its status) while *hold is
// set, and the switch. It keeps the binder from repairing an edit the test
// made, so that what the binder does with the edited volume meanwhile is
// seen deterministically.
func holdVolumeUpdates(name string) (func(http.RoundTripper) http.RoundTripper, *atomic.Bool) {
	var hold atomic.Bool
	path := "/api/v1/persistentvolumes/" + name
	return func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if hold.Load() && r.Method == http.MethodPut && r.URL.Path == path {
				return nil, errors.New("volume updates held by the test")
			}
			return rt.RoundTrip(r)
		})
	}, &hold
}

// TestBinderClaimRefRenamed: an administrator edits the claimRef of a Bound
// volume to another claim name (or namespace) and keeps the UID of the
// claim still bound to it. That claim still uses the volume: the volume is
// never Released (with policy Delete the provisioner would delete the data
// under it), a Warning VolumeStillInUse says why, and the claim's next sync
// points the claimRef back at it.
func TestBinderClaimRefRenamed(t *testing.T) {
	e := newEnv(t, controlplane.Need(t, shared))
	name := e.name("pv")
	wrap, hold := holdVolumeUpdates(name)
	e.startBinder(binderConfig{wrap: wrap})
	hist := recordHistory(t, e.c, e.ns)
	sc := e.createClass(testutil.NewSC(e.name("sc"), e.driver))
	pv := e.createPV(testutil.NewPV(name, e.driver).Class(sc.Name).ReclaimPolicy(corev1.PersistentVolumeReclaimDelete))
	e.waitPVPhase(pv.Name, corev1.VolumeAvailable)
	claim := e.createClaim(testutil.NewPVC(e.ns, "data").Class(sc.Name))
	e.waitClaim(claim.Name, "Bound", isBound)

	hold.Store(true)
	edited := e.getPV(pv.Name)
	edited.Spec.ClaimRef.Name = "renamed"
	if _, err := e.c.CoreV1().PersistentVolumes().Update(t.Context(), edited, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 0, "no VolumeStillInUse event on the edited volume", func(ctx context.Context) (bool, error) {
		if got := e.getPV(pv.Name); got.Status.Phase != corev1.VolumeBound {
			t.Fatalf("the volume of a claim still bound to it became %s after its claimRef was renamed", got.Status.Phase)
		}
		evs, err := e.events(ctx, pv.UID)
		for _, ev := range evs {
			if strings.HasPrefix(ev, "Warning VolumeStillInUse:") && strings.Contains(ev, e.ns+"/"+claim.Name) {
				return true, nil
			}
		}
		return false, err
	})

	hold.Store(false)
	e.waitPV(pv.Name, "pointing back at its claim", func(pv *corev1.PersistentVolume) bool {
		return pv.Spec.ClaimRef != nil && pv.Spec.ClaimRef.Name == claim.Name
	})
	checkBound(t, e.getClaim(claim.Name), e.getPV(pv.Name), true, true)
	for _, s := range hist.volumes(func(s pvState) bool { return s.name == pv.Name }) {
		if s.phase == corev1.VolumeReleased || s.phase == corev1.VolumeFailed {
			t.Errorf("volume state %v: the volume was never to be released", s)
		}
	}
}

// TestBinderClaimRefMovedByName: an administrator points the claimRef of a
// Bound volume at another claim by name only (no UID) while the claim bound
// to it still exists. Upstream's binder then binds the volume to the named
// claim: the first claim's data is handed to another. Here the named claim
// does not take it (a Warning VolumeStillInUse on the volume says why; it
// is handed to the provisioner instead), however many resyncs pass.
func TestBinderClaimRefMovedByName(t *testing.T) {
	e := newEnv(t, controlplane.Need(t, shared))
	rb := e.startBinder(binderConfig{opts: []binder.Option{binder.WithProvisionCheck(refuseProvision{})}})
	hist := recordHistory(t, e.c, e.ns)
	sc := e.createClass(testutil.NewSC(e.name("sc"), e.driver))
	pv := e.createPV(testutil.NewPV(e.name("pv"), e.driver).Class(sc.Name).ReclaimPolicy(corev1.PersistentVolumeReclaimDelete))
	e.waitPVPhase(pv.Name, corev1.VolumeAvailable)
	claim := e.createClaim(testutil.NewPVC(e.ns, "data").Class(sc.Name))
	e.waitClaim(claim.Name, "Bound", isBound)

	edited := e.getPV(pv.Name)
	edited.Spec.ClaimRef = &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: e.ns, Name: "intruder"}
	if _, err := e.c.CoreV1().PersistentVolumes().Update(t.Context(), edited, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	intruder := e.createClaim(testutil.NewPVC(e.ns, "intruder").Class(sc.Name))
	testutil.Eventually(t, 0, "no VolumeStillInUse event on the volume", func(ctx context.Context) (bool, error) {
		if got := e.getClaim(intruder.Name); got.Spec.VolumeName != "" {
			t.Fatalf("claim %s took volume %s, which claim %s is still bound to", intruder.Name, got.Spec.VolumeName, claim.Name)
		}
		evs, err := e.events(ctx, pv.UID)
		for _, ev := range evs {
			if strings.HasPrefix(ev, "Warning VolumeStillInUse:") && strings.Contains(ev, e.ns+"/"+claim.Name) {
				return true, nil
			}
		}
		return false, err
	})
	// The binder marked the claim Lost (Misbound) and recorded first on
	// the volume that it was bound, so that it keeps it (AnnBoundClaims).
	e.waitClaimPhase(claim.Name, corev1.ClaimLost)
	if v := e.getPV(pv.Name).Annotations[binder.AnnBoundClaims]; v != string(claim.UID) {
		t.Errorf("volume %s: %s=%q, want the UID of claim %s", pv.Name, binder.AnnBoundClaims, v, claim.Name)
	}
	rb.waitResyncs(t, 2)
	if got := e.getClaim(intruder.Name); got.Spec.VolumeName != "" || got.Annotations[annStorageProv] != e.driver {
		t.Errorf("claim %s: volumeName %q, storage-provisioner %q; want none, handed to %s", got.Name, got.Spec.VolumeName, got.Annotations[annStorageProv], e.driver)
	}
	for _, s := range hist.volumes(func(s pvState) bool { return s.name == pv.Name }) {
		if s.claimUID == intruder.UID {
			t.Errorf("volume state %v: reserved for the claim that is not bound to it", s)
		}
	}
}

// TestBinderClaimRefUIDRemoved: an administrator removes the UID from the
// claimRef of a Bound volume. Upstream's binder makes the volume Available
// and the claim Lost ("Two claims are bound to the same volume"), though no
// other claim has it, and the claim's pods cannot start. Here the claim
// re-binds its volume (the claimRef gets the UID back) and never becomes
// Lost.
func TestBinderClaimRefUIDRemoved(t *testing.T) {
	e := newEnv(t, controlplane.Need(t, shared))
	e.startBinder(binderConfig{})
	hist := recordHistory(t, e.c, e.ns)
	sc := e.createClass(testutil.NewSC(e.name("sc"), e.driver))
	pv := e.createPV(testutil.NewPV(e.name("pv"), e.driver).Class(sc.Name).ReclaimPolicy(corev1.PersistentVolumeReclaimDelete))
	e.waitPVPhase(pv.Name, corev1.VolumeAvailable)
	claim := e.createClaim(testutil.NewPVC(e.ns, "data").Class(sc.Name))
	e.waitClaim(claim.Name, "Bound", isBound)

	edited := e.getPV(pv.Name)
	edited.Spec.ClaimRef.UID = ""
	updated, err := e.c.CoreV1().PersistentVolumes().Update(t.Context(), edited, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	e.waitPV(pv.Name, "re-bound to its claim", func(got *corev1.PersistentVolume) bool {
		return got.ResourceVersion != updated.ResourceVersion && got.Spec.ClaimRef != nil && got.Spec.ClaimRef.UID == claim.UID &&
			got.Status.Phase == corev1.VolumeBound
	})
	checkBound(t, e.getClaim(claim.Name), e.getPV(pv.Name), true, true)
	for _, s := range hist.claimStates() {
		if s.name == claim.Name && s.phase == corev1.ClaimLost {
			t.Errorf("claim state %v: the claim of a volume whose claimRef UID was removed became Lost", s)
		}
	}
}

// TestBinderClaimRefMovedToMisboundClaim: a claim says it is bound to a
// volume that another claim holds (it is Lost, Misbound), and then an
// administrator points the volume's claimRef at it by name only (no UID)
// while the other claim is still bound to the volume. Re-binding the named
// claim, as is done when the claimRef merely lost its UID, would hand the
// other claim's data to it: it stays Lost (case 3-4-2), the volume is never
// reserved for it, and, its policy being Delete, never released, however
// many resyncs pass.
func TestBinderClaimRefMovedToMisboundClaim(t *testing.T) {
	e := newEnv(t, controlplane.Need(t, shared))
	rb := e.startBinder(binderConfig{})
	hist := recordHistory(t, e.c, e.ns)
	sc := e.createClass(testutil.NewSC(e.name("sc"), e.driver))
	pv := e.createPV(testutil.NewPV(e.name("pv"), e.driver).Class(sc.Name).ReclaimPolicy(corev1.PersistentVolumeReclaimDelete))
	e.waitPVPhase(pv.Name, corev1.VolumeAvailable)
	claim := e.createClaim(testutil.NewPVC(e.ns, "data").Class(sc.Name))
	e.waitClaim(claim.Name, "Bound", isBound)
	intruder := e.createClaim(testutil.NewPVC(e.ns, "intruder").Class(sc.Name).VolumeName(pv.Name).Annotation(annBindCompleted, "yes"))
	e.waitClaimPhase(intruder.Name, corev1.ClaimLost)

	edited := e.getPV(pv.Name)
	edited.Spec.ClaimRef = &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: e.ns, Name: intruder.Name}
	updated, err := e.c.CoreV1().PersistentVolumes().Update(t.Context(), edited, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The volume sync leaves the claimRef to the claim sync (phase
	// Available); the named claim's sync must then refuse it.
	e.waitPV(pv.Name, "synced after the edit", func(got *corev1.PersistentVolume) bool {
		return got.ResourceVersion != updated.ResourceVersion || got.Status.Phase == corev1.VolumeAvailable
	})
	rb.waitResyncs(t, 3)

	if got := e.getClaim(intruder.Name); got.Status.Phase != corev1.ClaimLost {
		t.Errorf("claim %s is %s after the claimRef was moved to it by name, want Lost", got.Name, got.Status.Phase)
	}
	if got := e.getPV(pv.Name); got.Spec.ClaimRef == nil || got.Spec.ClaimRef.UID != "" || got.Spec.ClaimRef.Name != intruder.Name {
		t.Errorf("volume claimRef %+v, want the administrator's edit left alone", got.Spec.ClaimRef)
	}
	for _, s := range hist.volumes(func(s pvState) bool { return s.name == pv.Name }) {
		if s.claimUID == intruder.UID {
			t.Errorf("volume state %v: reserved for the claim whose claimRef was moved to it", s)
		}
		if s.phase == corev1.VolumeReleased || s.phase == corev1.VolumeFailed {
			t.Errorf("volume state %v: the volume of a claim still bound to it was released", s)
		}
	}
	e.waitEvent(intruder.UID, corev1.EventTypeWarning, "ClaimMisbound", "Two claims are bound to the same volume, this one is bound incorrectly")
}

// TestBinderClaimRefEditedAwayFromTerminatingClaim: an administrator points
// the claimRef of a Bound volume at a claim that does not exist, and the
// claim bound to it is then deleted, but stays while its pods still use the
// volume (kubernetes.io/pvc-protection; here a finalizer of the test's).
// The volume is not Released while that claim exists (with policy Delete
// its data would be deleted under the pods), a Warning VolumeStillInUse
// names the claim, and once the claim is gone the volume is Released.
func TestBinderClaimRefEditedAwayFromTerminatingClaim(t *testing.T) {
	const podsFinalizer = "kube-storage.io/test-pods-use-it"
	e := newEnv(t, controlplane.Need(t, shared))
	name := e.name("pv")
	wrap, hold := holdVolumeUpdates(name)
	e.startBinder(binderConfig{wrap: wrap})
	sc := e.createClass(testutil.NewSC(e.name("sc"), e.driver))
	pv := e.createPV(testutil.NewPV(name, e.driver).Class(sc.Name).ReclaimPolicy(corev1.PersistentVolumeReclaimRetain))
	e.waitPVPhase(pv.Name, corev1.VolumeAvailable)
	claim := e.createClaim(testutil.NewPVC(e.ns, "data").Class(sc.Name).Finalizers(podsFinalizer))
	e.waitClaim(claim.Name, "Bound", isBound)

	// Deleted first, so that the Warning can only come from a claim being
	// deleted.
	e.deleteClaim(claim.Name)
	e.waitClaim(claim.Name, "being deleted", func(c *corev1.PersistentVolumeClaim) bool { return c.DeletionTimestamp != nil })
	hold.Store(true)
	edited := e.getPV(pv.Name)
	edited.Spec.ClaimRef.Name, edited.Spec.ClaimRef.UID = "gone", "uid-gone"
	if _, err := e.c.CoreV1().PersistentVolumes().Update(t.Context(), edited, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 0, "no VolumeStillInUse event naming the claim being deleted", func(ctx context.Context) (bool, error) {
		if got := e.getPV(pv.Name); got.Status.Phase != corev1.VolumeBound {
			t.Fatalf("the volume of a claim being deleted, still bound to it, became %s after its claimRef was edited away", got.Status.Phase)
		}
		evs, err := e.events(ctx, pv.UID)
		for _, ev := range evs {
			if strings.HasPrefix(ev, "Warning VolumeStillInUse:") && strings.Contains(ev, e.ns+"/"+claim.Name) {
				return true, nil
			}
		}
		return false, err
	})

	// The pods are gone: the claim goes, and the volume with it.
	// A merge patch: the binder may still be writing the claim.
	patch := []byte(`{"metadata":{"finalizers":null}}`)
	if _, err := e.c.CoreV1().PersistentVolumeClaims(e.ns).Patch(t.Context(), claim.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitPVPhase(pv.Name, corev1.VolumeReleased)
}
