package chart

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	rbacv1 "k8s.io/api/rbac/v1"
)

// TestReadmeCommands runs the helm and kustomize commands of
// deploy/sidecar/README.md (helm install as helm template, since there is
// no cluster) with its example vendor-values.yaml, so the page cannot drift
// from the chart.
func TestReadmeCommands(t *testing.T) {
	helm := tool(t, "helm", "HELM")
	kustomize := tool(t, "kustomize", "KUSTOMIZE")
	b, err := os.ReadFile(repoPath(t, "deploy/sidecar/README.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?ms)^```(\\w+)\\n(.*?)^```").FindAllStringSubmatch(string(b), -1)
	vendorValues := filepath.Join(t.TempDir(), "vendor-values.yaml")
	var commands []string
	for _, blk := range blocks {
		switch lang, body := blk[1], blk[2]; {
		case lang == "yaml" && strings.HasPrefix(body, "driver:"):
			if err := os.WriteFile(vendorValues, []byte(body), 0o600); err != nil {
				t.Fatal(err)
			}
		case lang == "sh":
			for _, line := range strings.Split(body, "\n") {
				if strings.HasPrefix(line, "helm ") || strings.HasPrefix(line, "kustomize ") {
					commands = append(commands, line)
				}
			}
		}
	}
	if _, err := os.Stat(vendorValues); err != nil {
		t.Fatal("README.md has no ```yaml block starting with driver: (the vendor values)")
	}
	if len(commands) < 4 {
		t.Fatalf("README.md has only these helm/kustomize commands: %q", commands)
	}
	for _, line := range commands {
		t.Run(line, func(t *testing.T) {
			args := strings.Fields(line)
			for i, a := range args {
				if a == "vendor-values.yaml" {
					args[i] = vendorValues
				}
			}
			bin := kustomize
			if args[0] == "helm" {
				bin = helm
				if args[1] == "install" {
					args[1] = "template"
				}
			}
			out, err := run(t, bin, args[1:]...)
			if err != nil {
				t.Fatal(err)
			}
			if args[1] != "template" || !slices.Contains(args, vendorValues) {
				return
			}
			// The vendor's driver replaces the example.
			m, err := decode(out)
			if err != nil {
				t.Fatal(err)
			}
			d := typed[appsv1.Deployment](t, m.one(t, "Deployment"))
			drv := container(t, d, "csi-driver")
			if drv.Image != "registry.example.com/acme/csi-driver:v1.4.2" || len(drv.VolumeMounts) != 1 || len(d.Spec.Template.Spec.Volumes) != 1 {
				t.Errorf("driver container %+v, pod volumes %+v", drv, d.Spec.Template.Spec.Volumes)
			}
			if name := m.one(t, "CSIDriver").GetName(); name != "block.csi.acme.example.com" {
				t.Errorf("CSIDriver %s", name)
			}
			if args := container(t, d, sidecarName).Args; flagCount(args, "timeout") != 1 || !slices.Contains(args, "--timeout=120s") {
				t.Errorf("sidecar args %q, want --timeout=120s once", args)
			}
		})
	}
}

// TestRootReadmeHelmCommands keeps the top-level README's "Install with
// Helm" commands identical to the ones TestReadmeCommands runs.
func TestRootReadmeHelmCommands(t *testing.T) {
	root, err := os.ReadFile(repoPath(t, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	deploy, err := os.ReadFile(repoPath(t, "deploy/sidecar/README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(root), "## Install with Helm\n")
	if !ok {
		t.Fatal(`README.md has no "## Install with Helm" section`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	var n int
	for _, blk := range regexp.MustCompile("(?ms)^```sh\\n(.*?)^```").FindAllStringSubmatch(section, -1) {
		for _, line := range strings.Split(strings.TrimSpace(blk[1]), "\n") {
			n++
			if !strings.Contains(string(deploy), line+"\n") {
				t.Errorf("README.md command %q is not one of deploy/sidecar/README.md's tested commands", line)
			}
		}
	}
	if n < 2 {
		t.Errorf("README.md's Install with Helm section has %d commands", n)
	}
}

// upstreamClusterRules are the rules of upstream external-provisioner
// v6.3.0's ClusterRole external-provisioner-runner
// (deploy/kubernetes/rbac.yaml; its secrets and referencegrants rules are
// commented out there).
var upstreamClusterRules = []rbacv1.PolicyRule{
	rule("", "persistentvolumes", "get", "list", "watch", "create", "patch", "delete"),
	rule("", "persistentvolumeclaims", "get", "list", "watch", "update"),
	rule("storage.k8s.io", "storageclasses", "get", "list", "watch"),
	rule("", "events", "list", "watch", "create", "update", "patch"),
	rule("snapshot.storage.k8s.io", "volumesnapshots", "get", "list", "watch", "update"),
	rule("snapshot.storage.k8s.io", "volumesnapshotcontents", "get", "list"),
	rule("storage.k8s.io", "csinodes", "get", "list", "watch"),
	rule("", "nodes", "get", "list", "watch"),
	rule("storage.k8s.io", "volumeattachments", "get", "list", "watch"),
}

// TestRootReadmeRBACBeyondUpstream: the top-level README's Compatibility
// section says which permissions the sidecar needs beyond upstream's
// ClusterRole; a user who migrates by adding them to upstream's rules must
// get every verb the chart grants, so each resource with an added verb,
// and the verb, must be named there.
func TestRootReadmeRBACBeyondUpstream(t *testing.T) {
	b, err := os.ReadFile(repoPath(t, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, sentence, ok := strings.Cut(strings.Join(strings.Fields(string(b)), " "), "RBAC: the upstream rules plus ")
	if !ok {
		t.Fatal(`README.md has no "RBAC: the upstream rules plus" sentence`)
	}
	sentence, _, _ = strings.Cut(sentence, ". ")
	upstream := map[string][]string{}
	for _, r := range upstreamClusterRules {
		upstream[r.Resources[0]] = r.Verbs
	}
	named := func(word string) bool {
		// A whole word: persistentvolumes is not named by persistentvolumes/status.
		return regexp.MustCompile(`(^|[^\w/])` + regexp.QuoteMeta(word) + `([^\w/]|$)`).MatchString(sentence)
	}
	for _, r := range wantClusterRules {
		for _, verb := range r.Verbs {
			if slices.Contains(upstream[r.Resources[0]], verb) {
				continue
			}
			if !named(r.Resources[0]) || !named(verb) {
				t.Errorf("README.md's %q does not name %s on %s, which the chart grants and upstream does not", sentence, verb, r.Resources[0])
			}
		}
	}
}

// rootReadmeSection returns the body of the top-level README's section
// headed by the line heading (e.g. "### Layout"), up to the next heading of
// the same or a higher level.
func rootReadmeSection(t *testing.T, heading string) string {
	t.Helper()
	b, err := os.ReadFile(repoPath(t, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, body, ok := strings.Cut(string(b), "\n"+heading+"\n")
	if !ok {
		t.Fatalf("README.md has no %q section", heading)
	}
	level := strings.IndexByte(heading, ' ')
	var lines []string
	for _, line := range strings.Split(body, "\n") {
		if n := len(line) - len(strings.TrimLeft(line, "#")); n > 0 && n <= level && strings.HasPrefix(line[n:], " ") {
			break
		}
		lines = append(lines, line)
	}
	return strings.Join(lines, "\n")
}

// TestRootReadmeLayout: the top-level README's Layout table names every
// package directory under cmd/, pkg/, internal/ and examples/ (a reader
// looking for where something lives must not miss one), and every path it
// names exists.
func TestRootReadmeLayout(t *testing.T) {
	section := rootReadmeSection(t, "### Layout")
	named := map[string]bool{}
	for _, m := range regexp.MustCompile("(?m)^\\| `([^`]+)` \\|").FindAllStringSubmatch(section, -1) {
		path := strings.TrimSuffix(m[1], "/")
		named[path] = true
		if _, err := os.Stat(repoPath(t, path)); err != nil {
			t.Errorf("README.md's Layout names %s: %v", path, err)
		}
	}
	for _, parent := range []string{"cmd", "pkg", "internal", "examples"} {
		entries, err := os.ReadDir(repoPath(t, parent))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if path := parent + "/" + e.Name(); e.IsDir() && !named[path] {
				t.Errorf("README.md's Layout does not name %s", path)
			}
		}
	}
}

// TestReadmeValuesExist: every chart value the READMEs name
// (`sidecar.capacity.enabled`, `serviceAccount.{create,name}`) is a key of
// values.yaml, so renaming a value cannot leave the pages pointing at a
// value the schema now rejects.
func TestReadmeValuesExist(t *testing.T) {
	var values map[string]any
	readYAML(t, chartDir+"/values.yaml", &values)
	token := regexp.MustCompile("`([a-z][a-zA-Z]*(?:\\.[a-zA-Z]+|\\.\\{[a-zA-Z,]+\\})+)`")
	for _, page := range []string{"README.md", "deploy/sidecar/README.md"} {
		b, err := os.ReadFile(repoPath(t, page))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range token.FindAllStringSubmatch(string(b), -1) {
			path := m[1]
			if _, top := values[strings.Split(path, ".")[0]]; !top || strings.HasSuffix(path, ".yaml") {
				continue // not a chart value: a Go name, a field, a file
			}
			prefix, alts, braced := strings.Cut(path, "{")
			keys := []string{path}
			if braced {
				keys = nil
				for _, alt := range strings.Split(strings.TrimSuffix(alts, "}"), ",") {
					keys = append(keys, prefix+alt)
				}
			}
			for _, key := range keys {
				var node any = values
				for _, seg := range strings.Split(key, ".") {
					mp, _ := node.(map[string]any)
					var ok bool
					if node, ok = mp[seg]; !ok {
						t.Errorf("%s names the chart value %s; values.yaml has no %s", page, path, key)
						break
					}
				}
			}
		}
	}
}
