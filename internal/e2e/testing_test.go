package e2e

import (
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
