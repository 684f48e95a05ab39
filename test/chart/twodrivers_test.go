package chart

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/kube-storage/csi-provisioner/internal/e2e"
)

// clusterScoped are the kinds the chart and the manifests render without a
// namespace.
var clusterScoped = map[string]bool{"ClusterRole": true, "ClusterRoleBinding": true, "CSIDriver": true, "StorageClass": true}

// secondDriverPatches is the overlay deploy/sidecar/README.md gives a second
// driver deployed from the kustomize manifests (TestKustomizeSecondDriver
// checks the README still says it).
const secondDriverPatches = `patches:
  - target: {kind: ClusterRole, name: external-provisioner-runner}
    patch: '[{"op": "replace", "path": "/metadata/name", "value": "acme-external-provisioner-runner"}]'
  - target: {kind: ClusterRoleBinding, name: csi-provisioner-role}
    patch: '[{"op": "replace", "path": "/metadata/name", "value": "acme-csi-provisioner-role"}]'
`

// TestTwoReleasesNoClusterScopedClash: two storage vendors install the
// chart for two drivers, each in its own namespace, both with the README's
// command (`helm install csi-provisioner deploy/sidecar/chart --namespace
// X`). Helm allows one release name in two namespaces; the releases'
// cluster-scoped objects must not share a name, or the second install
// fails ("exists and cannot be imported into the current release").
func TestTwoReleasesNoClusterScopedClash(t *testing.T) {
	a := mustHelmTemplate(t, "csi-provisioner", "vendor-a",
		"--set", "csiDriver.name=a.csi.example.com", "--set", "storageClasses[0].name=class-a")
	b := mustHelmTemplate(t, "csi-provisioner", "vendor-b",
		"--set", "csiDriver.name=b.csi.example.com", "--set", "storageClasses[0].name=class-b")
	seen := map[string]bool{}
	for _, o := range a {
		if clusterScoped[o.GetKind()] {
			seen[o.ID()] = true
		}
	}
	for _, o := range b {
		if clusterScoped[o.GetKind()] && seen[o.ID()] {
			t.Errorf("%s is rendered by both releases (namespaces vendor-a and vendor-b): the second helm install fails", o.ID())
		}
	}
}

// TestKustomizeSecondDriver: the kustomize manifests deployed for two
// drivers, the second with the README's overlay. Their cluster-wide RBAC
// objects must not share a name: the second `kubectl apply -k` would move
// the ClusterRoleBinding's subject to its own ServiceAccount, and the first
// driver's sidecar would lose every cluster-wide permission. The renamed
// binding must still grant the renamed ClusterRole.
func TestKustomizeSecondDriver(t *testing.T) {
	readme, err := os.ReadFile(repoPath(t, "deploy/sidecar/README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), "```yaml\n"+secondDriverPatches+"```") {
		t.Errorf("deploy/sidecar/README.md no longer gives a second driver the overlay this test builds:\n%s", secondDriverPatches)
	}
	a, b := kustomizeBuild(t, "vendor-a"), kustomizeBuildWith(t, "vendor-b", secondDriverPatches)
	names := map[string]bool{}
	for _, o := range a {
		if o.GetKind() == "ClusterRole" || o.GetKind() == "ClusterRoleBinding" {
			names[o.ID()] = true
		}
	}
	for _, o := range b {
		if (o.GetKind() == "ClusterRole" || o.GetKind() == "ClusterRoleBinding") && names[o.ID()] {
			t.Errorf("%s is rendered for both drivers: the second kubectl apply replaces the first's", o.ID())
		}
	}
	binding := b.one(t, "ClusterRoleBinding")
	if ref, _, _ := unstructured.NestedString(binding.Object, "roleRef", "name"); ref != "acme-external-provisioner-runner" {
		t.Errorf("the second driver's ClusterRoleBinding grants %q, want its renamed ClusterRole acme-external-provisioner-runner", ref)
	}
}

// TestLongReleaseNameNamesValid: every name the chart renders must be
// valid for its kind with any release name Helm accepts (up to 53
// characters, dots and a leading digit allowed). A Service name is a
// DNS-1035 label (at most 63 characters, no dots, a letter first); the
// other kinds' names are DNS-1123 subdomains.
func TestLongReleaseNameNamesValid(t *testing.T) {
	for _, release := range []string{
		"acme-block-storage-controller-production",             // 40 characters
		"acme-enterprise-block-storage-driver-prod-eu-west-1a", // 52
		"acme.block-storage",                                   // Helm allows dots
		"1st-driver",                                           // and a digit first
	} {
		for _, values := range [][]string{
			nil,
			{"--set", "nodeDeployment.enabled=true", "--set", "metrics.serviceMonitor.enabled=true"},
		} {
			m, err := helmTemplate(t, release, "default", values...)
			if err != nil {
				t.Fatal(err)
			}
			for _, o := range m {
				valid := validation.IsDNS1123Subdomain
				if o.GetKind() == "Service" {
					valid = validation.IsDNS1035Label
				}
				if errs := valid(o.GetName()); len(errs) > 0 {
					t.Errorf("release %q (%d characters), values %q: %s name %q is invalid: %s", release, len(release), values, o.GetKind(), o.GetName(), strings.Join(errs, "; "))
				}
			}
		}
	}
}

// TestAcceptedValuesStartSidecar: values that values.schema.json and the
// templates accept must render a sidecar whose flags pass its own
// validation; otherwise `helm install` succeeds and the pod crash-loops
// with exit status 2 (bad flags). The chart refuses such values instead.
// Rendered args (with $(VAR) expanded as the kubelet does) are run through
// the real binary with no cluster: status 2 is a flag error, status 1 the
// missing in-cluster configuration (flags fine).
func TestAcceptedValuesStartSidecar(t *testing.T) {
	bins, err := e2e.Build(t.Context(), "")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		values  []string
		refused string // what helm template's error says, "" if accepted
	}{
		{name: "valid timings", values: []string{"--set", "sidecar.leaderElection.leaseDuration=1m30s", "--set", "sidecar.leaderElection.renewDeadline=1m", "--set", "sidecar.leaderElection.retryPeriod=500ms", "--set", "sidecar.binder.resyncPeriod=1h", "--set", "sidecar.capacity.enabled=true", "--set", "sidecar.capacity.pollInterval=30s"}},
		{name: "shorter lease only", values: []string{"--set", "sidecar.leaderElection.leaseDuration=10s"}, refused: "sidecar.leaderElection needs leaseDuration (10s) > renewDeadline (10s) > 1.2 x retryPeriod (5s) > 0"},
		{name: "longer retry period only", values: []string{"--set", "sidecar.leaderElection.retryPeriod=10s"}, refused: "sidecar.leaderElection needs"},
		{name: "longer renew deadline only", values: []string{"--set", "sidecar.leaderElection.renewDeadline=20s"}, refused: "sidecar.leaderElection needs"},
		{name: "zero lease", values: []string{"--set", "sidecar.leaderElection.leaseDuration=0s"}, refused: "sidecar.leaderElection needs"},
		{name: "zero binder resync", values: []string{"--set", "sidecar.binder.resyncPeriod=0s"}, refused: "sidecar.binder.resyncPeriod must be positive, got 0s"},
		{name: "zero capacity poll", values: []string{"--set", "sidecar.capacity.enabled=true", "--set", "sidecar.capacity.pollInterval=0s"}, refused: "sidecar.capacity.pollInterval must be positive, got 0s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := helmTemplate(t, "csi", "default", tc.values...)
			switch {
			case tc.refused != "" && (err == nil || !strings.Contains(err.Error(), tc.refused)):
				t.Errorf("helm template = %v, want it refused with %q", err, tc.refused)
			case tc.refused == "" && err != nil:
				t.Fatalf("valid values refused: %v", err)
			}
			if err != nil {
				return
			}
			d := typed[appsv1.Deployment](t, m.one(t, "Deployment"))
			sc := container(t, d, sidecarName)
			env := map[string]string{"ADDRESS": "/csi/csi.sock", "NAMESPACE": "default", "POD_NAME": "csi-0", "POD_NAMESPACE": "default"}
			args := make([]string, len(sc.Args))
			for i, a := range sc.Args {
				args[i] = os.Expand(strings.ReplaceAll(strings.ReplaceAll(a, "$(", "${"), ")", "}"), func(k string) string { return env[k] })
			}
			cmd := exec.CommandContext(t.Context(), bins.Sidecar, args...)
			cmd.Env = []string{"HOME=" + t.TempDir()}
			for k, v := range env {
				cmd.Env = append(cmd.Env, k+"="+v)
			}
			out, err := cmd.CombinedOutput()
			if exit := (*exec.ExitError)(nil); errors.As(err, &exit) && exit.ExitCode() == 2 {
				first, _, _ := strings.Cut(string(out), "\n")
				t.Errorf("helm accepts %q, but the sidecar exits with status 2 on the rendered args: %s", tc.values, first)
			}
		})
	}
}
