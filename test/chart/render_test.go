package chart

import (
	"fmt"
	"maps"
	"os"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

func TestChartLint(t *testing.T) {
	helm := tool(t, "helm", "HELM")
	for _, args := range [][]string{{}, {"-f", allOptionsFile}} {
		if _, err := run(t, helm, append([]string{"lint", "--strict", chartDir}, args...)...); err != nil {
			t.Error(err)
		}
	}
}

// TestRenderDefaults renders the chart with its default values: the example
// hostpath driver, leader election, the binder, metrics, one StorageClass.
func TestRenderDefaults(t *testing.T) {
	const release, ns = "csi", "storage"
	m := mustHelmTemplate(t, release, ns)
	checkCommon(t, m, release, ns)
	if got, want := m.kinds(), []string{"CSIDriver", "ClusterRole", "ClusterRoleBinding", "Deployment", "Role", "RoleBinding", "Service", "ServiceAccount", "StorageClass"}; !slices.Equal(got, want) {
		t.Errorf("kinds = %v, want %v", got, want)
	}
	appVersion := chartMeta(t).AppVersion

	d := typed[appsv1.Deployment](t, m.one(t, "Deployment"))
	if d.Name != "csi-csi-provisioner" || d.Spec.Replicas == nil || *d.Spec.Replicas != 1 {
		t.Errorf("Deployment %s replicas %v", d.Name, d.Spec.Replicas)
	}
	pod := d.Spec.Template.Spec
	sc := container(t, d, sidecarName)
	if want := "ghcr.io/kube-storage/csi-provisioner:" + appVersion; sc.Image != want || sc.ImagePullPolicy != corev1.PullIfNotPresent {
		t.Errorf("sidecar image %s %s, want %s IfNotPresent", sc.Image, sc.ImagePullPolicy, want)
	}
	wantArgs := []string{
		"--csi-address=$(ADDRESS)",
		"--v=2",
		"--leader-election=true",
		"--leader-election-namespace=" + ns,
		"--feature-gates=ReleaseLeaderElectionOnExit=true",
		"--http-endpoint=:8080",
		"--enable-binder=true",
		"--kube-api-burst=600",
		"--kube-api-qps=300",
		"--timeout=60s",
		"--worker-threads=100",
	}
	if !slices.Equal(sc.Args, wantArgs) {
		t.Errorf("sidecar args:\n got  %q\n want %q", sc.Args, wantArgs)
	}
	checkProbes(t, sc, 8080, true)
	checkHardened(t, sc)
	if addr, _ := envValue(sc, "ADDRESS"); addr.Value != "/csi/csi.sock" {
		t.Errorf("ADDRESS = %q", addr.Value)
	}
	checkMemoryLimitEnv(t, sc)
	if sc.Resources.Requests.Memory().IsZero() || sc.Resources.Limits.Memory().IsZero() {
		t.Errorf("sidecar resources = %+v, want memory requests and limits", sc.Resources)
	}

	drv := container(t, d, "hostpath-driver")
	if want := "ghcr.io/kube-storage/hostpath-driver:" + appVersion; drv.Image != want {
		t.Errorf("driver image %s, want %s", drv.Image, want)
	}
	wantDriverArgs := []string{"--endpoint=$(CSI_ENDPOINT)", "--drivername=$(CSI_DRIVER_NAME)", "--node-id=$(NODE_NAME)",
		"--backend=dir", "--root=/var/lib/csi-hostpath", "--enable-topology=false", "--v=2"}
	if !slices.Equal(drv.Args, wantDriverArgs) {
		t.Errorf("driver args:\n got  %q\n want %q", drv.Args, wantDriverArgs)
	}
	if name, _ := envValue(drv, "CSI_DRIVER_NAME"); name.Value != "hostpath.csi.kube-storage.io" {
		t.Errorf("CSI_DRIVER_NAME = %q", name.Value)
	}
	if node, _ := envValue(drv, "NODE_NAME"); node.ValueFrom == nil || node.ValueFrom.FieldRef == nil || node.ValueFrom.FieldRef.FieldPath != "spec.nodeName" {
		t.Errorf("NODE_NAME = %+v", node)
	}
	if mountPath(drv, "hostpath-data") != "/var/lib/csi-hostpath" {
		t.Errorf("driver mounts = %+v, want the hostpath-data emptyDir on --root", drv.VolumeMounts)
	}
	checkHardened(t, drv)
	volumes := map[string]bool{}
	for _, v := range pod.Volumes {
		volumes[v.Name] = v.EmptyDir != nil
	}
	if !reflect.DeepEqual(volumes, map[string]bool{socketDirVolume: true, "hostpath-data": true}) {
		t.Errorf("pod volumes = %+v, want two emptyDirs", pod.Volumes)
	}
	psc := pod.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser != 65532 ||
		psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod securityContext = %+v, want nonroot 65532 with RuntimeDefault seccomp", psc)
	}
	if pod.PriorityClassName != "" || len(pod.NodeSelector) != 0 || len(pod.Tolerations) != 0 || pod.Affinity != nil || len(pod.ImagePullSecrets) != 0 {
		t.Errorf("pod scheduling options set by default: %+v", pod)
	}

	checkRules(t, "ClusterRole", typed[rbacv1.ClusterRole](t, m.one(t, "ClusterRole")).Rules, wantClusterRules)
	checkRules(t, "Role", typed[rbacv1.Role](t, m.one(t, "Role")).Rules, wantLeaseRules)

	drvObj := typed[storagev1.CSIDriver](t, m.one(t, "CSIDriver"))
	if drvObj.Name != "hostpath.csi.kube-storage.io" || drvObj.Spec.AttachRequired == nil || *drvObj.Spec.AttachRequired ||
		drvObj.Spec.PodInfoOnMount == nil || *drvObj.Spec.PodInfoOnMount || drvObj.Spec.FSGroupPolicy != nil || drvObj.Spec.StorageCapacity != nil ||
		!slices.Equal(drvObj.Spec.VolumeLifecycleModes, []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecyclePersistent}) {
		t.Errorf("CSIDriver = %+v", drvObj)
	}
	class := typed[storagev1.StorageClass](t, m.one(t, "StorageClass"))
	if class.Name != "csi-hostpath" || class.Provisioner != drvObj.Name || class.ReclaimPolicy == nil || *class.ReclaimPolicy != corev1.PersistentVolumeReclaimDelete ||
		class.VolumeBindingMode == nil || *class.VolumeBindingMode != storagev1.VolumeBindingImmediate || class.AllowVolumeExpansion != nil {
		t.Errorf("StorageClass = %+v", class)
	}
	svc := typed[corev1.Service](t, m.one(t, "Service"))
	if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Name != "metrics" || svc.Spec.Ports[0].Port != 8080 || svc.Spec.Ports[0].TargetPort != intstr.FromString("http-endpoint") {
		t.Errorf("Service ports = %+v", svc.Spec.Ports)
	}
	if !maps.Equal(svc.Spec.Selector, d.Spec.Selector.MatchLabels) {
		t.Errorf("Service selector %v, Deployment selector %v", svc.Spec.Selector, d.Spec.Selector.MatchLabels)
	}
}

// TestRenderAllOptions renders ci/all-options-values.yaml, which sets every
// option, and checks that each one arrives where it should.
func TestRenderAllOptions(t *testing.T) {
	const release, ns = "vendor", "vendor-system"
	m := mustHelmTemplate(t, release, ns, "-f", allOptionsFile)
	checkCommon(t, m, release, ns)
	if got, want := m.kinds(), []string{"CSIDriver", "ClusterRole", "ClusterRoleBinding", "Deployment", "Role", "RoleBinding", "Service", "ServiceAccount", "ServiceMonitor", "StorageClass"}; !slices.Equal(got, want) {
		t.Errorf("kinds = %v, want %v", got, want)
	}
	for _, o := range m {
		if o.GetLabels()["example.com/owner"] != "storage-team" {
			t.Errorf("%s lacks customLabels", o.ID())
		}
	}

	d := typed[appsv1.Deployment](t, m.one(t, "Deployment"))
	if *d.Spec.Replicas != 2 {
		t.Errorf("replicas = %d", *d.Spec.Replicas)
	}
	pod := d.Spec.Template
	if pod.Labels["example.com/team"] != "storage" || pod.Annotations["example.com/scrape"] != "true" {
		t.Errorf("pod labels %v, annotations %v", pod.Labels, pod.Annotations)
	}
	spec := pod.Spec
	if spec.ServiceAccountName != "vendor-csi-controller" || spec.PriorityClassName != "system-cluster-critical" ||
		spec.NodeSelector["kubernetes.io/os"] != "linux" || len(spec.Tolerations) != 1 || spec.Tolerations[0].Key != "node-role.kubernetes.io/control-plane" ||
		spec.Affinity == nil || spec.Affinity.PodAntiAffinity == nil ||
		!reflect.DeepEqual(spec.ImagePullSecrets, []corev1.LocalObjectReference{{Name: "vendor-registry"}}) {
		t.Errorf("pod spec options not applied: sa %q priority %q nodeSelector %v tolerations %v affinity %v pullSecrets %v",
			spec.ServiceAccountName, spec.PriorityClassName, spec.NodeSelector, spec.Tolerations, spec.Affinity, spec.ImagePullSecrets)
	}
	if psc := spec.SecurityContext; psc == nil || psc.RunAsUser == nil || *psc.RunAsUser != 1000 || psc.FSGroupChangePolicy == nil {
		t.Errorf("pod securityContext = %+v", psc)
	}

	sc := container(t, d, sidecarName)
	if sc.Image != "registry.example.com/mirror/csi-provisioner:v0.1.0-vendor.1" || sc.ImagePullPolicy != corev1.PullAlways {
		t.Errorf("sidecar image %s %s", sc.Image, sc.ImagePullPolicy)
	}
	wantArgs := []string{
		"--csi-address=$(ADDRESS)",
		"--v=4",
		"--leader-election=true",
		"--leader-election-namespace=" + ns,
		"--feature-gates=ReleaseLeaderElectionOnExit=true",
		"--leader-election-lease-duration=30s",
		"--leader-election-renew-deadline=20s",
		"--leader-election-retry-period=10s",
		"--http-endpoint=:9808",
		"--enable-binder=true",
		"--binder-resync-period=30s",
		"--enable-capacity",
		"--capacity-ownerref-level=2",
		"--capacity-poll-interval=5m",
		"--capacity-for-immediate-binding",
		"--feature-gates=CrossNamespaceVolumeDataSource=true",
		// --kube-api-qps and --timeout come from additionalArgs below.
		"--kube-api-burst=600",
		"--worker-threads=100",
		"--timeout=300s",
		"--kube-api-qps=50",
		"--extra-create-metadata",
		"--default-fstype=ext4",
	}
	if !slices.Equal(sc.Args, wantArgs) {
		t.Errorf("sidecar args:\n got  %q\n want %q", sc.Args, wantArgs)
	}
	checkProbes(t, sc, 9808, true)
	checkHardened(t, sc)
	// The value's GOMEMLIMIT replaces the chart's.
	if e, _ := envValue(sc, "GOMEMLIMIT"); e.Value != "400MiB" || strings.Count(fmt.Sprint(sc.Env), "GOMEMLIMIT") != 1 {
		t.Errorf("sidecar env = %+v, want GOMEMLIMIT=400MiB once", sc.Env)
	}
	// sidecar.capacity: the namespace of the objects and the pod where the
	// owner lookup starts, from the downward API.
	for name, path := range map[string]string{"NAMESPACE": "metadata.namespace", "POD_NAME": "metadata.name"} {
		if e, ok := envValue(sc, name); !ok || e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != path {
			t.Errorf("sidecar %s = %+v, want the pod's %s", name, e, path)
		}
	}
	if sc.Resources.Limits.Cpu().String() != "500m" || sc.Resources.Requests.Memory().String() != "128Mi" {
		t.Errorf("sidecar resources = %+v", sc.Resources)
	}

	drv := container(t, d, "vendor-driver")
	if drv.Image != "registry.example.com/vendor/csi-driver:v9.8.7" || drv.ImagePullPolicy != corev1.PullAlways {
		t.Errorf("driver image %s %s", drv.Image, drv.ImagePullPolicy)
	}
	if !slices.Equal(drv.Args, []string{"--endpoint=$(CSI_ENDPOINT)", "--mode=controller", "--v=4"}) {
		t.Errorf("driver args = %q", drv.Args)
	}
	if e, _ := envValue(drv, "CSI_ENDPOINT"); e.Value != "unix:///var/lib/csi/sockets/pluginproxy/csi.sock" {
		t.Errorf("CSI_ENDPOINT = %q", e.Value)
	}
	if e, _ := envValue(drv, "CSI_DRIVER_NAME"); e.Value != "block.csi.vendor.example.com" {
		t.Errorf("CSI_DRIVER_NAME = %q", e.Value)
	}
	if e, _ := envValue(drv, "VENDOR_TOKEN"); e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
		t.Errorf("driver env = %+v", drv.Env)
	}
	if mountPath(drv, "vendor-config") != "/etc/vendor" || mountPath(drv, socketDirVolume) != "/var/lib/csi/sockets/pluginproxy" {
		t.Errorf("driver mounts = %+v", drv.VolumeMounts)
	}
	if drv.Resources.Limits.Memory().String() != "1Gi" || drv.SecurityContext == nil || *drv.SecurityContext.RunAsUser != 1000 {
		t.Errorf("driver resources %+v, securityContext %+v", drv.Resources, drv.SecurityContext)
	}
	checkHardened(t, drv)
	var volumeNames []string
	for _, v := range spec.Volumes {
		volumeNames = append(volumeNames, v.Name)
	}
	if !slices.Equal(volumeNames, []string{socketDirVolume, "vendor-config"}) {
		t.Errorf("pod volumes = %v", volumeNames)
	}

	sa := typed[corev1.ServiceAccount](t, m.one(t, "ServiceAccount"))
	if sa.Name != "vendor-csi-controller" || sa.Annotations["example.com/role"] != "vendor-csi" {
		t.Errorf("ServiceAccount = %+v", sa.ObjectMeta)
	}
	checkRules(t, "ClusterRole", typed[rbacv1.ClusterRole](t, m.one(t, "ClusterRole")).Rules, append(slices.Clone(wantClusterRules), wantReferenceGrantRule))
	checkRules(t, "Role", typed[rbacv1.Role](t, m.one(t, "Role")).Rules, append(slices.Clone(wantLeaseRules), wantCapacityRules...))

	drvObj := typed[storagev1.CSIDriver](t, m.one(t, "CSIDriver"))
	if drvObj.Name != "block.csi.vendor.example.com" || !*drvObj.Spec.AttachRequired || !*drvObj.Spec.PodInfoOnMount ||
		drvObj.Spec.FSGroupPolicy == nil || *drvObj.Spec.FSGroupPolicy != storagev1.FileFSGroupPolicy ||
		drvObj.Spec.StorageCapacity == nil || !*drvObj.Spec.StorageCapacity {
		t.Errorf("CSIDriver = %+v", drvObj.Spec)
	}

	classes := m.find("StorageClass")
	if len(classes) != 2 {
		t.Fatalf("StorageClasses = %v", m.ids())
	}
	fast := typed[storagev1.StorageClass](t, classes[0])
	if fast.Name != "vendor-fast" || fast.Provisioner != drvObj.Name ||
		fast.Annotations["storageclass.kubernetes.io/is-default-class"] != "true" || fast.Labels["tier"] != "fast" ||
		!maps.Equal(fast.Parameters, map[string]string{"type": "ssd", "csi.storage.k8s.io/fstype": "ext4"}) ||
		*fast.ReclaimPolicy != corev1.PersistentVolumeReclaimRetain || *fast.VolumeBindingMode != storagev1.VolumeBindingImmediate ||
		fast.AllowVolumeExpansion == nil || !*fast.AllowVolumeExpansion || !slices.Equal(fast.MountOptions, []string{"noatime"}) ||
		len(fast.AllowedTopologies) != 1 || fast.AllowedTopologies[0].MatchLabelExpressions[0].Key != "topology.vendor.example.com/zone" {
		t.Errorf("StorageClass vendor-fast = %+v", fast)
	}
	std := typed[storagev1.StorageClass](t, classes[1])
	if std.Name != "vendor-standard" || *std.ReclaimPolicy != corev1.PersistentVolumeReclaimDelete ||
		*std.VolumeBindingMode != storagev1.VolumeBindingWaitForFirstConsumer || std.AllowVolumeExpansion != nil || len(std.Parameters) != 0 {
		t.Errorf("StorageClass vendor-standard (defaults) = %+v", std)
	}

	svc := typed[corev1.Service](t, m.one(t, "Service"))
	if svc.Spec.Ports[0].Port != 9090 || svc.Annotations["prometheus.io/scrape"] != "true" {
		t.Errorf("Service = %+v", svc)
	}
	mon := m.one(t, "ServiceMonitor")
	endpoints, _, _ := unstructured.NestedSlice(mon.Object, "spec", "endpoints")
	if mon.GetLabels()["release"] != "prometheus" || len(endpoints) != 1 {
		t.Fatalf("ServiceMonitor = %v", mon.Object)
	}
	ep := endpoints[0].(map[string]any)
	if ep["port"] != "metrics" || ep["path"] != "/metrics" || ep["interval"] != "30s" || ep["scrapeTimeout"] != "10s" {
		t.Errorf("ServiceMonitor endpoint = %v", ep)
	}
}

// TestAllOptionsSetsEveryOption: every key of values.yaml, and every field
// of a storageClasses entry the schema knows, is set in
// ci/all-options-values.yaml, so the render and apply tests see every
// template branch.
func TestAllOptionsSetsEveryOption(t *testing.T) {
	var defaults, all map[string]any
	readYAML(t, chartDir+"/values.yaml", &defaults)
	readYAML(t, allOptionsFile, &all)
	var missing []string
	var walk func(path string, d, a map[string]any)
	walk = func(path string, d, a map[string]any) {
		for k, dv := range d {
			av, ok := a[k]
			if !ok {
				missing = append(missing, path+k)
				continue
			}
			dm, isMap := dv.(map[string]any)
			am, _ := av.(map[string]any)
			// Non-empty maps are walked; empty ones (annotations, labels,
			// nodeSelector, ...) are free-form.
			if isMap && len(dm) > 0 && am != nil {
				walk(path+k+".", dm, am)
			}
		}
	}
	walk("", defaults, all)

	var schema struct {
		Properties map[string]struct {
			Items struct {
				Properties map[string]any `json:"properties"`
			} `json:"items"`
		} `json:"properties"`
	}
	readYAML(t, chartDir+"/values.schema.json", &schema)
	set := map[string]bool{}
	for _, c := range all["storageClasses"].([]any) {
		for k := range c.(map[string]any) {
			set[k] = true
		}
	}
	for k := range schema.Properties["storageClasses"].Items.Properties {
		if !set[k] {
			missing = append(missing, "storageClasses[]."+k)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("%s does not set: %v", allOptionsFile, missing)
	}
}

// TestAdditionalArgsReplaceDefaults: a flag in sidecar.additionalArgs
// replaces the chart's default for it (never two of the same flag), in any
// of the spellings Go's flag package accepts; other flags keep their
// defaults.
func TestAdditionalArgsReplaceDefaults(t *testing.T) {
	defaults := map[string]string{"timeout": "--timeout=60s", "worker-threads": "--worker-threads=100",
		"kube-api-qps": "--kube-api-qps=300", "kube-api-burst": "--kube-api-burst=600", "v": "--v=2"}
	for _, tc := range []struct {
		name       string
		additional string // JSON list
		replaced   []string
	}{
		{"none", `[]`, nil},
		{"equals", `["--timeout=5m"]`, []string{"timeout"}},
		{"single dash", `["-worker-threads=7"]`, []string{"worker-threads"}},
		{"separate value", `["--kube-api-qps", "7"]`, []string{"kube-api-qps"}},
		{"verbosity", `["-v=5"]`, []string{"v"}},
		{"verbosity attached", `["-v5"]`, []string{"v"}},
		{"all", `["--timeout=1s", "--worker-threads=1", "--kube-api-qps=1", "--kube-api-burst=1", "--v=0"]`,
			[]string{"timeout", "worker-threads", "kube-api-qps", "kube-api-burst", "v"}},
		{"longer flag with the same prefix", `["--timeouts-are-not-timeout=1", "--vv", "-vmodule=x=2"]`, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := mustHelmTemplate(t, "csi", "default", "--set-json", "sidecar.additionalArgs="+tc.additional)
			args := container(t, typed[appsv1.Deployment](t, m.one(t, "Deployment")), sidecarName).Args
			for flag, def := range defaults {
				want := 1
				if slices.Contains(tc.replaced, flag) {
					want = 0
				}
				if got := countExact(args, def); got != want {
					t.Errorf("default %s appears %d times, want %d; args %q", def, got, want, args)
				}
				if slices.Contains(tc.replaced, flag) && flagCount(args, flag) != 1 {
					t.Errorf("--%s appears %d times, want once (from additionalArgs); args %q", flag, flagCount(args, flag), args)
				}
			}
			var extra []string
			if err := yaml.Unmarshal([]byte(tc.additional), &extra); err != nil {
				t.Fatal(err)
			}
			if len(extra) > 0 && !slices.Equal(args[len(args)-len(extra):], extra) {
				t.Errorf("additionalArgs %q not appended verbatim at the end: %q", extra, args)
			}
		})
	}
}

func countExact(args []string, s string) int {
	n := 0
	for _, a := range args {
		if a == s {
			n++
		}
	}
	return n
}

// TestRenderToggles: the switches of the chart add and remove what they
// should.
func TestRenderToggles(t *testing.T) {
	for _, tc := range []struct {
		name  string
		args  []string
		check func(t *testing.T, m manifest)
	}{
		{"leader election off: no rolling update", []string{"--set", "sidecar.leaderElection.enabled=false"}, func(t *testing.T, m manifest) {
			if s := typed[appsv1.Deployment](t, m.one(t, "Deployment")).Spec.Strategy.Type; s != appsv1.RecreateDeploymentStrategyType {
				t.Errorf("Deployment strategy %q without leader election, want Recreate: a rolling update would run two sidecars that both provision and bind", s)
			}
		}},
		{"leader election on: no surge", nil, func(t *testing.T, m manifest) {
			// The strategy also rolls out the upgrade that turns leader
			// election on: a surge pod would lead next to the old pod,
			// which has no leader election.
			s := typed[appsv1.Deployment](t, m.one(t, "Deployment")).Spec.Strategy
			if s.Type != appsv1.RollingUpdateDeploymentStrategyType || s.RollingUpdate == nil || s.RollingUpdate.MaxSurge == nil || s.RollingUpdate.MaxSurge.IntValue() != 0 {
				t.Errorf("Deployment strategy %+v with leader election, want RollingUpdate with maxSurge 0", s)
			}
		}},
		{"rbac off", []string{"--set", "rbac.create=false"}, func(t *testing.T, m manifest) {
			for _, k := range []string{"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"} {
				if len(m.find(k)) != 0 {
					t.Errorf("%s rendered with rbac.create=false", k)
				}
			}
		}},
		{"no secrets rule", []string{"--set", "rbac.secrets=false"}, func(t *testing.T, m manifest) {
			for _, r := range typed[rbacv1.ClusterRole](t, m.one(t, "ClusterRole")).Rules {
				if slices.Contains(r.Resources, "secrets") {
					t.Errorf("ClusterRole grants %v on secrets with rbac.secrets=false", r.Verbs)
				}
			}
		}},
		{"existing service account", []string{"--set", "serviceAccount.create=false", "--set", "serviceAccount.name=mine"}, func(t *testing.T, m manifest) {
			if len(m.find("ServiceAccount")) != 0 {
				t.Error("ServiceAccount rendered with serviceAccount.create=false")
			}
			if sa := typed[appsv1.Deployment](t, m.one(t, "Deployment")).Spec.Template.Spec.ServiceAccountName; sa != "mine" {
				t.Errorf("pod ServiceAccount = %q", sa)
			}
			if s := typed[rbacv1.ClusterRoleBinding](t, m.one(t, "ClusterRoleBinding")).Subjects; s[0].Name != "mine" {
				t.Errorf("ClusterRoleBinding subjects = %+v", s)
			}
		}},
		{"no CSIDriver, no classes, no Service", []string{"--set", "csiDriver.create=false", "--set", "storageClasses=null", "--set", "metrics.service.enabled=false"}, func(t *testing.T, m manifest) {
			if got, want := m.kinds(), []string{"ClusterRole", "ClusterRoleBinding", "Deployment", "Role", "RoleBinding", "ServiceAccount"}; !slices.Equal(got, want) {
				t.Errorf("kinds = %v, want %v", got, want)
			}
		}},
		{"empty class list", []string{"--set-json", "storageClasses=[]"}, func(t *testing.T, m manifest) {
			if n := len(m.find("StorageClass")); n != 0 {
				t.Errorf("%d StorageClasses", n)
			}
		}},
		{"leader election and binder off", []string{"--set", "sidecar.leaderElection.enabled=false", "--set", "sidecar.binder.enabled=false", "--set", "sidecar.binder.resyncPeriod=1m"}, func(t *testing.T, m manifest) {
			sc := container(t, typed[appsv1.Deployment](t, m.one(t, "Deployment")), sidecarName)
			for _, a := range []string{"--leader-election=false", "--enable-binder=false"} {
				if !slices.Contains(sc.Args, a) {
					t.Errorf("args %q lack %s", sc.Args, a)
				}
			}
			for _, f := range []string{"leader-election-namespace", "binder-resync-period", "feature-gates"} {
				if flagCount(sc.Args, f) != 0 {
					t.Errorf("args %q have --%s", sc.Args, f)
				}
			}
			checkRules(t, "ClusterRole", typed[rbacv1.ClusterRole](t, m.one(t, "ClusterRole")).Rules, wantBinderOffClusterRules)
			checkProbes(t, sc, 8080, false)
			// Nothing to elect: no Lease rules, so no Role at all.
			if ids := append(m.find("Role"), m.find("RoleBinding")...); len(ids) != 0 {
				t.Errorf("Role or RoleBinding rendered without leader election and capacity: %v", m.ids())
			}
		}},
		{"node deployment without capacity", []string{"--set", "nodeDeployment.enabled=true"}, func(t *testing.T, m manifest) {
			// Every node's pod runs without leader election: it must not
			// write the Leases of the release's namespace (kube-system in
			// the README).
			if ids := append(m.find("Role"), m.find("RoleBinding")...); len(ids) != 0 {
				t.Errorf("Role or RoleBinding rendered in node deployment without capacity: %v", m.ids())
			}
		}},
		{"node deployment", []string{"--set", "nodeDeployment.enabled=true", "--set", "sidecar.capacity.enabled=true", "--set", "replicas=3"}, func(t *testing.T, m manifest) {
			if len(m.find("Deployment")) != 0 {
				t.Errorf("a Deployment rendered in node deployment: %v", m.ids())
			}
			ds := typed[appsv1.DaemonSet](t, m.one(t, "DaemonSet"))
			// The same pod as the Deployment's, so the shared checks apply.
			sc := container(t, &appsv1.Deployment{ObjectMeta: ds.ObjectMeta, Spec: appsv1.DeploymentSpec{Template: ds.Spec.Template}}, sidecarName)
			for _, a := range []string{"--node-deployment", "--leader-election=false", "--enable-binder=false", "--capacity-ownerref-level=0"} {
				if !slices.Contains(sc.Args, a) {
					t.Errorf("args %q lack %s", sc.Args, a)
				}
			}
			for _, f := range []string{"leader-election-namespace", "feature-gates"} {
				if flagCount(sc.Args, f) != 0 {
					t.Errorf("args %q have --%s", sc.Args, f)
				}
			}
			checkRules(t, "ClusterRole", typed[rbacv1.ClusterRole](t, m.one(t, "ClusterRole")).Rules, wantBinderOffClusterRules)
			if e, ok := envValue(sc, "NODE_NAME"); !ok || e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "spec.nodeName" {
				t.Errorf("sidecar NODE_NAME = %+v, want the pod's spec.nodeName", e)
			}
			checkProbes(t, sc, 8080, false)
			// The pod owns its node's objects: the pod is read, no ReplicaSet.
			// No leader election: no Lease rules.
			checkRules(t, "Role", typed[rbacv1.Role](t, m.one(t, "Role")).Rules, wantCapacityRules[:2])
		}},
		{"cross-namespace data sources", crossNamespaceValues, func(t *testing.T, m manifest) {
			sc := container(t, typed[appsv1.Deployment](t, m.one(t, "Deployment")), sidecarName)
			if !slices.Contains(sc.Args, "--feature-gates=CrossNamespaceVolumeDataSource=true") {
				t.Errorf("args %q lack the CrossNamespaceVolumeDataSource gate", sc.Args)
			}
			checkRules(t, "ClusterRole", typed[rbacv1.ClusterRole](t, m.one(t, "ClusterRole")).Rules, append(slices.Clone(wantClusterRules), wantReferenceGrantRule))
		}},
		{"image tag", []string{"--set", "sidecar.image.tag=v9", "--set", "driver.image.repository=example.com/d"}, func(t *testing.T, m manifest) {
			d := typed[appsv1.Deployment](t, m.one(t, "Deployment"))
			if img := container(t, d, sidecarName).Image; img != "ghcr.io/kube-storage/csi-provisioner:v9" {
				t.Errorf("sidecar image %s", img)
			}
			if img := container(t, d, "hostpath-driver").Image; img != "example.com/d:"+chartMeta(t).AppVersion {
				t.Errorf("driver image %s", img)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.check(t, mustHelmTemplate(t, "csi", "default", tc.args...))
		})
	}
}

// TestReleaseNamedAfterChart: `helm install csi-provisioner ...` (the
// README's command) names the objects csi-provisioner, not
// csi-provisioner-csi-provisioner, and the README's RBAC section names the
// ClusterRole that command creates.
func TestReleaseNamedAfterChart(t *testing.T) {
	m := mustHelmTemplate(t, "csi-provisioner", "kube-system")
	for _, kind := range []string{"Deployment", "ServiceAccount"} {
		if name := m.one(t, kind).GetName(); name != "csi-provisioner" {
			t.Errorf("%s named %s", kind, name)
		}
	}
	readme, err := os.ReadFile(repoPath(t, "deploy/sidecar/README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, rbac, _ := strings.Cut(string(readme), "## RBAC\n")
	if name := m.one(t, "ClusterRole").GetName(); !strings.Contains(rbac, "`"+name+"`") {
		t.Errorf("deploy/sidecar/README.md's RBAC section does not name the ClusterRole %s of `helm install csi-provisioner`", name)
	}
}

// TestValuesMistakesFail: values.schema.json and the templates reject
// mistakes at render time, so `helm install` and `helm lint` fail on them.
func TestValuesMistakesFail(t *testing.T) {
	typoFile := t.TempDir() + "/typo.yaml"
	if err := os.WriteFile(typoFile, []byte("sidecar:\n  leaderElection:\n    enabled: true\n    leaseDuraton: 30s\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"unknown top-level key", []string{"--set", "typo=1"}, "additional properties 'typo' not allowed"},
		{"misspelt nested key in a file", []string{"-f", typoFile}, "additional properties 'leaseDuraton' not allowed"},
		{"misspelt class field", []string{"--set", "storageClasses[0].name=a", "--set", "storageClasses[0].reclaimpolicy=Retain"}, "additional properties 'reclaimpolicy' not allowed"},
		{"misspelt security context field", []string{"--set", "sidecar.securityContext.readOnlyRootFileSystem=true"}, "additional properties 'readOnlyRootFileSystem' not allowed"},
		{"bad reclaim policy", []string{"--set", "storageClasses[0].name=a", "--set", "storageClasses[0].reclaimPolicy=Recycle"}, "reclaimPolicy"},
		{"bad duration", []string{"--set", "sidecar.leaderElection.leaseDuration=30"}, "leaseDuration"},
		{"log level as a string", []string{"--set-string", "sidecar.logLevel=high"}, "logLevel"},
		{"class without a name", []string{"--set-json", `storageClasses=[{"parameters":{"a":"b"}}]`}, "name"},
		{"non-string class parameter", []string{"--set-json", `storageClasses=[{"name":"a","parameters":{"size":5}}]`}, "parameters"},
		{"replicas without leader election", []string{"--set", "replicas=2", "--set", "sidecar.leaderElection.enabled=false"}, "needs sidecar.leaderElection.enabled"},
		{"existing service account without a name", []string{"--set", "serviceAccount.create=false"}, "serviceAccount.name is required"},
		{"ServiceMonitor without Service", []string{"--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.service.enabled=false"}, "needs metrics.service.enabled"},
		// A flag the chart sets from a value: the probes, Service and RBAC
		// follow the value, not the flag.
		{"HTTP endpoint in additionalArgs", []string{"--set-json", `sidecar.additionalArgs=["--http-endpoint=:9808"]`}, "sidecar.additionalArgs has --http-endpoint, which the chart sets: set sidecar.httpPort"},
		{"leader election off in additionalArgs", []string{"--set-json", `sidecar.additionalArgs=["--leader-election", "false"]`}, "has --leader-election, which the chart sets: set sidecar.leaderElection.enabled"},
		{"lease namespace in additionalArgs", []string{"--set-json", `sidecar.additionalArgs=["-leader-election-namespace=kube-system"]`}, "has --leader-election-namespace, which the chart sets"},
		{"binder in additionalArgs", []string{"--set-json", `sidecar.additionalArgs=["--enable-binder=false"]`}, "set sidecar.binder.enabled"},
		{"metrics path in additionalArgs", []string{"--set-json", `sidecar.additionalArgs=["--metrics-path=/m"]`}, "the ServiceMonitor scrapes /metrics"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := helmTemplate(t, "csi", "default", tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("helm template %q: error %v, want one containing %q", tc.args, err, tc.want)
			}
		})
	}
}
