package e2e

import (
	"bytes"
	"os"
	"testing"
	"time"

	"github.com/kube-storage/csi-provisioner/internal/controlplane"
)

// CheckCacheMutations fails t if the sidecar log at logPath shows that
// client-go's cache mutation detector (see [MutationDetectorEnv]) caught the
// sidecar changing an object in its informer cache.
func CheckCacheMutations(t testing.TB, logPath string) {
	t.Helper()
	if b, err := os.ReadFile(logPath); err == nil && bytes.Contains(b, []byte("ALTERED!")) {
		t.Errorf("the sidecar changed an object in its informer cache (%s); see %s", MutationDetectorEnv, logPath)
	}
}

// StopAtCleanup stops the sidecar when t ends, fails t if client-go's cache
// mutation detector caught the sidecar changing a cached object, and, if t
// failed, logs the last lines of its log and of the driver's. Register it
// after the driver's own cleanup, so that the sidecar stops first.
func (s *Sidecar) StopAtCleanup(t testing.TB, d *Driver) {
	t.Cleanup(func() {
		_ = s.Stop(10 * time.Second)
		CheckCacheMutations(t, s.LogPath)
		if t.Failed() {
			t.Logf("sidecar log (%s):\n%s", s.LogPath, controlplane.TailFile(s.LogPath, 60))
			t.Logf("driver log (%s):\n%s", d.LogPath, controlplane.TailFile(d.LogPath, 20))
		}
	})
}
