package chart

import (
	"reflect"
	"slices"
	"sort"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// TestKustomize checks deploy/sidecar/kubernetes: upstream's object names,
// the same RBAC rules as the chart, images at the chart's appVersion, and
// the pod the chart renders by default.
func TestKustomize(t *testing.T) {
	m := kustomizeBuild(t, "")
	if unknown := strictDecodeAll(t, m); len(unknown) > 0 {
		t.Errorf("unexpected kinds: %v", unknown)
	}
	want := []string{
		"CSIDriver hostpath.csi.kube-storage.io",
		"ClusterRole external-provisioner-runner",
		"ClusterRoleBinding csi-provisioner-role",
		"Deployment default/csi-provisioner",
		"Role default/external-provisioner-cfg",
		"RoleBinding default/csi-provisioner-role-cfg",
		"ServiceAccount default/csi-provisioner",
		"StorageClass csi-hostpath",
	}
	got := m.ids()
	sort.Strings(got)
	if !slices.Equal(got, want) {
		t.Errorf("objects:\n got  %q\n want %q", got, want)
	}
	checkRules(t, "kustomize ClusterRole", typed[rbacv1.ClusterRole](t, m.one(t, "ClusterRole")).Rules, wantClusterRules)
	checkRules(t, "kustomize Role", typed[rbacv1.Role](t, m.one(t, "Role")).Rules, wantLeaseRules)
	for _, kind := range []string{"ClusterRoleBinding", "RoleBinding"} {
		s, _, _ := unstructured.NestedSlice(m.one(t, kind).Object, "subjects")
		if want := []any{map[string]any{"kind": "ServiceAccount", "name": "csi-provisioner", "namespace": "default"}}; !reflect.DeepEqual(s, want) {
			t.Errorf("%s subjects = %v", kind, s)
		}
	}

	d := typed[appsv1.Deployment](t, m.one(t, "Deployment"))
	appVersion := chartMeta(t).AppVersion
	sc := container(t, d, sidecarName)
	drv := container(t, d, "hostpath-driver")
	if sc.Image != "ghcr.io/kube-storage/csi-provisioner:"+appVersion || drv.Image != "ghcr.io/kube-storage/hostpath-driver:"+appVersion {
		t.Errorf("images %s and %s, want tag %s (the chart's appVersion)", sc.Image, drv.Image, appVersion)
	}
	if want := []string{"--csi-address=$(ADDRESS)", "--v=2", "--leader-election", "--feature-gates=ReleaseLeaderElectionOnExit=true", "--http-endpoint=:8080", "--timeout=60s"}; !slices.Equal(sc.Args, want) {
		t.Errorf("sidecar args %q, want %q", sc.Args, want)
	}
	checkProbes(t, sc, 8080, true)
	checkHardened(t, sc)
	checkHardened(t, drv)
	addr, _ := envValue(sc, "ADDRESS")
	if addr.Value != "/csi/csi.sock" || mountPath(sc, socketDirVolume) != "/csi" || mountPath(drv, socketDirVolume) != "/csi" ||
		!slices.Contains(drv.Args, "--endpoint=unix:///csi/csi.sock") {
		t.Errorf("socket: ADDRESS %q, mounts %q %q, driver args %q", addr.Value, mountPath(sc, socketDirVolume), mountPath(drv, socketDirVolume), drv.Args)
	}
	if e, ok := envValue(sc, "POD_NAMESPACE"); !ok || e.ValueFrom == nil || e.ValueFrom.FieldRef.FieldPath != "metadata.namespace" {
		t.Errorf("POD_NAMESPACE = %+v", e)
	}
	checkMemoryLimitEnv(t, sc)
	if !slices.Contains(drv.Args, "--drivername=hostpath.csi.kube-storage.io") || !slices.Contains(drv.Args, "--backend=dir") ||
		mountPath(drv, "hostpath-data") != "/var/lib/csi-hostpath" {
		t.Errorf("driver args %q, mounts %+v", drv.Args, drv.VolumeMounts)
	}
	if d.Spec.Template.Spec.ServiceAccountName != "csi-provisioner" {
		t.Errorf("pod ServiceAccount = %q", d.Spec.Template.Spec.ServiceAccountName)
	}

	// The chart's default pod is the same pod, up to names, labels and the
	// chart's explicit defaults.
	chart := typed[appsv1.Deployment](t, mustHelmTemplate(t, "csi", "default").one(t, "Deployment"))
	kc, cc := d.Spec.Template.Spec, chart.Spec.Template.Spec
	if !reflect.DeepEqual(kc.SecurityContext, cc.SecurityContext) {
		t.Errorf("pod securityContext: kustomize %+v, chart %+v", kc.SecurityContext, cc.SecurityContext)
	}
	for i := range kc.Containers {
		k, c := kc.Containers[i], cc.Containers[i]
		if k.Name != c.Name || !reflect.DeepEqual(k.SecurityContext, c.SecurityContext) || !reflect.DeepEqual(k.Resources, c.Resources) ||
			!reflect.DeepEqual(k.LivenessProbe, c.LivenessProbe) || !reflect.DeepEqual(k.ReadinessProbe, c.ReadinessProbe) {
			t.Errorf("container %d differs between kustomize and the chart:\n kustomize %+v\n chart     %+v", i, k, c)
		}
	}

	// The namespace overlay the kustomization's comment describes moves the
	// bindings' subjects too.
	moved := kustomizeBuild(t, "storage")
	for _, kind := range []string{"ClusterRoleBinding", "RoleBinding"} {
		s, _, _ := unstructured.NestedSlice(moved.one(t, kind).Object, "subjects")
		if ns := s[0].(map[string]any)["namespace"]; ns != "storage" {
			t.Errorf("%s subject namespace %v after the overlay, want storage", kind, ns)
		}
	}
}
