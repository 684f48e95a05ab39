// Package chart tests what ships: the Helm chart and the kustomize manifests
// under deploy/sidecar, and the Dockerfiles.
//
//   - render_test.go renders the chart with helm template (default values,
//     ci/all-options-values.yaml and single options) and the manifests with
//     kustomize build, and asserts on the decoded objects, as
//     aws-ebs-csi-driver's helm-template tests do;
//   - apply_test.go applies every rendered object to a real kube-apiserver
//     (server-side dry-run, then for real, with strict field validation) and
//     installs the chart with helm install;
//   - rbac_test.go runs the real sidecar under the chart's RBAC only (through
//     impersonation of its ServiceAccount) and reads the API server's audit
//     log, then under that RBAC minus one rule, which must fail; and runs
//     both binaries with the rendered arguments;
//   - readme_test.go runs the commands of deploy/sidecar/README.md and
//     checks what the READMEs say about the chart's values, the RBAC and
//     the repository's layout;
//   - dockerfile_test.go checks the Dockerfiles without a Docker engine.
//
// helm and kustomize come from the HELM and KUSTOMIZE environment variables
// (the Makefile sets them) or from the tool cache (hack/tools/build.sh path).
// When they are missing the tests that need them skip with one line, unless
// CSI_PROVISIONER_REQUIRE_CONTROLPLANE is set (make test), where they fail.
package chart

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/yaml"

	"github.com/kube-storage/csi-provisioner/internal/controlplane"
)

// shared is one control plane for the apply and RBAC tests of this package.
// The render tests do not need it.
var shared *controlplane.ControlPlane

// auditLog is the API server's audit log (every request, at Metadata
// level): rbac_test.go reads which requests the sidecar made.
var auditLog string

const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: Metadata
`

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "csi-provisioner-chart-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() { _ = os.RemoveAll(dir) }()
	policy := filepath.Join(dir, "audit-policy.yaml")
	if err := os.WriteFile(policy, []byte(auditPolicy), 0o600); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	auditLog = filepath.Join(dir, "audit.log")
	return controlplane.RunMain(m, controlplane.Config{ExtraAPIServerArgs: []string{
		"--audit-policy-file=" + policy, "--audit-log-path=" + auditLog, "--audit-log-format=json",
	}}, &shared)
}

// Paths inside the checkout.
const (
	chartDir        = "deploy/sidecar/chart"
	allOptionsFile  = "deploy/sidecar/chart/ci/all-options-values.yaml"
	kustomizeDir    = "deploy/sidecar/kubernetes"
	sidecarName     = "csi-provisioner" // the sidecar's container name
	socketDirVolume = "socket-dir"
)

// repoPath returns the absolute path of rel inside the checkout.
func repoPath(t testing.TB, rel string) string {
	t.Helper()
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, filepath.FromSlash(rel))
}

var (
	toolsMu sync.Mutex
	tools   = map[string]string{}
)

// tool returns the path of a pinned tool binary: $env if set, else the
// tool cache's copy (hack/tools/build.sh path NAME). A missing binary skips
// the test with one line, or fails it under controlplane.RequireEnv.
func tool(t testing.TB, name, env string) string {
	t.Helper()
	toolsMu.Lock()
	defer toolsMu.Unlock()
	if p, ok := tools[name]; ok {
		return p
	}
	path := os.Getenv(env)
	if path == "" {
		out, err := exec.Command(repoPath(t, "hack/tools/build.sh"), "path", name).Output()
		if err != nil {
			t.Fatalf("hack/tools/build.sh path %s: %v", name, err)
		}
		path = filepath.Join(strings.TrimSpace(string(out)), name)
	}
	if fi, err := os.Stat(path); err != nil || fi.IsDir() {
		if os.Getenv(controlplane.RequireEnv) != "" {
			t.Fatalf("%s not found at %s (set %s or run `make tools`)", name, path, env)
		}
		t.Skipf("chart test skipped: %s not built; run `make tools`", name)
	}
	tools[name] = path
	return path
}

// run runs a tool in the checkout's root and returns its stdout; the error
// carries stderr.
func run(t testing.TB, bin string, args ...string) ([]byte, error) {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), bin, args...)
	cmd.Dir = repoPath(t, ".")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%s %s: %w\n%s", filepath.Base(bin), strings.Join(args, " "), err, stderr.String())
	}
	return stdout.Bytes(), nil
}

// helmTemplate runs `helm template RELEASE deploy/sidecar/chart --namespace
// NS ARGS...` and decodes the output.
func helmTemplate(t testing.TB, release, ns string, args ...string) (manifest, error) {
	t.Helper()
	out, err := run(t, tool(t, "helm", "HELM"),
		append([]string{"template", release, chartDir, "--namespace", ns}, args...)...)
	if err != nil {
		return nil, err
	}
	return decode(out)
}

// mustHelmTemplate is helmTemplate that fails the test on error.
func mustHelmTemplate(t testing.TB, release, ns string, args ...string) manifest {
	t.Helper()
	m, err := helmTemplate(t, release, ns, args...)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// kustomizeBuild renders deploy/sidecar/kubernetes. With ns != "", it builds
// an overlay in a temporary directory that sets the namespace, as the
// kustomization's comment tells users to do.
func kustomizeBuild(t testing.TB, ns string) manifest {
	t.Helper()
	return kustomizeBuildWith(t, ns, "")
}

// kustomizeBuildWith is kustomizeBuild with extra appended to the overlay's
// kustomization.yaml (ns must not be empty then).
func kustomizeBuildWith(t testing.TB, ns, extra string) manifest {
	t.Helper()
	dir := repoPath(t, kustomizeDir)
	if ns != "" {
		overlay := t.TempDir()
		rel, err := filepath.Rel(overlay, dir)
		if err != nil {
			t.Fatal(err)
		}
		k := fmt.Sprintf("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nnamespace: %s\nresources:\n  - %s\n", ns, filepath.ToSlash(rel)) + extra
		if err := os.WriteFile(filepath.Join(overlay, "kustomization.yaml"), []byte(k), 0o600); err != nil {
			t.Fatal(err)
		}
		dir = overlay
	}
	out, err := run(t, tool(t, "kustomize", "KUSTOMIZE"), "build", dir)
	if err != nil {
		t.Fatal(err)
	}
	m, err := decode(out)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// object is one rendered document.
type object struct {
	*unstructured.Unstructured
	// JSON is the document converted to JSON, for strict typed decoding.
	JSON []byte
}

// ID is "Kind namespace/name" or "Kind name".
func (o object) ID() string {
	if ns := o.GetNamespace(); ns != "" {
		return o.GetKind() + " " + ns + "/" + o.GetName()
	}
	return o.GetKind() + " " + o.GetName()
}

// manifest is a rendered list of objects, in output order.
type manifest []object

// decode splits a multi-document YAML stream and decodes every non-empty
// document.
func decode(b []byte) (manifest, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(b)))
	var m manifest
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return m, nil
		}
		if err != nil {
			return nil, err
		}
		j, err := yaml.YAMLToJSON(doc)
		if err != nil {
			return nil, fmt.Errorf("%w in document:\n%s", err, doc)
		}
		if string(bytes.TrimSpace(j)) == "null" {
			continue // only comments
		}
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(j); err != nil {
			return nil, fmt.Errorf("%w in document:\n%s", err, doc)
		}
		m = append(m, object{Unstructured: u, JSON: j})
	}
}

// find returns the objects of kind, in output order.
func (m manifest) find(kind string) []object {
	var out []object
	for _, o := range m {
		if o.GetKind() == kind {
			out = append(out, o)
		}
	}
	return out
}

// one returns the only object of kind, failing the test otherwise.
func (m manifest) one(t testing.TB, kind string) object {
	t.Helper()
	objs := m.find(kind)
	if len(objs) != 1 {
		t.Fatalf("want exactly one %s, got %d: %v", kind, len(objs), m.ids())
	}
	return objs[0]
}

// kinds returns the sorted, de-duplicated kinds.
func (m manifest) kinds() []string {
	set := map[string]bool{}
	for _, o := range m {
		set[o.GetKind()] = true
	}
	out := make([]string, 0, len(set))
	for k := range set {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func (m manifest) ids() []string {
	out := make([]string, 0, len(m))
	for _, o := range m {
		out = append(out, o.ID())
	}
	return out
}

// typed decodes o into a new T, rejecting fields T does not have, so a
// misspelt field in a template fails the test instead of being dropped.
func typed[T any](t testing.TB, o object) *T {
	t.Helper()
	out := new(T)
	dec := json.NewDecoder(bytes.NewReader(o.JSON))
	dec.DisallowUnknownFields()
	if err := dec.Decode(out); err != nil {
		t.Fatalf("%s: strict decode into %T: %v", o.ID(), out, err)
	}
	return out
}

// strictDecodeAll decodes every object of a kind client-go knows into its Go
// type, rejecting unknown fields; others (ServiceMonitor) are returned.
func strictDecodeAll(t testing.TB, m manifest) (unknownKinds []string) {
	t.Helper()
	for _, o := range m {
		gvk := schema.FromAPIVersionAndKind(o.GetAPIVersion(), o.GetKind())
		obj, err := scheme.Scheme.New(gvk)
		if err != nil {
			unknownKinds = append(unknownKinds, gvk.String())
			continue
		}
		dec := json.NewDecoder(bytes.NewReader(o.JSON))
		dec.DisallowUnknownFields()
		if err := dec.Decode(obj); err != nil {
			t.Errorf("%s: strict decode into %T: %v", o.ID(), obj, err)
		}
	}
	return unknownKinds
}
