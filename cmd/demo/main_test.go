package main

import (
	"bytes"
	"errors"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/kube-storage/csi-provisioner/internal/controlplane"
)

// TestDemo runs `make demo`'s flow against the real binaries and checks
// that it shows every step, the Warning that explains the claim waiting for
// its secret, and ends with no volume left.
func TestDemo(t *testing.T) {
	if _, err := controlplane.FindBinaries(); err != nil {
		if os.Getenv(controlplane.RequireEnv) != "" || !errors.Is(err, controlplane.ErrBinariesMissing) {
			t.Fatalf("the demo needs the control plane: %v", err)
		}
		t.Skipf("demo skipped: %v", err)
	}
	var out bytes.Buffer
	if err := run(t.Context(), &out, "", false); err != nil {
		t.Fatalf("demo failed: %v\noutput:\n%s", err, out.String())
	}
	got := out.String()
	t.Logf("demo output:\n%s", got)
	steps := regexp.MustCompile(`(?m)^\[\s*\d+\]\s+[\d.]+s  (.*)$`).FindAllStringSubmatch(got, -1)
	var titles []string
	for _, m := range steps {
		titles = append(titles, m[1])
	}
	for _, want := range []string{
		"The claim is Bound",
		"PV pvc-",
		"Creating StorageClass \"hostpath-with-secret\"",
		"The claim is Pending, and its events say why",
		"Creating Secret demo/backend-credentials",
		"The claim is Bound, ",
		"Deleting that claim too",
		"Stopping the sidecar",
	} {
		if !slices.ContainsFunc(titles, func(s string) bool { return strings.HasPrefix(s, want) }) {
			t.Errorf("no step starting %q; steps:\n%s", want, strings.Join(titles, "\n"))
		}
	}
	for _, want := range []*regexp.Regexp{
		// The Pending claim's event names the missing secret.
		regexp.MustCompile(`Warning\s+ProvisioningFailed\s.*secrets? "?backend-credentials"? not found`),
		regexp.MustCompile(`Normal\s+ProvisioningSucceeded\s`),
		regexp.MustCompile(`the driver has 0 volumes`),
	} {
		if !want.MatchString(got) {
			t.Errorf("the demo's output does not match %q", want)
		}
	}
}
