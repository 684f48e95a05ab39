package e2e

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-storage/csi-provisioner/internal/testutil"
)

// TestLogLinesPerVolume bounds the sidecar's log lines about the claims and
// volumes of a success path (provision, bind, delete), at the sidecar's
// default verbosity and at the chart's -v=2, so that a line added per
// volume shows. Measured with 10 claims: 2.0 lines per volume at -v=0 (the
// provisioning library's "Event occurred" for Provisioning and
// ProvisioningSucceeded; none of ours) and 12.0 at -v=2.
func TestLogLinesPerVolume(t *testing.T) {
	const n = 10
	for _, tc := range []struct {
		verbosity int
		// maxPerVolume is what was measured plus half a line.
		maxPerVolume float64
	}{{0, 2.5}, {2, 12.5}} {
		t.Run(fmt.Sprintf("v%d", tc.verbosity), func(t *testing.T) {
			s := newStack(t, stackConfig{sidecarArgs: []string{fmt.Sprintf("-v=%d", tc.verbosity)}})
			sc := s.class("fs", nil)
			for i := range n {
				s.claim(testutil.NewPVC(s.ns, fmt.Sprint("c", i)).Class(sc.Name))
			}
			pvs := make([]string, n)
			for i := range n {
				_, pv := s.waitBound(fmt.Sprint("c", i))
				pvs[i] = pv.Name
			}
			for i := range n {
				if err := s.c.CoreV1().PersistentVolumeClaims(s.ns).Delete(t.Context(), fmt.Sprint("c", i), metav1.DeleteOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			for i := range n {
				s.waitGone(fmt.Sprint("c", i), pvs[i])
			}
			if err := s.sidecar.Stop(10 * time.Second); err != nil {
				t.Fatal(err)
			}
			lines := volumeLogLines(t, s.sidecarCfg.LogPath, s.ns, pvs)
			perVolume := float64(len(lines)) / n
			t.Logf("%d log lines about the %d claims and volumes at -v=%d: %.1f per volume", len(lines), n, tc.verbosity, perVolume)
			if perVolume > tc.maxPerVolume {
				t.Errorf("%.1f log lines per volume at -v=%d, want at most %.1f:\n%s", perVolume, tc.verbosity, tc.maxPerVolume, strings.Join(lines, "\n"))
			}
		})
	}
}

// volumeLogLines returns the lines of the log at path that name an object
// of namespace ns ("ns/name") or one of pvs.
func volumeLogLines(t *testing.T, path, ns string, pvs []string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for line := range strings.SplitSeq(string(b), "\n") {
		if strings.Contains(line, `"`+ns+`/`) || containsAny(line, pvs) {
			out = append(out, line)
		}
	}
	return out
}

func containsAny(s string, subs []string) bool {
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

// TestFailingClaimLogged: a claim Pending for a missing StorageClass, a
// missing provisioner secret or a driver error is named in the sidecar's
// log at its default verbosity, with the cause its Warning event gives.
// The missing class, which only the sidecar's binder reports, had no line
// at any verbosity.
func TestFailingClaimLogged(t *testing.T) {
	s := newStack(t, stackConfig{
		driverArgs:  []string{"--require-create-secret=token=good"},
		sidecarArgs: []string{"-v=0"},
	})
	wrong, _ := s.credsClass("creds", "bad-7f3c")
	missing := s.class("missing", func(sc *storagev1.StorageClass) {
		sc.Parameters = map[string]string{
			"csi.storage.k8s.io/provisioner-secret-name":      "nosuch",
			"csi.storage.k8s.io/provisioner-secret-namespace": "${pvc.namespace}",
		}
	})
	for _, tc := range []struct {
		claim, class string
		cause        []string
	}{
		{"driver-error", wrong.Name, []string{"Unauthenticated", `secret \"token\" has the wrong value`}},
		{"missing-secret", missing.Name, []string{`secrets \"nosuch\" not found`}},
		{"missing-class", "no-such-class", []string{`storageclass.storage.k8s.io \"no-such-class\" not found`}},
	} {
		claim := s.claim(testutil.NewPVC(s.ns, tc.claim).Class(tc.class))
		s.waitEvent(s.ns, string(claim.UID), corev1.EventTypeWarning, "ProvisioningFailed", strings.ReplaceAll(tc.cause[len(tc.cause)-1], `\"`, `"`))
		testutil.Eventually(t, 30*time.Second, "no log line names claim "+tc.claim+" with its cause", func(_ context.Context) (bool, error) {
			b, err := os.ReadFile(s.sidecarCfg.LogPath)
			if err != nil {
				return false, err
			}
			for line := range strings.SplitSeq(string(b), "\n") {
				if strings.Contains(line, `"`+s.ns+"/"+tc.claim+`"`) && containsAll(line, tc.cause) {
					return true, nil
				}
			}
			return false, nil
		})
	}
}
