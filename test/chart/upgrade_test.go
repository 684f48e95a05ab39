package chart

import (
	"os/exec"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/kube-storage/csi-provisioner/internal/controlplane"
)

// installRelease installs the chart as release csi-provisioner in a new
// namespace on cp, with its own driver and class names and the extra
// arguments of install, and returns the namespace and a function that runs
// `helm upgrade` with the same names and the given --set pairs.
func installRelease(t *testing.T, cp *controlplane.ControlPlane, prefix string, install ...string) (string, func(set ...string) ([]byte, error)) {
	t.Helper()
	helm := tool(t, "helm", "HELM")
	ns := createNamespace(t, cp, prefix)
	kubeconfig := []string{"--namespace", ns, "--kubeconfig", cp.KubeconfigPath}
	names := []string{"--set", "csiDriver.name=" + ns + ".csi.example.com", "--set", "storageClasses[0].name=class-" + ns}
	if _, err := run(t, helm, slices.Concat([]string{"install", "csi-provisioner", chartDir}, names, install, kubeconfig)...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = exec.Command(helm, append([]string{"uninstall", "csi-provisioner"}, kubeconfig...)...).Run()
	})
	return ns, func(set ...string) ([]byte, error) {
		args := slices.Concat([]string{"upgrade", "csi-provisioner", chartDir}, names)
		for _, s := range set {
			args = append(args, "--set", s)
		}
		return run(t, helm, append(args, kubeconfig...)...)
	}
}

func sidecarDeployment(t *testing.T, cp *controlplane.ControlPlane, ns string) *appsv1.Deployment {
	t.Helper()
	d, err := cp.Client().AppsV1().Deployments(ns).Get(t.Context(), "csi-provisioner", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestHelmUpgradeTurnsLeaderElectionOn: the Deployment controller rolls out
// an upgrade with the strategy the upgrade itself sets. Turning leader
// election on must not surge: a new pod would lead at once (the Lease is
// free) next to the old pod, which has no leader election, and both would
// provision and bind until the old one went.
func TestHelmUpgradeTurnsLeaderElectionOn(t *testing.T) {
	cp := controlplane.Need(t, shared)
	ns, upgrade := installRelease(t, cp, "le-on", "--set", "sidecar.leaderElection.enabled=false")
	if args := sidecarDeployment(t, cp, ns).Spec.Template.Spec.Containers[0].Args; !slices.Contains(args, "--leader-election=false") {
		t.Fatalf("installed sidecar args %v, want --leader-election=false", args)
	}
	if _, err := upgrade("sidecar.leaderElection.enabled=true"); err != nil {
		t.Fatal(err)
	}
	d := sidecarDeployment(t, cp, ns)
	s := d.Spec.Strategy
	if s.Type == appsv1.RecreateDeploymentStrategyType {
		return
	}
	if s.RollingUpdate == nil || s.RollingUpdate.MaxSurge == nil {
		t.Fatalf("strategy %+v without maxSurge", s)
	}
	// The Deployment controller rounds a percentage of surge up.
	surge, err := intstr.GetScaledValueFromIntOrPercent(s.RollingUpdate.MaxSurge, int(*d.Spec.Replicas), true)
	if err != nil {
		t.Fatal(err)
	}
	if surge != 0 {
		t.Errorf("the upgrade that turns leader election on is rolled out with maxSurge %s (%d pods): a surge pod leads next to the old pod without leader election", s.RollingUpdate.MaxSurge.String(), surge)
	}
}

// TestHelmUpgradeStorageClassChangeRefused: Kubernetes refuses a change of
// an existing StorageClass's parameters, reclaimPolicy, volumeBindingMode
// or provisioner. Helm then fails with "field is immutable" after it has
// applied the rest of the upgrade. The chart refuses such an upgrade while
// rendering, before anything changes, and says what to do.
func TestHelmUpgradeStorageClassChangeRefused(t *testing.T) {
	cp := controlplane.Need(t, shared)
	ns, upgrade := installRelease(t, cp, "sc-change")
	for _, tc := range []struct {
		set   string
		field string
	}{
		{"storageClasses[0].parameters.type=ssd", "parameters"},
		{"storageClasses[0].reclaimPolicy=Retain", "reclaimPolicy"},
		{"storageClasses[0].volumeBindingMode=Immediate", "volumeBindingMode"},
	} {
		out, err := upgrade(tc.set, "sidecar.logLevel=5")
		if err == nil {
			t.Errorf("upgrade with %s succeeded on an existing class", tc.set)
			continue
		}
		msg := string(out) + err.Error()
		if !strings.Contains(msg, tc.field) || !strings.Contains(msg, "kubectl delete storageclass class-"+ns) {
			t.Errorf("upgrade with %s: %s; want it to name %s and say to delete the class first", tc.set, msg, tc.field)
		}
		if args := sidecarDeployment(t, cp, ns).Spec.Template.Spec.Containers[0].Args; slices.Contains(args, "--v=5") {
			t.Errorf("the refused upgrade with %s still changed the Deployment (--v=5)", tc.set)
		}
	}
	// Values that keep the class as it is upgrade as before.
	if _, err := upgrade("sidecar.logLevel=5"); err != nil {
		t.Errorf("upgrade that keeps the class: %v", err)
	}
}
