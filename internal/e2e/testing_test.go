package e2e

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestLogFindings: a child's log that shows a checker's finding fails the
// test that ran it; a race report from a binary built with -race is one,
// since the process keeps running after it and a stop hides its exit status.
func TestLogFindings(t *testing.T) {
	raceReport := "I1124 01:28:01.059207 http.go:82] \"Serving HTTP\"\n==================\nWARNING: DATA RACE\nWrite at 0x000006fd59b8 by goroutine 201:\n"
	for _, tc := range []struct {
		name string
		log  string
		want []string // substrings of each finding, in order
	}{
		{name: "clean", log: "I1124 \"Started provisioner controller\"\n"},
		{name: "cache mutation", log: "panic: cache *v1.PersistentVolumeClaim modified\nALTERED!\n", want: []string{"informer cache"}},
		{name: "data race", log: raceReport, want: []string{"1 race detector reports"}},
		{name: "two races", log: raceReport + raceReport, want: []string{"2 race detector reports"}},
		{name: "both", log: "ALTERED!\n" + raceReport, want: []string{"informer cache", "data race"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := logFindings([]byte(tc.log))
			if len(got) != len(tc.want) || slices.ContainsFunc(tc.want, func(w string) bool {
				return !strings.Contains(got[slices.Index(tc.want, w)], w)
			}) {
				t.Errorf("logFindings = %q, want findings containing %q", got, tc.want)
			}
		})
	}
}

// TestKeepLogs: a failed test keeps its child processes' logs whole, in a
// directory that outlives it.
func TestKeepLogs(t *testing.T) {
	src := t.TempDir()
	sidecar, driver := filepath.Join(src, "sidecar.log"), filepath.Join(src, "driver.log")
	if err := os.WriteFile(sidecar, []byte("line 1\nline 2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(driver, []byte("driver line\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	dir := keepLogs(t, sidecar, driver, filepath.Join(src, "missing.log"))
	if dir == "" {
		t.Fatal("no directory")
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	for name, want := range map[string]string{"0-sidecar.log": "line 1\nline 2\n", "1-driver.log": "driver line\n"} {
		got, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != want {
			t.Errorf("%s = %q, want %q", name, got, want)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 2 {
		t.Errorf("kept %d files, want 2 (a missing log is skipped)", len(entries))
	}
}
