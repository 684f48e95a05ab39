package chart

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-storage/csi-provisioner/internal/controlplane"
	"github.com/kube-storage/csi-provisioner/internal/e2e"
	"github.com/kube-storage/csi-provisioner/internal/testutil"
	"github.com/kube-storage/csi-provisioner/pkg/refgrant"
)

// TestRBACLeastPrivilege runs the real sidecar with only the chart's RBAC
// (impersonating the chart's ServiceAccount) through provision, bind and
// delete of one claim: nothing may be forbidden. Then, for rules the flow
// uses, it runs the sidecar with that rule's verb removed: the sidecar must
// be refused (a Forbidden error in its log) and, where the rule gates
// binding, the claim must not bind. So a missing rule fails the first test,
// and a rule that could be dropped would show up as a case that does not
// fail.
func TestRBACLeastPrivilege(t *testing.T) {
	cp := controlplane.Need(t, shared)
	tool(t, "helm", "HELM")
	bins, err := e2e.Build(t.Context(), "")
	if err != nil {
		t.Fatalf("build the sidecar and the driver: %v", err)
	}
	if err := e2e.InstallSnapshotCRDs(t.Context(), cp.AdminConfig()); err != nil {
		t.Fatal(err)
	}
	if err := e2e.InstallReferenceGrantCRD(t.Context(), cp.AdminConfig()); err != nil {
		t.Fatal(err)
	}

	t.Run("chart rules", func(t *testing.T) {
		s := startUnderChartRBAC(t, cp, bins, "full", nil)
		c := cp.Client()
		if err := s.sidecar.WaitLog(t.Context(), "Started provisioner controller"); err != nil {
			t.Fatal(err)
		}
		s.class()
		claim := s.claim("data", "")
		pvName := s.waitClaimBound(claim.Name)
		pv, err := c.CoreV1().PersistentVolumes().Get(t.Context(), pvName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if pv.Status.Phase != corev1.VolumeBound {
			t.Errorf("PV %s phase %s, want Bound", pv.Name, pv.Status.Phase)
		}
		if err := c.CoreV1().PersistentVolumeClaims(s.ns).Delete(t.Context(), claim.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, 0, "PV "+pvName+" not deleted under the chart's RBAC", func(ctx context.Context) (bool, error) {
			_, err := c.CoreV1().PersistentVolumes().Get(ctx, pvName, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return true, nil
			}
			return false, err
		})
		testutil.Eventually(t, 0, "the driver still has volumes", func(ctx context.Context) (bool, error) {
			vols, err := s.driver.ListVolumes(ctx)
			return len(vols) == 0, err
		})

		// A static volume: bound to the claim that names it, Released when
		// the claim goes (reclaim policy Retain).
		static := s.staticVolume()
		staticClaim := s.claim("static", static.Name)
		if got := s.waitClaimBound(staticClaim.Name); got != static.Name {
			t.Errorf("static claim bound to %s, want %s", got, static.Name)
		}
		if err := c.CoreV1().PersistentVolumeClaims(s.ns).Delete(t.Context(), staticClaim.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, 0, "static PV not Released", func(ctx context.Context) (bool, error) {
			got, err := c.CoreV1().PersistentVolumes().Get(ctx, static.Name, metav1.GetOptions{})
			return err == nil && got.Status.Phase == corev1.VolumeReleased, err
		})

		// A restore from a VolumeSnapshot: its reads and the source
		// protection, and the sweep's list.
		s.checkRestored(s.restore())

		// Leader election used the Role in the release's namespace.
		leases, err := c.CoordinationV1().Leases(s.ns).List(t.Context(), metav1.ListOptions{})
		if err != nil || len(leases.Items) != 1 {
			t.Errorf("leases in %s: %v, %v; want the sidecar's", s.ns, leases, err)
		}
		for _, line := range strings.Split(s.log(), "\n") {
			// Before v1.34 kube-apiserver refuses client-go's streaming
			// list (sendInitialEvents) as a Forbidden field value, not
			// for RBAC; client-go then falls back to a plain list.
			if strings.Contains(strings.ToLower(line), "forbidden") && !strings.Contains(line, "sendInitialEvents") {
				t.Errorf("forbidden under the chart's RBAC: %s", line)
			}
		}

		// What the sidecar did, from the API server's audit log: nothing
		// refused, and the granted verbs this flow did not use: reads next
		// to list/watch; list itself, which informers use on API servers
		// without streaming lists; and get of volumeattributesclasses,
		// which needs a driver with MODIFY_VOLUME (the example has none).
		if err := s.sidecar.Stop(10 * time.Second); err != nil {
			t.Fatal(err)
		}
		used, refused := auditedRequests(t, s.user)
		for _, r := range refused {
			t.Errorf("the API server refused the sidecar %s", r)
		}
		var unused []string
		for _, g := range ruleKeys(append(slices.Clone(wantClusterRules), wantLeaseRules...)) {
			if !slices.Contains(used, g) {
				unused = append(unused, g)
			}
		}
		t.Logf("requests of the sidecar: %s", strings.Join(used, ", "))
		t.Logf("granted, not used by this flow: %s", strings.Join(unused, ", "))
		// The snapshot cache: a restore waiting for its snapshot goes on
		// when the snapshot is ready.
		if want := snapshotGroup + "/volumesnapshots watch"; !slices.Contains(used, want) {
			t.Errorf("the sidecar did not %s", want)
		}
	})

	// Without watch on volumesnapshots (a ClusterRole from before this
	// rule): the sidecar says so once at start and restores as before.
	t.Run("without watch volumesnapshots", func(t *testing.T) {
		s := startUnderChartRBAC(t, cp, bins, "snapshot-watch", func(cr *rbacv1.ClusterRole, _ *rbacv1.Role) {
			cr.Rules = withoutVerb(t, cr.Rules, "volumesnapshots", "watch")
		})
		if err := s.sidecar.WaitLog(t.Context(), "The sidecar may not watch VolumeSnapshots"); err != nil {
			t.Fatal(err)
		}
		s.class()
		s.checkRestored(s.restore())
		if err := s.sidecar.Stop(10 * time.Second); err != nil {
			t.Fatal(err)
		}
		_, refused := auditedRequests(t, s.user)
		for _, r := range refused {
			t.Errorf("the API server refused the sidecar %s", r)
		}
	})

	t.Run("chart rules with capacity", func(t *testing.T) {
		s := startUnderChartRBAC(t, cp, bins, "capacity", nil, capacityValues...)
		if err := s.sidecar.WaitLog(t.Context(), "Started provisioner controller"); err != nil {
			t.Fatal(err)
		}
		s.class()
		testutil.Eventually(t, 0, "no CSIStorageCapacity object owned by the Deployment under the chart's RBAC", func(ctx context.Context) (bool, error) {
			list, err := cp.Client().StorageV1().CSIStorageCapacities(s.ns).List(ctx, metav1.ListOptions{})
			if err != nil {
				return false, err
			}
			for _, c := range list.Items {
				if c.StorageClassName == s.className && len(c.OwnerReferences) == 1 && c.OwnerReferences[0].UID == s.owner.UID {
					return true, nil
				}
			}
			return false, nil
		})
		if err := s.sidecar.Stop(10 * time.Second); err != nil {
			t.Fatal(err)
		}
		used, refused := auditedRequests(t, s.user)
		for _, r := range refused {
			t.Errorf("the API server refused the sidecar %s", r)
		}
		for _, want := range []string{"storage.k8s.io/csistoragecapacities create", "storage.k8s.io/csistoragecapacities watch", "/pods get", "apps/replicasets get"} {
			if !slices.Contains(used, want) {
				t.Errorf("the sidecar did not use %q; it used %s", want, strings.Join(used, ", "))
			}
		}
	})

	t.Run("chart rules in node deployment", func(t *testing.T) {
		s := startUnderChartRBAC(t, cp, bins, "node", nil, append([]string{"--set", "nodeDeployment.enabled=true"}, capacityValues...)...)
		c := cp.Client()
		if err := s.sidecar.WaitLog(t.Context(), "Started provisioner controller"); err != nil {
			t.Fatal(err)
		}
		s.class(func(b *testutil.SCBuilder) { b.WaitForFirstConsumer() })
		// The scheduler's node and kube-controller-manager's annotation
		// (its binder binds in this mode; it does not run here).
		b := testutil.NewPVC(s.ns, "data").Class(s.className).Size("1Gi").RV("").
			Annotation("volume.kubernetes.io/storage-provisioner", s.driver.Name).
			Annotation("volume.kubernetes.io/selected-node", s.driver.NodeID)
		claim, err := c.CoreV1().PersistentVolumeClaims(s.ns).Create(t.Context(), b.Obj(), metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, 0, "no PV provisioned for the claim in node deployment under the chart's RBAC", func(ctx context.Context) (bool, error) {
			pvs, err := c.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
			if err != nil {
				return false, err
			}
			return slices.ContainsFunc(pvs.Items, func(pv corev1.PersistentVolume) bool {
				return pv.Spec.ClaimRef != nil && pv.Spec.ClaimRef.UID == claim.UID
			}), nil
		})
		// The pod owns its node's objects (level 0, as upstream's
		// distributed deployment), read without get replicasets.
		testutil.Eventually(t, 0, "no CSIStorageCapacity of this node owned by the pod's owner", func(ctx context.Context) (bool, error) {
			list, err := c.StorageV1().CSIStorageCapacities(s.ns).List(ctx, metav1.ListOptions{})
			if err != nil {
				return false, err
			}
			return slices.ContainsFunc(list.Items, func(o storagev1.CSIStorageCapacity) bool {
				return o.StorageClassName == s.className && len(o.OwnerReferences) == 1 && o.OwnerReferences[0].Kind == "Pod" &&
					o.Labels["csi.storage.k8s.io/managed-by"] == "external-provisioner-"+s.driver.NodeID
			}), nil
		})
		if err := s.sidecar.Stop(10 * time.Second); err != nil {
			t.Fatal(err)
		}
		_, refused := auditedRequests(t, s.user)
		for _, r := range refused {
			t.Errorf("the API server refused the sidecar %s", r)
		}
	})

	t.Run("chart rules with cross-namespace data sources", func(t *testing.T) {
		s := startUnderChartRBAC(t, cp, bins, "crossns", nil, crossNamespaceValues...)
		if err := s.sidecar.WaitLog(t.Context(), "Started provisioner controller"); err != nil {
			t.Fatal(err)
		}
		if err := s.sidecar.Stop(10 * time.Second); err != nil {
			t.Fatal(err)
		}
		used, refused := auditedRequests(t, s.user)
		for _, r := range refused {
			t.Errorf("the API server refused the sidecar %s", r)
		}
		for _, want := range []string{"gateway.networking.k8s.io/referencegrants list", "gateway.networking.k8s.io/referencegrants watch"} {
			if !slices.Contains(used, want) {
				t.Errorf("the sidecar did not %s; its requests: %v", want, used)
			}
		}
	})

	for _, tc := range []struct {
		name     string
		kind     string // ClusterRole or Role
		resource string
		verb     string
		// unbound: without this rule the claim can never become Bound.
		unbound bool
		// claim is the claim to create: "dynamic", "static" (it names a
		// static volume) or "restore" (from a VolumeSnapshot).
		claim string
		// values are extra helm arguments.
		values []string
		// exits: without the rule the sidecar stops at start.
		exits bool
	}{
		{"pv-create", "ClusterRole", "persistentvolumes", "create", true, "dynamic", nil, false},
		// The binder's permissions (upstream's ClusterRole lacks them):
		// checked at start.
		{"pv-update", "ClusterRole", "persistentvolumes", "update", true, "static", nil, true},
		{"pv-status", "ClusterRole", "persistentvolumes/status", "update", true, "static", nil, true},
		{"pvc-status", "ClusterRole", "persistentvolumeclaims/status", "update", true, "dynamic", nil, true},
		{"pods", "ClusterRole", "pods", "watch", false, "dynamic", nil, true},
		{"secrets", "ClusterRole", "secrets", "get", true, "dynamic", nil, false},
		{"csinodes", "ClusterRole", "csinodes", "watch", false, "dynamic", nil, false},
		{"attachments", "ClusterRole", "volumeattachments", "watch", false, "dynamic", nil, false},
		{"events", "ClusterRole", "events", "create", false, "dynamic", nil, false},
		{"leases", "Role", "leases", "create", true, "dynamic", nil, false},
		{"snapshots", "ClusterRole", "volumesnapshots", "get", true, "restore", nil, false},
		{"snapshotcontents", "ClusterRole", "volumesnapshotcontents", "get", true, "restore", nil, false},
		// Without update the restore goes on unprotected, as upstream.
		{"snapshot-update", "ClusterRole", "volumesnapshots", "update", false, "restore", nil, false},
		{"snapshot-list", "ClusterRole", "volumesnapshots", "list", false, "dynamic", nil, false},
		// sidecar.capacity: the objects, and the owner lookup at start.
		{"capacity-create", "Role", "csistoragecapacities", "create", false, "dynamic", capacityValues, false},
		{"capacity-owner", "Role", "replicasets", "get", false, "dynamic", capacityValues, true},
		// sidecar.crossNamespaceDataSource: checked at start.
		{"referencegrants", "ClusterRole", "referencegrants", "list", false, "dynamic", crossNamespaceValues, true},
	} {
		t.Run("without "+tc.verb+" "+tc.resource, func(t *testing.T) {
			s := startUnderChartRBAC(t, cp, bins, tc.name, func(cr *rbacv1.ClusterRole, r *rbacv1.Role) {
				rules := &cr.Rules
				if tc.kind == "Role" {
					rules = &r.Rules
				}
				*rules = withoutVerb(t, *rules, tc.resource, tc.verb)
			}, tc.values...)
			s.waitDenied(tc.resource, tc.verb)
			// klog quotes the error, so its quotes may be escaped.
			forbidden := regexp.MustCompile(fmt.Sprintf(`cannot %s resource \\?"%s\\?"`, tc.verb, regexp.QuoteMeta(tc.resource)))
			if tc.exits {
				select {
				case <-s.sidecar.Exited():
				case <-time.After(testutil.DefaultTimeout):
					t.Fatalf("the sidecar still runs without %s %s", tc.verb, tc.resource)
				}
				if !forbidden.MatchString(s.log()) {
					t.Errorf("the sidecar stopped without naming the refused %s %s:\n%s", tc.verb, tc.resource, s.log())
				}
				return
			}
			s.class()
			var claim *corev1.PersistentVolumeClaim
			switch tc.claim {
			case "static":
				claim = s.claim("static", s.staticVolume().Name)
			case "restore":
				claim = s.restore()
			default:
				claim = s.claim("data", "")
			}
			testutil.Eventually(t, 0, "no Forbidden error for "+tc.verb+" "+tc.resource, func(ctx context.Context) (bool, error) {
				select {
				case <-s.sidecar.Exited():
					return false, fmt.Errorf("the sidecar exited: %w", s.sidecar.ExitErr())
				default:
				}
				return s.forbiddenSeen(ctx, forbidden)
			})
			if !tc.unbound {
				return
			}
			got, err := cp.Client().CoreV1().PersistentVolumeClaims(s.ns).Get(t.Context(), claim.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if got.Status.Phase == corev1.ClaimBound {
				t.Errorf("claim Bound to %s without %s %s", got.Spec.VolumeName, tc.verb, tc.resource)
			}
		})
	}
}

// ruleKeys lists "group/resource verb" for every verb of rules ("" is the
// core group).
func ruleKeys(rules []rbacv1.PolicyRule) []string {
	var out []string
	for _, r := range rules {
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				for _, v := range r.Verbs {
					out = append(out, g+"/"+res+" "+v)
				}
			}
		}
	}
	slices.Sort(out)
	return out
}

// auditedRequests reads the audit log for requests made as user (through
// impersonation) and returns their sorted "group/resource verb" keys, and
// those of the refused ones.
func auditedRequests(t *testing.T, user string) (used, refused []string) {
	t.Helper()
	f, err := os.Open(auditLog)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	type auditEvent struct {
		Verb             string `json:"verb"`
		ImpersonatedUser *struct {
			Username string `json:"username"`
		} `json:"impersonatedUser"`
		ObjectRef *struct {
			Resource    string `json:"resource"`
			Subresource string `json:"subresource"`
			APIGroup    string `json:"apiGroup"`
		} `json:"objectRef"`
		ResponseStatus *struct {
			Code int `json:"code"`
		} `json:"responseStatus"`
	}
	seen, denied := map[string]bool{}, map[string]bool{}
	dec := json.NewDecoder(f)
	for {
		var e auditEvent
		if err := dec.Decode(&e); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			t.Fatalf("audit log %s: %v", auditLog, err)
		}
		if e.ImpersonatedUser == nil || e.ImpersonatedUser.Username != user || e.ObjectRef == nil {
			continue
		}
		res := e.ObjectRef.Resource
		if e.ObjectRef.Subresource != "" {
			res += "/" + e.ObjectRef.Subresource
		}
		key := e.ObjectRef.APIGroup + "/" + res + " " + e.Verb
		if e.ResponseStatus != nil && e.ResponseStatus.Code == http.StatusForbidden {
			denied[key] = true
		} else {
			seen[key] = true
		}
	}
	return slices.Sorted(maps.Keys(seen)), slices.Sorted(maps.Keys(denied))
}

// withoutVerb returns rules with verb removed from the rule for resource;
// it fails the test if no rule grants it.
func withoutVerb(t *testing.T, rules []rbacv1.PolicyRule, resource, verb string) []rbacv1.PolicyRule {
	t.Helper()
	out := make([]rbacv1.PolicyRule, 0, len(rules))
	found := false
	for _, r := range rules {
		r = *r.DeepCopy()
		if slices.Contains(r.Resources, resource) && slices.Contains(r.Verbs, verb) {
			found = true
			r.Verbs = slices.DeleteFunc(r.Verbs, func(v string) bool { return v == verb })
			if len(r.Verbs) == 0 {
				continue
			}
		}
		out = append(out, r)
	}
	if !found {
		t.Fatalf("no rule grants %s %s", verb, resource)
	}
	return out
}

// waitDenied checks, with a SubjectAccessReview, that the ServiceAccount is
// refused verb on resource.
func (s *rbacStack) waitDenied(res, verb string) {
	s.t.Helper()
	resource, sub, _ := strings.Cut(res, "/")
	group := ""
	switch resource {
	case "csinodes", "volumeattachments", "storageclasses", "volumeattributesclasses", "csistoragecapacities":
		group = storagev1.GroupName
	case "replicasets":
		group = appsv1.GroupName
	case "leases":
		group = "coordination.k8s.io"
	case "volumesnapshots", "volumesnapshotcontents":
		group = snapshotGroup
	case "referencegrants":
		group = refgrant.Group
	}
	review, err := s.cp.Client().AuthorizationV1().SubjectAccessReviews().Create(s.t.Context(), &authorizationv1.SubjectAccessReview{
		Spec: authorizationv1.SubjectAccessReviewSpec{
			User:   s.user,
			Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + s.ns, "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{
				Namespace: s.ns, Verb: verb, Group: group, Resource: resource, Subresource: sub,
			},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		s.t.Fatal(err)
	}
	if review.Status.Allowed {
		s.t.Fatalf("%s is still allowed %s %s: %s", s.user, verb, res, review.Status.Reason)
	}
}

// TestManifestArgsAccepted runs the real binaries with the arguments the
// chart (default and all-options values) and the kustomize manifests give
// them, plus --version: the flags are parsed before --version is honoured,
// so a misspelt or unknown flag fails here.
func TestManifestArgsAccepted(t *testing.T) {
	tool(t, "helm", "HELM")
	tool(t, "kustomize", "KUSTOMIZE")
	bins, err := e2e.Build(t.Context(), "")
	if err != nil {
		t.Fatalf("build the sidecar and the driver: %v", err)
	}
	renders := map[string]manifest{
		"chart defaults":    mustHelmTemplate(t, "csi", "default"),
		"chart all options": mustHelmTemplate(t, "csi", "default", "-f", allOptionsFile),
		"kustomize":         kustomizeBuild(t, ""),
	}
	for name, m := range renders {
		d := typed[appsv1.Deployment](t, m.one(t, "Deployment"))
		for _, c := range d.Spec.Template.Spec.Containers {
			bin := bins.Sidecar
			switch {
			case c.Name == sidecarName:
			case strings.Contains(c.Image, "/hostpath-driver:"):
				bin = bins.Driver
			default:
				continue // a vendor's driver
			}
			out, err := exec.CommandContext(t.Context(), bin, append(slices.Clone(c.Args), "--version")...).CombinedOutput()
			if err != nil {
				t.Errorf("%s: %s %q refused: %v\n%s", name, c.Name, c.Args, err, out)
			}
		}
	}
}
