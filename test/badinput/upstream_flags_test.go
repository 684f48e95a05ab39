package badinput

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kube-storage/csi-provisioner/internal/controlplane"
	"github.com/kube-storage/csi-provisioner/internal/e2e"
)

// The parity tests below run upstream external-provisioner's binary (the
// version pinned in hack/tools/versions.env) and ours side by side, with
// nothing to connect to: a vendor who swaps the image keeps the
// Deployment's args and env, so whatever upstream accepts must be accepted
// here too, or be a difference README.md documents.

// parityBinaries returns upstream's binary and ours. Without upstream's
// binary the test is skipped, unless the control plane is required (make
// test), which builds it (make tools-test).
func parityBinaries(t *testing.T) (upstream, ours string) {
	t.Helper()
	upstream, err := e2e.UpstreamProvisioner()
	if err != nil {
		if os.Getenv(controlplane.RequireEnv) != "" || !errors.Is(err, controlplane.ErrBinariesMissing) {
			t.Fatalf("the flag parity tests need upstream external-provisioner (hack/tools/build.sh external-provisioner): %v", err)
		}
		t.Skipf("flag parity test skipped: %v", err)
	}
	bins, err := e2e.Build(t.Context(), "")
	if err != nil {
		t.Fatal(err)
	}
	return upstream, bins.Sidecar
}

// binRun is how a run of a binary ended.
type binRun struct {
	code           int
	stdout, stderr string
}

// parityEnv is the test's environment without what either binary reads
// (the rows add it back): no in-cluster configuration, no kubeconfig, so
// that a run whose flags are accepted stops when it builds its client.
func parityEnv(extra []string) []string {
	drop := []string{"KUBERNETES_SERVICE_HOST=", "KUBERNETES_SERVICE_PORT=", "KUBECONFIG=", "NAMESPACE=", "POD_NAME=", "NODE_NAME=", "POD_NAMESPACE="}
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return slices.ContainsFunc(drop, func(p string) bool { return strings.HasPrefix(kv, p) })
	})
	return append(env, extra...)
}

// runBinary runs bin with args and env (see parityEnv) for at most 30s.
func runBinary(t *testing.T, bin string, env []string, args ...string) binRun {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Env = parityEnv(env)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("%s %q did not exit within 30s; stderr:\n%s", bin, args, stderr.String())
	}
	r := binRun{stdout: stdout.String(), stderr: stderr.String()}
	var exitErr *exec.ExitError
	switch {
	case errors.As(err, &exitErr):
		r.code = exitErr.ExitCode()
	case err != nil:
		t.Fatalf("run %s %q: %v", bin, args, err)
	}
	return r
}

var (
	// pflagEntry starts a flag in upstream's --help (pflag): "  -v, --v
	// Level ..." or "      --csi-address string ...".
	pflagEntry = regexp.MustCompile(`^  (?:-[a-z], |    )--([a-z][a-z0-9-]*)`)
	// goflagEntry starts a flag in ours (the flag package): "  -csi-address string".
	goflagEntry = regexp.MustCompile(`^  -([a-z][a-z0-9-]*)`)
	// gateLine is a feature gate in upstream's --feature-gates usage.
	gateLine = regexp.MustCompile(`^\s+([A-Za-z0-9]+)=true\|false \((?:ALPHA|BETA|GA|DEPRECATED) - default=(true|false)\)`)
)

// parseHelp returns the flags of a --help text, each with the default the
// text shows ("" when it shows none: both packages leave out zero values).
func parseHelp(t *testing.T, help string, entry *regexp.Regexp) map[string]string {
	t.Helper()
	flags := map[string]string{}
	var name string
	var text []string
	flush := func() {
		if name == "" {
			return
		}
		all := strings.TrimSpace(strings.Join(text, " "))
		def := ""
		if i := strings.LastIndex(all, " (default "); i >= 0 && strings.HasSuffix(all, ")") {
			def = all[i+len(" (default ") : len(all)-1]
			if s, err := strconv.Unquote(def); err == nil {
				def = s
			}
		}
		if def == "map[]" { // an empty map flag: pflag shows it, the flag package does not
			def = ""
		}
		flags[name] = def
	}
	for _, line := range strings.Split(help, "\n") {
		if m := entry.FindStringSubmatch(line); m != nil {
			flush()
			name, text = m[1], []string{line}
			continue
		}
		text = append(text, line)
	}
	flush()
	if len(flags) < 40 {
		t.Fatalf("found %d flags in --help, want the 60 or so there are:\n%s", len(flags), help)
	}
	return flags
}

// readmeText is README.md with every run of white space one space, so that
// a fragment can be found across the page's line breaks.
func readmeText(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(strings.Fields(string(b)), " ")
}

// documentedDefaults returns, from README.md's table "Defaults that differ
// from upstream", each upstream flag with upstream's default and ours.
func documentedDefaults(t *testing.T) map[string][2]string {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n## Defaults that differ from upstream\n")
	if !ok {
		t.Fatal(`README.md has no section "Defaults that differ from upstream"`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	flagRe := regexp.MustCompile("`--([a-z][a-z0-9-]*)`")
	out := map[string][2]string{}
	for _, line := range strings.Split(section, "\n") {
		cells := strings.Split(line, "|")
		if !strings.HasPrefix(line, "| `--") || len(cells) < 4 || strings.Contains(cells[2], "(ours)") {
			continue
		}
		names := flagRe.FindAllStringSubmatch(cells[1], -1)
		ups, heres := strings.Split(cells[2], "/"), strings.Split(cells[3], "/")
		if len(ups) != len(names) || len(heres) != len(names) {
			t.Fatalf("README.md's row %q: %d flags, %d upstream defaults, %d of ours", line, len(names), len(ups), len(heres))
		}
		for i, m := range names {
			out[m[1]] = [2]string{strings.TrimSpace(ups[i]), strings.TrimSpace(heres[i])}
		}
	}
	if len(out) == 0 {
		t.Fatal(`README.md's "Defaults that differ from upstream" has no upstream flag`)
	}
	return out
}

// takesNoValue reports whether --name is a boolean flag of bin: given
// without a value, the next argument is parsed as a flag (and, unknown,
// refused as such) rather than taken as its value. $KUBECONFIG, which
// both read before --kubeconfig and --master, stops a run whose flags
// parse before it connects anywhere.
func takesNoValue(t *testing.T, bin, name string) bool {
	t.Helper()
	r := runBinary(t, bin, []string{"NODE_NAME=parity", "KUBECONFIG=/nonexistent/kubeconfig"}, "--"+name, "--no-such-flag-probe")
	return strings.Contains(r.stderr, "unknown flag: --no-such-flag-probe") || // pflag
		strings.Contains(r.stderr, "flag provided but not defined: -no-such-flag-probe") // flag
}

// TestUpstreamFlagParity runs upstream's --help and ours and requires every
// upstream flag to exist here with upstream's default, except those
// README.md's "Defaults that differ from upstream" lists (with the values
// it gives), and with the same bool-ness: a boolean flag takes no value
// (--flag) and takes =false, and a flag that takes a value takes the next
// argument as its value in both.
func TestUpstreamFlagParity(t *testing.T) {
	upstream, ours := parityBinaries(t)
	upHelp := runBinary(t, upstream, nil, "--help")
	ourHelp := runBinary(t, ours, nil, "--help")
	if upHelp.code != 0 || ourHelp.code != 0 {
		t.Fatalf("--help: upstream exit %d, ours exit %d", upHelp.code, ourHelp.code)
	}
	upFlags := parseHelp(t, upHelp.stdout+upHelp.stderr, pflagEntry)
	ourFlags := parseHelp(t, ourHelp.stdout, goflagEntry)
	documented := documentedDefaults(t)

	names := make([]string, 0, len(upFlags))
	for name := range upFlags {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		upDef := upFlags[name]
		ourDef, ok := ourFlags[name]
		if !ok {
			t.Errorf("--%s: upstream's flag is missing here", name)
			continue
		}
		if d, ok := documented[name]; ok {
			if upDef != d[0] || ourDef != d[1] {
				t.Errorf("--%s: defaults are %q upstream and %q here; README.md's \"Defaults that differ from upstream\" says %q and %q", name, upDef, ourDef, d[0], d[1])
			}
		} else if upDef != ourDef {
			t.Errorf("--%s: default %q here, upstream's is %q (not a difference README.md documents)", name, ourDef, upDef)
		}
		upBool, ourBool := takesNoValue(t, upstream, name), takesNoValue(t, ours, name)
		if upBool != ourBool {
			t.Errorf("--%s: boolean upstream %t, here %t: a Deployment's \"--%s\" (or \"--%s value\") would mean something else", name, upBool, ourBool, name, name)
			continue
		}
		if !upBool {
			// Upstream's default, written out, is a value both take.
			if upDef != "" {
				env := []string{"KUBECONFIG=/nonexistent/kubeconfig"}
				arg := "--" + name + "=" + upDef
				if up, here := runBinary(t, upstream, env, arg), runBinary(t, ours, env, arg); upstreamAccepted(up) && !oursAccepted(here) {
					t.Errorf("%s (upstream's default) refused here: %s", arg, here.stderr)
				}
			}
			continue
		}
		for _, bin := range []string{upstream, ours} {
			if r := runBinary(t, bin, []string{"NODE_NAME=parity"}, "--"+name+"=false", "--version"); r.code != 0 {
				t.Errorf("--%s=false refused by %s (exit %d): %s", name, bin, r.code, r.stderr)
			}
		}
	}
	for name := range ourFlags {
		if _, ok := upFlags[name]; !ok {
			t.Logf("--%s is ours only", name)
		}
	}
	for name := range documented {
		if _, ok := upFlags[name]; !ok {
			t.Errorf("README.md's \"Defaults that differ from upstream\" names --%s, which upstream does not have", name)
		}
	}
}

// TestUpstreamFeatureGateParity requires every gate README.md says the
// sidecar knows to be accepted by upstream and here, and every other gate
// upstream's --help lists (kube-apiserver's, which README.md says are
// refused here) to be refused here with one line naming it.
func TestUpstreamFeatureGateParity(t *testing.T) {
	upstream, ours := parityBinaries(t)
	readme := readmeText(t)
	_, list, ok := strings.Cut(readme, "`--feature-gates` knows the provisioner's gates (")
	list, _, _ = strings.Cut(list, ")")
	ourGates := regexp.MustCompile("`([A-Za-z0-9]+)`").FindAllStringSubmatch(list, -1)
	if !ok || len(ourGates) == 0 {
		t.Fatal("README.md no longer says which gates --feature-gates knows (\"`--feature-gates` knows the provisioner's gates (...)\")")
	}
	known := map[string]bool{}
	for _, m := range ourGates {
		known[m[1]] = true
	}
	gates := map[string]string{} // gate → upstream's default
	upHelp := runBinary(t, upstream, nil, "--help")
	for _, line := range strings.Split(upHelp.stdout+upHelp.stderr, "\n") {
		if m := gateLine.FindStringSubmatch(line); m != nil {
			gates[m[1]] = m[2]
		}
	}
	for gate := range known {
		if _, ok := gates[gate]; !ok {
			gates[gate] = "true" // GA gates are not listed; true is accepted by both
		}
	}
	for gate, def := range gates {
		arg := "--feature-gates=" + gate + "=" + def
		up, here := runBinary(t, upstream, nil, arg, "--version"), runBinary(t, ours, nil, arg, "--version")
		switch {
		case up.code != 0 && known[gate]:
			t.Errorf("%s: refused by upstream (README.md says the gate is upstream's): %s", arg, up.stderr)
		case up.code != 0:
			t.Logf("%s: refused by upstream too", arg)
		case known[gate] && here.code != 0:
			t.Errorf("%s: accepted by upstream, refused here: %s", arg, here.stderr)
		case !known[gate] && (here.code != 2 || !oneLineError(here.stderr) || !strings.Contains(here.stderr, "unrecognized feature gate: "+gate)):
			t.Errorf("%s: upstream accepts it and README.md says it is refused here with \"unrecognized feature gate\"; exit %d, stderr %q", arg, here.code, here.stderr)
		}
	}
}

// oneLineError reports whether stderr is one line of ours: the program's
// name, then the error.
func oneLineError(stderr string) bool {
	return strings.HasPrefix(stderr, "csi-provisioner: ") && strings.Count(strings.TrimSpace(stderr), "\n") == 0
}
