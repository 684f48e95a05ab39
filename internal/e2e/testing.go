package e2e

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kube-storage/csi-provisioner/internal/controlplane"
)

// Markers a child process writes to its log when a checker built into it
// caught a bug that does not make it exit at once.
const (
	// mutationMarker is what client-go's cache mutation detector (see
	// [MutationDetectorEnv]) prints when a cached object changed.
	mutationMarker = "ALTERED!"
	// raceMarker is what Go's race detector prints, in a binary built with
	// -race, for each data race it finds. The process goes on running and
	// exits with status 66 only at the end, which a stopped process never
	// reaches with status 0 to replace, so the log is the only witness.
	raceMarker = "WARNING: DATA RACE"
)

// logFindings returns a description of each checker's finding in a
// process's log.
func logFindings(log []byte) []string {
	var found []string
	if bytes.Contains(log, []byte(mutationMarker)) {
		found = append(found, "changed an object in its informer cache ("+MutationDetectorEnv+")")
	}
	if n := bytes.Count(log, []byte(raceMarker)); n > 0 {
		found = append(found, fmt.Sprintf("had a data race (%d race detector reports, %q)", n, raceMarker))
	}
	return found
}

// CheckLog fails t if the log at logPath shows that the process changed an
// object in its informer cache (client-go's cache mutation detector, see
// [MutationDetectorEnv]) or, built with -race, had a data race.
func CheckLog(t testing.TB, logPath string) {
	t.Helper()
	b, err := os.ReadFile(logPath)
	if err != nil {
		return
	}
	for _, f := range logFindings(b) {
		t.Errorf("the process logging to %s %s", logPath, f)
	}
}

// StopAtCleanup stops the sidecar when t ends, fails t if its log or the
// driver's shows a bug caught by a checker (see [CheckLog]), and, if t
// failed, logs the last lines of its log and of the driver's and keeps
// both logs whole outside t's temporary directory (see [keepLogs]).
// Register it after the driver's own cleanup, so that the sidecar stops
// first.
func (s *Sidecar) StopAtCleanup(t testing.TB, d *Driver) {
	t.Cleanup(func() {
		_ = s.Stop(10 * time.Second)
		CheckLog(t, s.LogPath)
		CheckLog(t, d.LogPath)
		if t.Failed() {
			t.Logf("sidecar log (%s):\n%s", s.LogPath, controlplane.TailFile(s.LogPath, 60))
			t.Logf("driver log (%s):\n%s", d.LogPath, controlplane.TailFile(d.LogPath, 20))
			keepLogs(t, s.LogPath, d.LogPath)
		}
	})
}

// keepLogs copies the logs at paths into a new directory that outlives t
// (t's temporary directory is removed even when t fails) and says where:
// a failure seen once in many runs is explained by the whole log, not its
// last lines. It returns the directory, "" if none could be made.
func keepLogs(t testing.TB, paths ...string) string {
	dir, err := os.MkdirTemp("", "csi-provisioner-logs-")
	if err != nil {
		t.Logf("keep logs: %v", err)
		return ""
	}
	for i, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Logf("keep logs: %v", err)
			continue
		}
		dst := filepath.Join(dir, fmt.Sprintf("%d-%s", i, filepath.Base(p)))
		if err := os.WriteFile(dst, b, 0o600); err != nil {
			t.Logf("keep logs: %v", err)
		}
	}
	t.Logf("whole logs kept in %s", dir)
	return dir
}
