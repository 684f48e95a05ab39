package e2e

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-storage/csi-provisioner/internal/testutil"
)

// TestUpstreamFlags runs upstream flags whose effect only shows on the
// objects the sidecar writes or serves, each of which a deployment moved
// from upstream may set: --default-fstype (the PV's fsType when the class
// names none), --controller-publish-readonly (a ReadOnlyMany claim's PV is
// readOnly), the deprecated --metrics-address with --metrics-path, and
// --leader-election-labels (on the Lease).
func TestUpstreamFlags(t *testing.T) {
	endpoint := "127.0.0.1:" + strconv.Itoa(freePort(t))
	s := newStack(t, stackConfig{sidecarArgs: []string{
		"--default-fstype=xfs", "--controller-publish-readonly",
		"--metrics-address=" + endpoint, "--metrics-path=/custom/metrics",
		"--leader-election", "--leader-election-namespace=" + "kube-system",
		"--leader-election-labels=team:storage,tier:csi",
	}})
	sc := s.class("flags", nil)
	rwo := s.claim(testutil.NewPVC(s.ns, "rwo").Class(sc.Name))
	rox := s.claim(testutil.NewPVC(s.ns, "rox").Class(sc.Name).AccessModes(corev1.ReadOnlyMany))
	_, rwoPV := s.waitBound(rwo.Name)
	_, roxPV := s.waitBound(rox.Name)
	for _, c := range []struct {
		pv       *corev1.PersistentVolume
		readOnly bool
	}{{rwoPV, false}, {roxPV, true}} {
		if c.pv.Spec.CSI.FSType != "xfs" || c.pv.Spec.CSI.ReadOnly != c.readOnly {
			t.Errorf("PV %s: fsType %q readOnly %v, want xfs (--default-fstype) and %v", c.pv.Name, c.pv.Spec.CSI.FSType, c.pv.Spec.CSI.ReadOnly, c.readOnly)
		}
	}

	testutil.Eventually(t, 0, "metrics not on --metrics-path", func(ctx context.Context) (bool, error) {
		code, body, err := httpGet(ctx, endpoint, "/custom/metrics")
		return code == http.StatusOK && strings.Contains(body, `controller_persistentvolumeclaim_provision_total{class="`+sc.Name+`",source=""} 2`), err
	})
	if code, _, err := httpGet(t.Context(), endpoint, "/metrics"); err != nil || code != http.StatusNotFound {
		t.Errorf("GET /metrics = %d, %v; want 404 with --metrics-path=/custom/metrics", code, err)
	}

	leaseName := strings.NewReplacer(".", "-").Replace(s.driver.Name)
	lease, err := s.c.CoordinationV1().Leases("kube-system").Get(t.Context(), leaseName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("Lease %s: %v", leaseName, err)
	}
	if lease.Labels["team"] != "storage" || lease.Labels["tier"] != "csi" {
		t.Errorf("Lease labels = %v, want team=storage and tier=csi", lease.Labels)
	}

	for _, name := range []string{rwo.Name, rox.Name} {
		if err := s.c.CoreV1().PersistentVolumeClaims(s.ns).Delete(t.Context(), name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	s.waitGone(rwo.Name, rwoPV.Name)
	s.waitGone(rox.Name, roxPV.Name)
}
