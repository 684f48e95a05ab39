package e2e

import (
	"testing"
	"time"

	"github.com/kube-storage/csi-provisioner/internal/controlplane"
)

// StopAtCleanup stops the sidecar when t ends and, if t failed, logs the
// last lines of its log and of the driver's. Register it after the driver's
// own cleanup, so that the sidecar stops first.
func (s *Sidecar) StopAtCleanup(t testing.TB, d *Driver) {
	t.Cleanup(func() {
		_ = s.Stop(10 * time.Second)
		if t.Failed() {
			t.Logf("sidecar log (%s):\n%s", s.LogPath, controlplane.TailFile(s.LogPath, 60))
			t.Logf("driver log (%s):\n%s", d.LogPath, controlplane.TailFile(d.LogPath, 20))
		}
	})
}
