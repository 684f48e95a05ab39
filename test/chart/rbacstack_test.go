package chart

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kube-storage/csi-provisioner/internal/controlplane"
	"github.com/kube-storage/csi-provisioner/internal/e2e"
	"github.com/kube-storage/csi-provisioner/internal/testutil"
)

// The secret the StorageClass names and the driver requires in both
// CreateVolume and DeleteVolume, so that provisioning reads a Secret.
const (
	secretName  = "provisioner-secret"
	secretKey   = "token"
	secretValue = "s3cret"
)

// rbacStack is the example driver and the real sidecar running as the
// chart's ServiceAccount, in a namespace of their own.
type rbacStack struct {
	t         *testing.T
	cp        *controlplane.ControlPlane
	ns        string
	user      string // system:serviceaccount:<ns>:<sa>
	driver    *e2e.Driver
	sidecar   *e2e.Sidecar
	className string
	// owner is the Deployment above the sidecar's pod, with sidecar.capacity.
	owner *appsv1.Deployment
}

// rbacKinds are the kinds of the chart's RBAC.
var rbacKinds = []string{"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}

// crossNamespaceValues turn the chart's cross-namespace data sources on.
var crossNamespaceValues = []string{"--set", "sidecar.crossNamespaceDataSource.enabled=true"}

// capacityValues turn the chart's storage capacity tracking on.
var capacityValues = []string{"--set", "sidecar.capacity.enabled=true", "--set", "sidecar.capacity.forImmediateBinding=true"}

// capacityPod is the sidecar's pod name (POD_NAME) when the chart's
// sidecar.capacity is on: startUnderChartRBAC creates it, with the
// ReplicaSet and Deployment above it that own the CSIStorageCapacity
// objects.
const capacityPod = "csi-controller-0"

// startUnderChartRBAC renders the chart for a release named after name,
// with the extra helm arguments values,
// applies its ServiceAccount and RBAC (after mutate, if not nil), waits
// until the API server authorizes exactly those rules, and starts the
// hostpath driver (memory backend, with topology, attach and required
// secrets, so the csinodes, nodes, volumeattachments and secrets rules are
// used) and the sidecar with the
// chart's arguments and a kubeconfig that impersonates the ServiceAccount.
func startUnderChartRBAC(t *testing.T, cp *controlplane.ControlPlane, bins e2e.Binaries, name string, mutate func(*rbacv1.ClusterRole, *rbacv1.Role), values ...string) *rbacStack {
	t.Helper()
	s := &rbacStack{t: t, cp: cp, ns: createNamespace(t, cp, "rbac-"+name), className: "rbac-" + name}
	driverName := name + ".rbac.csi.kube-storage.io"
	m := mustHelmTemplate(t, "rbac-"+name, s.ns, append([]string{"--set", "csiDriver.name=" + driverName}, values...)...)

	var objs manifest
	var role *rbacv1.ClusterRole
	var leaseRole *rbacv1.Role
	for _, o := range m {
		switch o.GetKind() {
		case "ClusterRole":
			role = typed[rbacv1.ClusterRole](t, o)
		case "Role":
			leaseRole = typed[rbacv1.Role](t, o)
		case "ServiceAccount":
			s.user = "system:serviceaccount:" + s.ns + ":" + o.GetName()
		}
		if slices.Contains(rbacKinds, o.GetKind()) {
			objs = append(objs, o)
		}
	}
	if role == nil || leaseRole == nil || s.user == "" {
		t.Fatalf("the chart rendered no ClusterRole, Role or ServiceAccount: %v", m.ids())
	}
	if mutate != nil {
		mutate(role, leaseRole)
		for i, o := range objs {
			switch o.GetKind() {
			case "ClusterRole":
				objs[i] = toObject(t, role)
			case "Role":
				objs[i] = toObject(t, leaseRole)
			}
		}
	}
	newApplier(t, cp).applyAll(t, objs)
	s.waitAuthorized(append(role.Rules, leaseRole.Rules...))

	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "serviceaccount.kubeconfig")
	writeImpersonatingKubeconfig(t, cp.KubeconfigPath, kubeconfig, s.user)

	var err error
	s.driver, err = e2e.StartDriver(t.Context(), bins.Driver, e2e.DriverConfig{
		Dir: dir, Name: driverName, Memory: true, Topology: true,
		Args: []string{"--enable-attach",
			"--require-create-secret=" + secretKey + "=" + secretValue,
			"--require-delete-secret=" + secretKey + "=" + secretValue},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.driver.Stop(5 * time.Second) })
	if err := s.driver.RegisterNode(t.Context(), cp.Client()); err != nil {
		t.Fatal(err)
	}

	args := s.sidecarArgs(m)
	var env []string
	if slices.Contains(args, "--enable-capacity") {
		// The downward API's values, and the objects they name.
		env = []string{"NAMESPACE=" + s.ns, "POD_NAME=" + capacityPod}
		if s.owner, err = e2e.CreateOwnerChain(t.Context(), cp.Client(), s.ns, capacityPod); err != nil {
			t.Fatal(err)
		}
	}
	if slices.Contains(args, "--node-deployment") {
		env = append(env, "NODE_NAME="+s.driver.NodeID) // the pod's spec.nodeName
	}
	s.sidecar, err = e2e.StartSidecar(bins.Sidecar, e2e.SidecarConfig{
		Kubeconfig: kubeconfig, Socket: s.driver.Socket, LogPath: filepath.Join(dir, "sidecar.log"),
		Args: args, Env: env,
	})
	if err != nil {
		t.Fatal(err)
	}
	s.sidecar.StopAtCleanup(t, s.driver)
	return s
}

// sidecarArgs are the chart's arguments for the sidecar container (of the
// Deployment, or of the DaemonSet in node deployment), with
// $(ADDRESS) expanded to the driver's socket and --http-endpoint on a free
// loopback port, plus a shorter retry interval and more verbose logs.
func (s *rbacStack) sidecarArgs(m manifest) []string {
	s.t.Helper()
	var pod corev1.PodSpec
	if ds := m.find("DaemonSet"); len(ds) > 0 {
		pod = typed[appsv1.DaemonSet](s.t, ds[0]).Spec.Template.Spec
	} else {
		pod = typed[appsv1.Deployment](s.t, m.one(s.t, "Deployment")).Spec.Template.Spec
	}
	var args []string
	for _, c := range pod.Containers {
		if c.Name != sidecarName {
			continue
		}
		for _, a := range c.Args {
			switch {
			case strings.HasPrefix(a, "--http-endpoint="):
				a = "--http-endpoint=127.0.0.1:0"
			default:
				a = strings.ReplaceAll(a, "$(ADDRESS)", s.driver.Socket)
			}
			args = append(args, a)
		}
	}
	switch {
	case slices.Contains(args, "--node-deployment"):
		if !slices.Contains(args, "--leader-election=false") {
			s.t.Fatalf("the chart's sidecar args %q have leader election in node deployment", args)
		}
	case !slices.Contains(args, "--leader-election=true") || !slices.Contains(args, "--leader-election-namespace="+s.ns):
		s.t.Fatalf("the chart's sidecar args %q lack leader election in %s", args, s.ns)
	}
	// A short sweep interval, so that the sweep's list of VolumeSnapshots
	// runs within a test.
	return append(args, "--retry-interval-max=5s", "-v=4", "--snapshot-orphan-sweep-interval=1s")
}

// toObject encodes a typed object as a rendered object.
func toObject(t *testing.T, v any) object {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	u := &unstructured.Unstructured{}
	if err := u.UnmarshalJSON(b); err != nil {
		t.Fatal(err)
	}
	return object{Unstructured: u, JSON: b}
}

// writeImpersonatingKubeconfig copies the admin kubeconfig to path with
// every user impersonating user: the API server authorizes each request of
// the sidecar as the ServiceAccount, with its groups.
func writeImpersonatingKubeconfig(t *testing.T, admin, path, user string) {
	t.Helper()
	cfg, err := clientcmd.LoadFromFile(admin)
	if err != nil {
		t.Fatal(err)
	}
	for _, ai := range cfg.AuthInfos {
		ai.Impersonate = user
	}
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
}

// waitAuthorized waits until a SubjectAccessReview allows the
// ServiceAccount every verb of rules (RBAC changes reach the authorizer
// through a cache), so that a forbidden request of the sidecar is never a
// race with the bindings.
func (s *rbacStack) waitAuthorized(rules []rbacv1.PolicyRule) {
	s.t.Helper()
	ns := strings.Split(s.user, ":")[2]
	testutil.Eventually(s.t, 0, "the chart's RBAC not in effect for "+s.user, func(ctx context.Context) (bool, error) {
		for _, r := range rules {
			for _, group := range r.APIGroups {
				for _, res := range r.Resources {
					resource, sub, _ := strings.Cut(res, "/")
					for _, verb := range r.Verbs {
						review, err := s.cp.Client().AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
							Spec: authorizationv1.SubjectAccessReviewSpec{
								User:   s.user,
								Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
								ResourceAttributes: &authorizationv1.ResourceAttributes{
									Namespace: ns, Verb: verb, Group: group, Resource: resource, Subresource: sub,
								},
							},
						}, metav1.CreateOptions{})
						if err != nil {
							return false, err
						}
						if !review.Status.Allowed {
							return false, nil
						}
					}
				}
			}
		}
		return true, nil
	})
}

// class creates, as the admin, the secret and a StorageClass of the driver
// that names it.
func (s *rbacStack) class(mods ...func(*testutil.SCBuilder)) {
	s.t.Helper()
	ctx, c := s.t.Context(), s.cp.Client()
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: secretName, Namespace: s.ns},
		StringData: map[string]string{secretKey: secretValue},
	}
	if _, err := c.CoreV1().Secrets(s.ns).Create(ctx, secret, metav1.CreateOptions{}); err != nil {
		s.t.Fatal(err)
	}
	b := testutil.NewSC(s.className, s.driver.Name).
		Param("csi.storage.k8s.io/provisioner-secret-name", secretName).
		Param("csi.storage.k8s.io/provisioner-secret-namespace", s.ns)
	for _, mod := range mods {
		mod(b)
	}
	testutil.CreateClass(s.t, c, b.Obj())
}

// claim creates, as the admin, a 1Gi claim of the class; with volumeName,
// one that names that volume.
func (s *rbacStack) claim(name, volumeName string) *corev1.PersistentVolumeClaim {
	s.t.Helper()
	b := testutil.NewPVC(s.ns, name).Class(s.className).Size("1Gi").RV("")
	if volumeName != "" {
		b = b.VolumeName(volumeName)
	}
	created, err := s.cp.Client().CoreV1().PersistentVolumeClaims(s.ns).Create(s.t.Context(), b.Obj(), metav1.CreateOptions{})
	if err != nil {
		s.t.Fatal(err)
	}
	return created
}

// staticVolume creates, as the admin, an Available volume of the driver and
// the class with reclaim policy Retain: binding a claim to it is the
// binder's update of its claimRef.
func (s *rbacStack) staticVolume() *corev1.PersistentVolume {
	s.t.Helper()
	c := s.cp.Client()
	pv := testutil.NewPV("static-"+s.ns, s.driver.Name).Class(s.className).
		ReclaimPolicy(corev1.PersistentVolumeReclaimRetain).RV("").Obj()
	pv.Status = corev1.PersistentVolumeStatus{}
	created, err := c.CoreV1().PersistentVolumes().Create(s.t.Context(), pv, metav1.CreateOptions{})
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() {
		_ = c.CoreV1().PersistentVolumes().Delete(context.Background(), created.Name, metav1.DeleteOptions{})
	})
	return created
}

// waitClaimBound waits until the claim is Bound and returns its volume's name.
func (s *rbacStack) waitClaimBound(name string) string {
	s.t.Helper()
	var pvName string
	testutil.Eventually(s.t, 0, "claim "+name+" not Bound under the chart's RBAC", func(ctx context.Context) (bool, error) {
		got, err := s.cp.Client().CoreV1().PersistentVolumeClaims(s.ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		pvName = got.Spec.VolumeName
		return got.Status.Phase == corev1.ClaimBound, nil
	})
	return pvName
}

func (s *rbacStack) log() string {
	b, err := os.ReadFile(s.sidecar.LogPath)
	if err != nil {
		s.t.Fatal(err)
	}
	return string(b)
}

// forbiddenSeen reports whether the sidecar's log, or an event in the
// namespace (a ProvisioningFailed event carries the error too), matches re.
func (s *rbacStack) forbiddenSeen(ctx context.Context, re *regexp.Regexp) (bool, error) {
	if re.MatchString(s.log()) {
		return true, nil
	}
	events, err := s.cp.Client().CoreV1().Events(s.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return false, err
	}
	for _, e := range events.Items {
		if re.MatchString(e.Message) {
			return true, nil
		}
	}
	return false, nil
}
