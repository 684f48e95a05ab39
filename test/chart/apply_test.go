package chart

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"

	"github.com/kube-storage/csi-provisioner/internal/controlplane"
	"github.com/kube-storage/csi-provisioner/internal/testutil"
)

// fieldManager is the server-side apply manager of these tests.
const fieldManager = "csi-provisioner-chart-test"

// applier applies rendered objects with server-side apply.
type applier struct {
	dyn    dynamic.Interface
	mapper *restmapper.DeferredDiscoveryRESTMapper
}

func newApplier(t *testing.T, cp *controlplane.ControlPlane) *applier {
	t.Helper()
	cfg := cp.AdminConfig()
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	disc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &applier{dyn: dyn, mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disc))}
}

func (a *applier) resource(o object) (dynamic.ResourceInterface, error) {
	gvk := o.GroupVersionKind()
	mapping, err := a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", o.ID(), err)
	}
	if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
		return a.dyn.Resource(mapping.Resource).Namespace(o.GetNamespace()), nil
	}
	return a.dyn.Resource(mapping.Resource), nil
}

// apply server-side applies o with strict field validation; dryRun only
// runs admission and validation.
func (a *applier) apply(ctx context.Context, o object, dryRun bool) error {
	r, err := a.resource(o)
	if err != nil {
		return err
	}
	opts := metav1.PatchOptions{FieldManager: fieldManager, Force: new(true), FieldValidation: "Strict"}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	if _, err := r.Patch(ctx, o.GetName(), types.ApplyPatchType, o.JSON, opts); err != nil {
		return fmt.Errorf("apply %s (dry run %v): %w", o.ID(), dryRun, err)
	}
	return nil
}

// applyAll dry-runs every object, then applies every object, failing the
// test on the first error; cleanup deletes them again, so that the next
// render's cluster-scoped objects (the CSIDriver, the classes) start fresh.
func (a *applier) applyAll(t *testing.T, m manifest) {
	t.Helper()
	t.Cleanup(func() {
		for _, o := range m {
			if r, err := a.resource(o); err == nil {
				err = r.Delete(context.Background(), o.GetName(), metav1.DeleteOptions{})
				if err != nil && !apierrors.IsNotFound(err) {
					t.Errorf("delete %s: %v", o.ID(), err)
				}
			}
		}
	})
	for _, dryRun := range []bool{true, false} {
		for _, o := range m {
			if err := a.apply(t.Context(), o, dryRun); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, o := range m {
		r, err := a.resource(o)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := r.Get(t.Context(), o.GetName(), metav1.GetOptions{}); err != nil {
			t.Fatalf("get %s after apply: %v", o.ID(), err)
		}
	}
	t.Logf("applied %d objects: %v", len(m), m.ids())
}

// serviceMonitorCRD is a minimal CustomResourceDefinition for the
// Prometheus Operator's ServiceMonitor: the real group, version, kind and
// scope, with the spec left unchecked. It lets the all-options render,
// which has a ServiceMonitor, be applied like everything else.
var serviceMonitorCRD = map[string]any{
	"apiVersion": "apiextensions.k8s.io/v1",
	"kind":       "CustomResourceDefinition",
	"metadata":   map[string]any{"name": "servicemonitors.monitoring.coreos.com"},
	"spec": map[string]any{
		"group": "monitoring.coreos.com",
		"scope": "Namespaced",
		"names": map[string]any{"kind": "ServiceMonitor", "listKind": "ServiceMonitorList", "plural": "servicemonitors", "singular": "servicemonitor"},
		"versions": []any{map[string]any{
			"name": "v1", "served": true, "storage": true,
			"schema": map[string]any{"openAPIV3Schema": map[string]any{
				"type": "object",
				"properties": map[string]any{
					"spec": map[string]any{"type": "object", "x-kubernetes-preserve-unknown-fields": true},
				},
			}},
		}},
	},
}

// installServiceMonitorCRD creates the CRD once, waits until it is
// established and resets the REST mapper so it knows the new kind.
func (a *applier) installServiceMonitorCRD(t *testing.T) {
	t.Helper()
	crds := a.dyn.Resource(schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"})
	crd := &unstructured.Unstructured{Object: serviceMonitorCRD}
	if _, err := crds.Create(t.Context(), crd, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	testutil.Eventually(t, 0, "ServiceMonitor CRD not established", func(ctx context.Context) (bool, error) {
		got, err := crds.Get(ctx, crd.GetName(), metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
		for _, c := range conds {
			if c, ok := c.(map[string]any); ok && c["type"] == "Established" && c["status"] == "True" {
				return true, nil
			}
		}
		return false, nil
	})
	testutil.Eventually(t, 0, "ServiceMonitor not discoverable", func(context.Context) (bool, error) {
		a.mapper.Reset()
		_, err := a.mapper.RESTMapping(schema.GroupKind{Group: "monitoring.coreos.com", Kind: "ServiceMonitor"}, "v1")
		return err == nil, nil
	})
}

func createNamespace(t *testing.T, cp *controlplane.ControlPlane, prefix string) string {
	t.Helper()
	ns, err := cp.Client().CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{GenerateName: prefix + "-"},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return ns.Name
}

// TestApply applies the kustomize manifests and the chart, with its default
// values and with ci/all-options-values.yaml, each into a namespace of its
// own: a server-side dry run of every object first, then for real. Every
// object must be accepted under strict field validation.
func TestApply(t *testing.T) {
	cp := controlplane.Need(t, shared)
	tool(t, "helm", "HELM")
	tool(t, "kustomize", "KUSTOMIZE")
	a := newApplier(t, cp)
	a.installServiceMonitorCRD(t)
	for _, tc := range []struct {
		name   string
		render func(t *testing.T, ns string) manifest
	}{
		{"kustomize", func(t *testing.T, ns string) manifest { return kustomizeBuild(t, ns) }},
		{"chart defaults", func(t *testing.T, ns string) manifest { return mustHelmTemplate(t, "apply-defaults", ns) }},
		{"chart all options", func(t *testing.T, ns string) manifest {
			return mustHelmTemplate(t, "apply-all", ns, "-f", allOptionsFile)
		}},
		{"chart node deployment", func(t *testing.T, ns string) manifest {
			return mustHelmTemplate(t, "apply-node", ns, "--set", "nodeDeployment.enabled=true", "--set", "sidecar.capacity.enabled=true",
				"--set", "csiDriver.name=node.apply.csi.kube-storage.io")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := createNamespace(t, cp, "apply")
			m := tc.render(t, ns)
			if len(m) == 0 {
				t.Fatal("nothing rendered")
			}
			start := time.Now()
			a.applyAll(t, m)
			t.Logf("%s applied in %v", tc.name, time.Since(start).Round(time.Millisecond))
		})
	}
}

// TestHelmInstall installs the chart with helm itself, as the README says
// (default values, all options, node deployment), checks the release and
// that its notes name the workload the chart rendered, and uninstalls it.
func TestHelmInstall(t *testing.T) {
	cp := controlplane.Need(t, shared)
	helm := tool(t, "helm", "HELM")
	newApplier(t, cp).installServiceMonitorCRD(t)
	for _, tc := range []struct {
		name, release string
		args          []string
		// kind is the workload the notes' commands must name.
		kind string
		// notWant is what the notes must not say.
		notWant []string
	}{
		{"defaults", "csi-provisioner", nil, "deployment", nil},
		{"all options", "vendor", []string{"-f", allOptionsFile}, "deployment", nil},
		{"node deployment", "node", []string{"--set", "nodeDeployment.enabled=true", "--set", "csiDriver.name=node.helm.csi.kube-storage.io"},
			"daemonset", []string{"deployment/", "one leads", "replica(s)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := createNamespace(t, cp, "helm")
			kubeconfig := []string{"--namespace", ns, "--kubeconfig", cp.KubeconfigPath}
			out, err := run(t, helm, append(append([]string{"install", tc.release, chartDir}, kubeconfig...), tc.args...)...)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				cmd := exec.Command(helm, append([]string{"uninstall", tc.release}, kubeconfig...)...)
				if b, err := cmd.CombinedOutput(); err != nil {
					t.Errorf("helm uninstall: %v\n%s", err, b)
				}
			})
			for _, want := range []string{"STATUS: deployed", "kubectl -n " + ns + " rollout status " + tc.kind + "/", "kubectl -n " + ns + " logs " + tc.kind + "/", "kubectl describe pvc test-claim"} {
				if !strings.Contains(string(out), want) {
					t.Errorf("helm install output lacks %q:\n%s", want, out)
				}
			}
			for _, bad := range tc.notWant {
				if strings.Contains(string(out), bad) {
					t.Errorf("helm install output has %q:\n%s", bad, out)
				}
			}
			deploys, err := cp.Client().AppsV1().Deployments(ns).List(t.Context(), metav1.ListOptions{})
			daemonSets, dsErr := cp.Client().AppsV1().DaemonSets(ns).List(t.Context(), metav1.ListOptions{})
			if want := map[string]int{"deployment": 1, "daemonset": 0}[tc.kind]; err != nil || len(deploys.Items) != want {
				t.Errorf("Deployments in %s after helm install: %v, %v; want %d", ns, deploys, err, want)
			}
			if want := map[string]int{"deployment": 0, "daemonset": 1}[tc.kind]; dsErr != nil || len(daemonSets.Items) != want {
				t.Errorf("DaemonSets in %s after helm install: %v, %v; want %d", ns, daemonSets, dsErr, want)
			}
		})
	}
}
