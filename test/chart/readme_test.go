package chart

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
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
