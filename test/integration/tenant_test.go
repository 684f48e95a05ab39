package integration

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kube-storage/csi-provisioner/internal/controlplane"
	"github.com/kube-storage/csi-provisioner/internal/testutil"
	"github.com/kube-storage/csi-provisioner/pkg/binder"
)

// tenantClient returns a client that acts as a user with the built-in
// "edit" role in the test's namespace, as a namespace's user does. "edit"
// is aggregated by kube-controller-manager, which does not run here, from
// the bootstrap roles bound instead.
func (e *env) tenantClient() kubernetes.Interface {
	e.t.Helper()
	const user = "tenant"
	for _, role := range []string{"system:aggregate-to-edit", "system:aggregate-to-view"} {
		_, err := e.c.RbacV1().RoleBindings(e.ns).Create(e.t.Context(), &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "tenant-" + strings.TrimPrefix(role, "system:aggregate-to-")},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
			Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
		}, metav1.CreateOptions{})
		if err != nil {
			e.t.Fatal(err)
		}
	}
	cfg := rest.CopyConfig(e.cp.AdminConfig())
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: []string{"system:authenticated"}}
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	return c
}

// forgeBoundClaim creates, as tenant, a claim that says it is bound to
// volume (bind-completed and spec.volumeName, which the tenant may set),
// and checks that the tenant cannot say so in its status: what tells the
// binder a claim it bound from a forged one.
func (e *env) forgeBoundClaim(tenant kubernetes.Interface, name, class, volume string) *corev1.PersistentVolumeClaim {
	e.t.Helper()
	pvc := testutil.NewPVC(e.ns, name).Class(class).VolumeName(volume).Annotation(annBindCompleted, "yes").RV("").Obj()
	pvc.UID, pvc.Status = "", corev1.PersistentVolumeClaimStatus{}
	var created *corev1.PersistentVolumeClaim
	// The role binding reaches the authorizer through a cache.
	testutil.Eventually(e.t, 0, "the tenant may not create claims", func(ctx context.Context) (bool, error) {
		var err error
		created, err = tenant.CoreV1().PersistentVolumeClaims(e.ns).Create(ctx, pvc, metav1.CreateOptions{})
		if apierrors.IsForbidden(err) {
			return false, nil
		}
		return err == nil, err
	})
	if created.Status.Phase == corev1.ClaimBound {
		e.t.Fatalf("claim %s created with status Bound by its user", name)
	}
	st := created.DeepCopy()
	st.Status.Phase = corev1.ClaimBound
	if _, err := tenant.CoreV1().PersistentVolumeClaims(e.ns).UpdateStatus(e.t.Context(), st, metav1.UpdateOptions{}); !apierrors.IsForbidden(err) {
		e.t.Fatalf("the tenant's status update of claim %s: %v, want Forbidden", name, err)
	}
	return created
}

// TestForgedBoundClaim: a namespace user (the "edit" role) marks a claim of
// theirs as bound to another claim's volume, which they may do
// (bind-completed and spec.volumeName). The binder marks it Lost
// (ClaimMisbound), as kube-controller-manager does, and beyond that:
//   - the volume is Released when its real claim is deleted; before, the
//     forged claim counted as still using it, and it was kept for ever;
//   - a volume an administrator pre-bound by name to another claim is
//     bound to that claim; before, the forged claim kept it from it.
func TestForgedBoundClaim(t *testing.T) {
	e := newEnv(t, controlplane.Need(t, shared))
	e.startBinder(binderConfig{opts: []binder.Option{binder.WithProvisionCheck(refuseProvision{})}})
	tenant := e.tenantClient()
	sc := e.createClass(testutil.NewSC(e.name("sc"), e.driver))

	// The real claim's volume, released when that claim goes.
	pv := e.createPV(testutil.NewPV(e.name("pv"), e.driver).Class(sc.Name).ReclaimPolicy(corev1.PersistentVolumeReclaimRetain))
	e.waitPVPhase(pv.Name, corev1.VolumeAvailable)
	claim := e.createClaim(testutil.NewPVC(e.ns, "data").Class(sc.Name))
	e.waitClaim(claim.Name, "Bound", isBound)
	forged := e.forgeBoundClaim(tenant, "forged", sc.Name, pv.Name)
	e.waitClaimPhase(forged.Name, corev1.ClaimLost)
	e.deleteClaim(claim.Name)
	released := e.waitPVPhase(pv.Name, corev1.VolumeReleased)
	if v := released.Annotations[binder.AnnBoundClaims]; strings.Contains(v, string(forged.UID)) {
		t.Errorf("volume %s records the forged claim as bound to it: %s=%q", pv.Name, binder.AnnBoundClaims, v)
	}

	// A volume an administrator pre-bound by name to a claim to come.
	prebound := e.createPV(testutil.NewPV(e.name("prebound"), e.driver).Class(sc.Name).
		ReclaimPolicy(corev1.PersistentVolumeReclaimRetain).ClaimRef(e.ns, "wanted", ""))
	forged2 := e.forgeBoundClaim(tenant, "forged2", sc.Name, prebound.Name)
	e.waitClaimPhase(forged2.Name, corev1.ClaimLost)
	wanted := e.createClaim(testutil.NewPVC(e.ns, "wanted").Class(sc.Name))
	got := e.waitClaim(wanted.Name, "Bound", isBound)
	if got.Spec.VolumeName != prebound.Name {
		t.Errorf("claim %s bound to %q, want the volume pre-bound to it, %s", wanted.Name, got.Spec.VolumeName, prebound.Name)
	}
}
