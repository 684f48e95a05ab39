package e2e

import (
	"debug/elf"
	"strings"
	"testing"

	"github.com/kube-storage/csi-provisioner/internal/e2e"
)

// TestBinaryPrunesUnusedMethods checks that the sidecar that ships lets the
// linker drop unused methods. One reachable caller of reflect's
// Value.MethodByName (html/template, pulled in by gRPC's tracing unless the
// grpcnotrace tag is set) makes the linker keep every exported method of
// every type in the binary: then client-go's typed clients for every API
// group stay whole, and the code and tables the process maps nearly double
// (65 MB instead of 37), which shows in its resident memory.
func TestBinaryPrunesUnusedMethods(t *testing.T) {
	bins, err := e2e.Build(t.Context(), "")
	if err != nil {
		t.Fatal(err)
	}
	f, err := elf.Open(bins.Sidecar)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	syms, err := f.Symbols()
	if err != nil {
		t.Fatalf("%s has no symbol table to check (built with -s?): %v", bins.Sidecar, err)
	}
	if len(syms) < 1000 {
		t.Fatalf("%s has %d symbols; too few to tell what was linked", bins.Sidecar, len(syms))
	}
	unwanted := []string{
		"html/template.",
		"golang.org/x/net/trace.",
		// The sidecar never touches Deployments; their client's methods
		// stay only when method pruning is off.
		"k8s.io/client-go/kubernetes/typed/apps/v1.(*deployments).",
	}
	found := map[string]int{}
	for _, s := range syms {
		for _, prefix := range unwanted {
			if strings.HasPrefix(s.Name, prefix) {
				found[prefix]++
			}
		}
	}
	for _, prefix := range unwanted {
		if n := found[prefix]; n > 0 {
			t.Errorf("%s links %d symbols %s* (build with -tags %s, as `make build` does)", bins.Sidecar, n, prefix, e2e.BuildTags)
		}
	}
	var mapped uint64
	for _, name := range []string{".text", ".rodata", ".gopclntab"} {
		if s := f.Section(name); s != nil {
			mapped += s.Size
		}
	}
	t.Logf("%s: %.1f MB of code, read-only data and function tables", bins.Sidecar, float64(mapped)/1e6)
}
