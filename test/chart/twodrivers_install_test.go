package chart

import (
	"os/exec"
	"testing"

	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-storage/csi-provisioner/internal/controlplane"
)

// TestHelmInstallTwoVendors: two vendors follow the README's command
// (`helm install csi-provisioner deploy/sidecar/chart --namespace NS`),
// each for its own driver in its own namespace, and a third picks a long
// (valid) release name. Every install succeeds.
func TestHelmInstallTwoVendors(t *testing.T) {
	cp := controlplane.Need(t, shared)
	helm := tool(t, "helm", "HELM")
	for _, tc := range []struct{ release, driver string }{
		{"csi-provisioner", "a.csi.example.com"},
		{"csi-provisioner", "b.csi.example.com"},
		{"acme-block-storage-controller-production", "c.csi.example.com"},
	} {
		ns := createNamespace(t, cp, "vendor")
		kubeconfig := []string{"--namespace", ns, "--kubeconfig", cp.KubeconfigPath}
		_, err := run(t, helm, append([]string{"install", tc.release, chartDir,
			"--set", "csiDriver.name=" + tc.driver, "--set", "storageClasses[0].name=class-" + tc.driver[:1]}, kubeconfig...)...)
		if err != nil {
			t.Errorf("vendor %s (release %s in %s): %v", tc.driver, tc.release, ns, err)
			continue
		}
		release := tc.release
		t.Cleanup(func() { _ = exec.Command(helm, append([]string{"uninstall", release}, kubeconfig...)...).Run() })
	}
}

// TestKustomizeSecondDriverKeepsFirstsRBAC: the kustomize manifests applied
// for a first driver in one namespace, then for a second driver in another
// with the README's overlay for a second driver (its own CSIDriver and
// class are left out here: a vendor renames them). The first driver's
// sidecar keeps its cluster-wide permissions.
func TestKustomizeSecondDriverKeepsFirstsRBAC(t *testing.T) {
	cp := controlplane.Need(t, shared)
	a := newApplier(t, cp)
	nsA, nsB := createNamespace(t, cp, "driver-a"), createNamespace(t, cp, "driver-b")
	a.applyAll(t, kustomizeBuild(t, nsA))
	var second manifest
	for _, o := range kustomizeBuildWith(t, nsB, secondDriverPatches) {
		if o.GetKind() != "CSIDriver" && o.GetKind() != "StorageClass" {
			second = append(second, o)
		}
	}
	a.applyAll(t, second)
	for _, attrs := range []authorizationv1.ResourceAttributes{
		{Verb: "create", Resource: "persistentvolumes"},
		{Verb: "create", Resource: "events", Namespace: "default"},
	} {
		review, err := cp.Client().AuthorizationV1().SubjectAccessReviews().Create(t.Context(), &authorizationv1.SubjectAccessReview{
			Spec: authorizationv1.SubjectAccessReviewSpec{
				User:               "system:serviceaccount:" + nsA + ":csi-provisioner",
				Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:" + nsA, "system:authenticated"},
				ResourceAttributes: &attrs,
			},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if !review.Status.Allowed {
			t.Errorf("after the second driver's apply, the first driver's sidecar (%s/csi-provisioner) may not %s %s: %s", nsA, attrs.Verb, attrs.Resource, review.Status.Reason)
		}
	}
}

// TestPrivilegedDriverAccepted: a vendor whose driver needs a privileged
// container sets driver.securityContext.privileged=true. Helm merges it
// with the chart's default allowPrivilegeEscalation: false, a pair the API
// server refuses; the chart leaves that default out then, and the API
// server takes the Deployment (a server-side dry run).
func TestPrivilegedDriverAccepted(t *testing.T) {
	cp := controlplane.Need(t, shared)
	a := newApplier(t, cp)
	ns := createNamespace(t, cp, "privileged")
	m := mustHelmTemplate(t, "csi-provisioner", ns, "--set", "driver.securityContext.privileged=true")
	d := m.one(t, "Deployment")
	if err := a.apply(t.Context(), d, true); err != nil {
		t.Errorf("the Deployment with a privileged driver container is refused: %v", err)
	}
}
