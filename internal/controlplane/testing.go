package controlplane

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"
)

// RequireEnv names an environment variable that, when non-empty, turns a missing control plane
// binary into a test failure instead of a skip. `make test` sets it, so the
// integration tests can never be skipped there.
const RequireEnv = "CSI_PROVISIONER_REQUIRE_CONTROLPLANE"

var skipReason string

// RunMain is for TestMain: it starts one control plane for all tests of a
// package, stores it in *cp, runs the tests and stops it. When the binaries
// are missing and RequireEnv is unset, it prints one line saying how to get
// them and runs the tests with *cp == nil, so that [Need] skips them.
func RunMain(m *testing.M, cfg Config, cp **ControlPlane) int {
	if _, err := FindBinaries(); err != nil {
		if os.Getenv(RequireEnv) != "" || !errors.Is(err, ErrBinariesMissing) {
			fmt.Fprintf(os.Stderr, "integration tests need the control plane: %v\n", err)
			return 1
		}
		skipReason = fmt.Sprintf("integration test skipped: %v", err)
		fmt.Fprintln(os.Stderr, skipReason)
		return m.Run()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	started, err := Start(ctx, cfg)
	cancel()
	if err != nil {
		fmt.Fprintf(os.Stderr, "start control plane: %v\n", err)
		return 1
	}
	*cp = started
	code := m.Run()
	if code != 0 {
		// Keep the logs of a failed run for inspection.
		started.ownsDir = false
		fmt.Fprintf(os.Stderr, "control plane logs kept in %s\n", started.Dir)
	}
	if err := started.Stop(); err != nil {
		fmt.Fprintf(os.Stderr, "stop control plane: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// Need returns cp, or skips the test when RunMain found no binaries.
func Need(t testing.TB, cp *ControlPlane) *ControlPlane {
	t.Helper()
	if cp == nil {
		if skipReason == "" {
			t.Fatal("control plane not started: call controlplane.RunMain from TestMain")
		}
		t.Skip(skipReason)
	}
	return cp
}

// StartForTest starts a control plane for one test and stops it in
// t.Cleanup. Missing binaries skip the test, or fail it under RequireEnv.
func StartForTest(t testing.TB, cfg Config) *ControlPlane {
	t.Helper()
	if _, err := FindBinaries(); err != nil {
		if os.Getenv(RequireEnv) != "" || !errors.Is(err, ErrBinariesMissing) {
			t.Fatalf("integration test needs the control plane: %v", err)
		}
		t.Skipf("integration test skipped: %v", err)
	}
	if cfg.Dir == "" {
		cfg.Dir = t.TempDir()
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	cp, err := Start(ctx, cfg)
	if err != nil {
		t.Fatalf("start control plane: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, p := range cp.Processes() {
				t.Logf("last lines of %s:\n%s", p.LogPath, TailFile(p.LogPath, 15))
			}
		}
		if err := cp.Stop(); err != nil {
			t.Errorf("stop control plane: %v", err)
		}
	})
	return cp
}
