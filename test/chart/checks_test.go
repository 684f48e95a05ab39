package chart

import (
	"fmt"
	"os"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

// rule builds a PolicyRule for one API group and one resource.
func rule(group, resource string, verbs ...string) rbacv1.PolicyRule {
	return rbacv1.PolicyRule{APIGroups: []string{group}, Resources: []string{resource}, Verbs: verbs}
}

// wantClusterRules are exactly the sidecar's cluster-wide permissions; each
// rule's user is documented in deploy/sidecar/kubernetes/rbac.yaml.
// rbac_test.go shows that the sidecar works with them and fails without
// some of them.
var wantClusterRules = []rbacv1.PolicyRule{
	rule("", "persistentvolumes", "get", "list", "watch", "create", "update", "patch", "delete"),
	rule("", "persistentvolumes/status", "update"),
	rule("", "persistentvolumeclaims", "get", "list", "watch", "update"),
	rule("", "persistentvolumeclaims/status", "update"),
	rule("storage.k8s.io", "storageclasses", "get", "list", "watch"),
	rule("", "events", "list", "watch", "create", "update", "patch"),
	rule("storage.k8s.io", "csinodes", "get", "list", "watch"),
	rule("", "nodes", "get", "list", "watch"),
	rule("storage.k8s.io", "volumeattachments", "get", "list", "watch"),
	rule("storage.k8s.io", "volumeattributesclasses", "get"),
	rule("", "secrets", "get"),
	rule("", "pods", "list", "watch"),
	rule("snapshot.storage.k8s.io", "volumesnapshots", "get", "list", "watch", "update"),
	rule("snapshot.storage.k8s.io", "volumesnapshotcontents", "get"),
}

// wantBinderOffClusterRules are wantClusterRules without the binder's
// permissions (update of PVs, of their status and of claims' status; pods),
// as the chart renders them with the binder off or in node deployment.
var wantBinderOffClusterRules = []rbacv1.PolicyRule{
	rule("", "persistentvolumes", "get", "list", "watch", "create", "patch", "delete"),
	rule("", "persistentvolumeclaims", "get", "list", "watch", "update"),
	rule("storage.k8s.io", "storageclasses", "get", "list", "watch"),
	rule("", "events", "list", "watch", "create", "update", "patch"),
	rule("storage.k8s.io", "csinodes", "get", "list", "watch"),
	rule("", "nodes", "get", "list", "watch"),
	rule("storage.k8s.io", "volumeattachments", "get", "list", "watch"),
	rule("storage.k8s.io", "volumeattributesclasses", "get"),
	rule("", "secrets", "get"),
	rule("snapshot.storage.k8s.io", "volumesnapshots", "get", "list", "watch", "update"),
	rule("snapshot.storage.k8s.io", "volumesnapshotcontents", "get"),
}

// wantLeaseRules are the namespaced permissions: leader election's Lease.
var wantLeaseRules = []rbacv1.PolicyRule{
	rule("coordination.k8s.io", "leases", "get", "watch", "list", "update", "create"),
}

// wantCapacityRules are the namespaced permissions that sidecar.capacity
// adds: the CSIStorageCapacity objects, and the pod and ReplicaSet read to
// find their owner.
var wantCapacityRules = []rbacv1.PolicyRule{
	rule("storage.k8s.io", "csistoragecapacities", "list", "watch", "create", "update", "delete"),
	rule("", "pods", "get"),
	rule("apps", "replicasets", "get"),
}

// wantReferenceGrantRule is the cluster-wide permission that
// sidecar.crossNamespaceDataSource adds.
var wantReferenceGrantRule = rule("gateway.networking.k8s.io", "referencegrants", "get", "list", "watch")

// normRules renders rules as sorted "group/resource: verbs" lines, so two
// rule lists compare equal when they grant the same verbs on the same
// resources, whatever the order.
func normRules(rules []rbacv1.PolicyRule) []string {
	var out []string
	for _, r := range rules {
		verbs := slices.Clone(r.Verbs)
		sort.Strings(verbs)
		out = append(out, fmt.Sprintf("%v/%v names=%v urls=%v: %s",
			r.APIGroups, r.Resources, r.ResourceNames, r.NonResourceURLs, strings.Join(verbs, ",")))
	}
	sort.Strings(out)
	return out
}

func checkRules(t *testing.T, what string, got, want []rbacv1.PolicyRule) {
	t.Helper()
	g, w := normRules(got), normRules(want)
	if !slices.Equal(g, w) {
		t.Errorf("%s rules:\n got  %s\n want %s", what, strings.Join(g, "\n      "), strings.Join(w, "\n      "))
	}
}

func container(t *testing.T, d *appsv1.Deployment, name string) corev1.Container {
	t.Helper()
	for _, c := range d.Spec.Template.Spec.Containers {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("Deployment %s has no container %q", d.Name, name)
	return corev1.Container{}
}

// flagCount counts the args that set flag (-flag or --flag, with =value or
// alone, or for a one-letter flag -v5).
func flagCount(args []string, flag string) int {
	n := 0
	for _, a := range args {
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		attached := len(flag) == 1 && strings.HasPrefix(a, "-"+flag) && strings.Trim(a[2:], "0123456789") == "" && len(a) > 2
		if strings.HasPrefix(a, "-") && (name == flag || attached) {
			n++
		}
	}
	return n
}

func envValue(c corev1.Container, name string) (corev1.EnvVar, bool) {
	for _, e := range c.Env {
		if e.Name == name {
			return e, true
		}
	}
	return corev1.EnvVar{}, false
}

// checkMemoryLimitEnv checks that the sidecar's GOMEMLIMIT is taken from its
// own container's memory limit, and set once.
func checkMemoryLimitEnv(t *testing.T, sc corev1.Container) {
	t.Helper()
	n := 0
	for _, e := range sc.Env {
		if e.Name == "GOMEMLIMIT" {
			n++
		}
	}
	e, _ := envValue(sc, "GOMEMLIMIT")
	if n != 1 || e.ValueFrom == nil || e.ValueFrom.ResourceFieldRef == nil ||
		e.ValueFrom.ResourceFieldRef.ContainerName != sc.Name || e.ValueFrom.ResourceFieldRef.Resource != "limits.memory" {
		t.Errorf("GOMEMLIMIT set %d times, first %+v; want once, from the container's limits.memory", n, e)
	}
}

func mountPath(c corev1.Container, volume string) string {
	for _, m := range c.VolumeMounts {
		if m.Name == volume {
			return m.MountPath
		}
	}
	return ""
}

// checkHardened checks the container security context every container of
// the chart and the manifests has by default: a read-only root, no
// privilege escalation, no capabilities, the runtime's seccomp profile.
func checkHardened(t *testing.T, c corev1.Container) {
	t.Helper()
	sc := c.SecurityContext
	switch {
	case sc == nil:
		t.Errorf("container %s has no securityContext", c.Name)
	case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
		t.Errorf("container %s: readOnlyRootFilesystem is not true", c.Name)
	case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
		t.Errorf("container %s: allowPrivilegeEscalation is not false", c.Name)
	case sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) != 0:
		t.Errorf("container %s: capabilities = %+v, want drop [ALL]", c.Name, sc.Capabilities)
	case sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault:
		t.Errorf("container %s: seccompProfile = %+v, want RuntimeDefault", c.Name, sc.SeccompProfile)
	case sc.Privileged != nil && *sc.Privileged:
		t.Errorf("container %s is privileged", c.Name)
	}
}

// checkProbes checks the sidecar's probes: liveness on
// /healthz/leader-election (when leader election is on) and readiness on
// /readyz, both on the named port of --http-endpoint.
func checkProbes(t *testing.T, c corev1.Container, port int32, liveness bool) {
	t.Helper()
	if len(c.Ports) != 1 || c.Ports[0].Name != "http-endpoint" || c.Ports[0].ContainerPort != port {
		t.Errorf("sidecar ports = %+v, want http-endpoint %d", c.Ports, port)
	}
	named := intstr.FromString("http-endpoint")
	check := func(what string, p *corev1.Probe, path string) {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != path || p.HTTPGet.Port != named {
			t.Errorf("%s probe = %+v, want GET %s on port http-endpoint", what, p, path)
		}
	}
	if liveness {
		check("liveness", c.LivenessProbe, "/healthz/leader-election")
	} else if c.LivenessProbe != nil {
		t.Errorf("liveness probe without leader election: %+v", c.LivenessProbe)
	}
	check("readiness", c.ReadinessProbe, "/readyz")
}

// checkCommon checks what holds for every render of the chart: namespaces,
// standard labels, the pod's identity and the socket shared by the two
// containers.
func checkCommon(t *testing.T, m manifest, release, ns string) {
	t.Helper()
	if unknown := strictDecodeAll(t, m); len(unknown) > 0 && !slices.Equal(unknown, []string{"monitoring.coreos.com/v1, Kind=ServiceMonitor"}) {
		t.Errorf("unexpected kinds: %v", unknown)
	}
	for _, o := range m {
		switch o.GetKind() {
		case "ClusterRole", "ClusterRoleBinding", "CSIDriver", "StorageClass":
			if o.GetNamespace() != "" {
				t.Errorf("%s: cluster-scoped object with a namespace", o.ID())
			}
		default:
			if o.GetNamespace() != ns {
				t.Errorf("%s: namespace %q, want the release's %q", o.ID(), o.GetNamespace(), ns)
			}
		}
		l := o.GetLabels()
		for k, want := range map[string]string{
			"app.kubernetes.io/name":       "csi-provisioner",
			"app.kubernetes.io/instance":   release,
			"app.kubernetes.io/managed-by": "Helm",
			"helm.sh/chart":                "csi-provisioner-" + chartMeta(t).Version,
			"app.kubernetes.io/version":    chartMeta(t).AppVersion,
		} {
			if l[k] != want {
				t.Errorf("%s: label %s = %q, want %q", o.ID(), k, l[k], want)
			}
		}
	}
	d := typed[appsv1.Deployment](t, m.one(t, "Deployment"))
	pod := d.Spec.Template
	for k, v := range d.Spec.Selector.MatchLabels {
		if pod.Labels[k] != v {
			t.Errorf("pod label %s = %q, want the selector's %q", k, pod.Labels[k], v)
		}
	}
	if len(pod.Spec.Containers) != 2 {
		t.Fatalf("containers = %d, want the sidecar and the driver", len(pod.Spec.Containers))
	}
	sc := container(t, d, sidecarName)
	drv := pod.Spec.Containers[1]
	addr, _ := envValue(sc, "ADDRESS")
	endpoint, _ := envValue(drv, "CSI_ENDPOINT")
	if endpoint.Value != "unix://"+addr.Value || !strings.HasPrefix(addr.Value, mountPath(sc, socketDirVolume)+"/") ||
		mountPath(sc, socketDirVolume) != mountPath(drv, socketDirVolume) {
		t.Errorf("socket: sidecar ADDRESS %q, driver CSI_ENDPOINT %q, mounts %q and %q", addr.Value, endpoint.Value,
			mountPath(sc, socketDirVolume), mountPath(drv, socketDirVolume))
	}
	if ns, ok := envValue(sc, "POD_NAMESPACE"); !ok || ns.ValueFrom == nil || ns.ValueFrom.FieldRef == nil || ns.ValueFrom.FieldRef.FieldPath != "metadata.namespace" {
		t.Errorf("sidecar POD_NAMESPACE = %+v, want the pod's namespace", ns)
	}
	if flagCount(sc.Args, "csi-address") != 1 || !slices.Contains(sc.Args, "--csi-address=$(ADDRESS)") {
		t.Errorf("sidecar args %q lack --csi-address=$(ADDRESS)", sc.Args)
	}
	if sas := m.find("ServiceAccount"); len(sas) == 1 && sas[0].GetName() != pod.Spec.ServiceAccountName {
		t.Errorf("pod runs as %q, the chart's ServiceAccount is %q", pod.Spec.ServiceAccountName, sas[0].GetName())
	}
	// Bindings name the pod's ServiceAccount and the chart's roles.
	for _, kind := range []string{"ClusterRoleBinding", "RoleBinding"} {
		for _, o := range m.find(kind) {
			var subjects []rbacv1.Subject
			var ref rbacv1.RoleRef
			if kind == "ClusterRoleBinding" {
				b := typed[rbacv1.ClusterRoleBinding](t, o)
				subjects, ref = b.Subjects, b.RoleRef
			} else {
				b := typed[rbacv1.RoleBinding](t, o)
				subjects, ref = b.Subjects, b.RoleRef
			}
			want := []rbacv1.Subject{{Kind: "ServiceAccount", Name: pod.Spec.ServiceAccountName, Namespace: ns}}
			if !reflect.DeepEqual(subjects, want) {
				t.Errorf("%s subjects = %+v, want %+v", o.ID(), subjects, want)
			}
			roleKind := strings.TrimSuffix(kind, "Binding")
			if roles := m.find(roleKind); len(roles) != 1 || ref.Kind != roleKind || ref.Name != roles[0].GetName() {
				t.Errorf("%s roleRef = %+v, want the chart's %s", o.ID(), ref, roleKind)
			}
		}
	}
}

type chartYAML struct {
	Version    string `json:"version"`
	AppVersion string `json:"appVersion"`
}

func chartMeta(t testing.TB) chartYAML {
	t.Helper()
	var c chartYAML
	readYAML(t, chartDir+"/Chart.yaml", &c)
	return c
}

func readYAML(t testing.TB, rel string, into any) {
	t.Helper()
	b, err := os.ReadFile(repoPath(t, rel))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, into); err != nil {
		t.Fatalf("%s: %v", rel, err)
	}
}

// TestChartLint runs `helm lint --strict` with the default and the
// all-options values, as `make chart` does.
