package sanity_test

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	csisanity "github.com/kubernetes-csi/csi-test/v5/pkg/sanity"
	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/ginkgo/v2/types"
	"github.com/onsi/gomega"
	"k8s.io/klog/v2"

	"github.com/kube-storage/csi-provisioner/examples/hostpath-driver/backend"
	"github.com/kube-storage/csi-provisioner/examples/hostpath-driver/driver"
)

// Environment of a TestSanitySuite subprocess.
const (
	envCase   = "HOSTPATH_SANITY_CASE"
	envReport = "HOSTPATH_SANITY_REPORT"
)

// listSkipped makes TestSanity log every skipped spec with its reason.
var listSkipped = flag.Bool("sanity.list-skipped", false, "log every skipped csi-sanity spec with its reason")

// sanityCase is one driver configuration that sanity runs against.
type sanityCase struct {
	name    string
	backend string
	// all enables attach and single-node-multi-writer and requires
	// create/delete secrets, which sanity then sends from a secrets file.
	all bool
	// block makes sanity ask for block volumes instead of mount volumes.
	block bool
}

var sanityCases = []sanityCase{
	{name: "memory-defaults", backend: driver.BackendMemory},
	{name: "memory-all", backend: driver.BackendMemory, all: true},
	{name: "dir-defaults", backend: driver.BackendDir},
	{name: "dir-all", backend: driver.BackendDir, all: true},
	{name: "dir-all-block", backend: driver.BackendDir, all: true, block: true},
}

// TestSanity runs csi-sanity once per sanityCase, each in a subprocess,
// and fails if any spec fails.
func TestSanity(t *testing.T) {
	if os.Getenv(envCase) != "" {
		t.Skip("running as a TestSanitySuite subprocess")
	}
	if testing.Short() {
		t.Skip("csi-sanity takes a few seconds per case")
	}
	for _, tc := range sanityCases {
		t.Run(tc.name, func(t *testing.T) {
			configSkip := "skipped by the suite configuration"
			if tc.backend == driver.BackendDir {
				if err := backend.CheckBindMount(t.TempDir()); err != nil {
					configSkip = "skipped because the dir backend cannot bind mount here (not root, no CAP_SYS_ADMIN)"
					t.Logf("the Node Service specs are skipped: %v", err)
				}
			}
			reportPath := filepath.Join(t.TempDir(), "report.json")
			cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestSanitySuite$", "-test.v")
			cmd.Env = append(os.Environ(), envCase+"="+tc.name, envReport+"="+reportPath)
			out, runErr := cmd.CombinedOutput()

			counts, skipped, failed, err := readReport(reportPath, configSkip)
			if err != nil {
				t.Fatalf("no sanity report (subprocess error %v): %v\n%s", runErr, err, out)
			}
			if *listSkipped {
				for _, s := range skipped {
					t.Logf("skipped: %s", s)
				}
			}
			// Ginkgo's own summary lines, unprefixed and tagged with the
			// case, for `make sanity` to pick out.
			for _, line := range ginkgoSummary(out) {
				fmt.Fprintf(os.Stdout, "%s [%s]\n", line, tc.name)
			}
			t.Logf("csi-sanity %s: %s", tc.name, counts)
			if runErr != nil || len(failed) > 0 {
				t.Errorf("csi-sanity %s failed (%v):\n%s", tc.name, runErr, strings.Join(failed, "\n"))
				t.Logf("subprocess output:\n%s", out)
			}
		})
	}
}

// specCounts are the spec counts of one sanity run.
type specCounts struct {
	total, ran, passed, failed, pending, skipped int
}

func (c specCounts) String() string {
	return fmt.Sprintf("ran %d of %d specs: %d passed, %d failed, %d pending, %d skipped",
		c.ran, c.total, c.passed, c.failed, c.pending, c.skipped)
}

// readReport reads a Ginkgo JSON report and returns the counts, the
// skipped specs with their reasons and the failed specs with theirs.
// configSkip is the reason of specs skipped by -ginkgo.skip, which the
// report does not give.
func readReport(path, configSkip string) (specCounts, []string, []string, error) {
	var c specCounts
	data, err := os.ReadFile(path)
	if err != nil {
		return c, nil, nil, err
	}
	var reports []types.Report
	if err := json.Unmarshal(data, &reports); err != nil {
		return c, nil, nil, fmt.Errorf("parse %s: %w", path, err)
	}
	if len(reports) != 1 {
		return c, nil, nil, fmt.Errorf("%s holds %d suite reports, want 1", path, len(reports))
	}
	r := reports[0]
	c.total = r.PreRunStats.TotalSpecs
	var skipped, failed []string
	for _, s := range r.SpecReports {
		if s.LeafNodeType != types.NodeTypeIt {
			continue
		}
		name := s.FullText()
		switch {
		case s.State == types.SpecStatePassed:
			c.ran++
			c.passed++
		case s.State.Is(types.SpecStateFailureStates):
			c.ran++
			c.failed++
			failed = append(failed, name+": "+s.Failure.Message)
		case s.State == types.SpecStatePending:
			c.pending++
		case s.State == types.SpecStateSkipped:
			c.skipped++
			reason := s.Failure.Message
			if reason == "" {
				reason = configSkip
			}
			skipped = append(skipped, name+" -- "+oneLine(reason))
		}
	}
	sort.Strings(skipped)
	sort.Strings(failed)
	return c, skipped, failed, nil
}

var (
	spaces      = regexp.MustCompile(`\s+`)
	ansiColor   = regexp.MustCompile(`\x1b\[[0-9;]*m`)
	summaryLine = regexp.MustCompile(`^(Ran [0-9]+ of [0-9]+ Specs|SUCCESS!|FAIL!)`)
)

// ginkgoSummary returns Ginkgo's "Ran N of M Specs" and "SUCCESS! -- ..."
// (or "FAIL! -- ...") lines from a suite's output.
func ginkgoSummary(out []byte) []string {
	var lines []string
	for _, line := range strings.Split(ansiColor.ReplaceAllString(string(out), ""), "\n") {
		if summaryLine.MatchString(line) {
			lines = append(lines, line)
		}
	}
	return lines
}

func oneLine(s string) string { return strings.TrimSpace(spaces.ReplaceAllString(s, " ")) }

// TestSanitySuite is the subprocess body of TestSanity: it starts the
// driver in-process on a unix socket and runs the sanity suite once.
func TestSanitySuite(t *testing.T) {
	name := os.Getenv(envCase)
	if name == "" {
		t.Skip("runs only as a subprocess of TestSanity (Ginkgo allows one suite per process)")
	}
	var tc sanityCase
	for _, c := range sanityCases {
		if c.name == name {
			tc = c
		}
	}
	if tc.name == "" {
		t.Fatalf("unknown sanity case %q", name)
	}

	dir := t.TempDir()
	sock := filepath.Join(dir, "csi.sock")
	cfg := driver.DefaultConfig()
	cfg.Endpoint = sock
	cfg.NodeID = "sanity-node"
	cfg.Backend = tc.backend
	if tc.backend == driver.BackendDir {
		cfg.Root = filepath.Join(dir, "root")
	}

	sc := csisanity.NewTestConfig()
	sc.Address = "unix://" + sock
	// Both must not exist yet: the suite creates them with os.Mkdir.
	sc.TargetPath = filepath.Join(dir, "target")
	sc.StagingPath = filepath.Join(dir, "staging")
	sc.TestVolumeSize = 1 << 30
	if tc.block {
		sc.TestVolumeAccessType = "block"
	}
	if tc.all {
		cfg.EnableAttach = true
		cfg.SingleNodeMultiWriter = true
		cfg.RequireCreateSecrets = map[string]string{"create-key": "create-value"}
		cfg.RequireDeleteSecrets = map[string]string{"delete-key": "delete-value"}
		sc.SecretsFile = filepath.Join(dir, "secrets.yaml")
		secrets := "CreateVolumeSecret:\n  create-key: create-value\nDeleteVolumeSecret:\n  delete-key: delete-value\n"
		if err := os.WriteFile(sc.SecretsFile, []byte(secrets), 0o600); err != nil {
			t.Fatal(err)
		}
	}

	suiteConfig, reporterConfig := ginkgo.GinkgoConfiguration()
	reporterConfig.JSONReport = os.Getenv(envReport)
	reporterConfig.NoColor = true
	if tc.backend == driver.BackendDir {
		if err := backend.CheckBindMount(dir); err != nil {
			if !errors.Is(err, backend.ErrMountNotPermitted) {
				t.Fatal(err)
			}
			// NodePublishVolume answers FAILED_PRECONDITION here, as it
			// should; the Node Service specs expect it to work.
			t.Logf("SKIPPING the Node Service specs: the dir backend cannot bind mount: %v", err)
			suiteConfig.SkipStrings = append(suiteConfig.SkipStrings, "Node Service")
		}
	}

	ctx := klog.NewContext(t.Context(), klog.Background())
	d, err := driver.New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := driver.Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	serveCtx, stop := context.WithCancel(ctx)
	go func() { served <- d.Serve(serveCtx, lis) }()
	defer func() {
		stop()
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
	}()
	verifySocket(t, sock)

	gomega.RegisterFailHandler(ginkgo.Fail)
	sanityCtx := csisanity.GinkgoTest(&sc)
	ginkgo.RunSpecs(t, "hostpath-driver csi-sanity "+tc.name, suiteConfig, reporterConfig)
	sanityCtx.Finalize()
}

func verifySocket(t *testing.T, sock string) {
	t.Helper()
	conn, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatalf("driver socket: %v", err)
	}
	_ = conn.Close()
}
