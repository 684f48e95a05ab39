package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-storage/csi-provisioner/internal/controlplane"
	"github.com/kube-storage/csi-provisioner/internal/testutil"
	"github.com/kube-storage/csi-provisioner/pkg/inflight"
)

// TestEndpointsAndLeaderElection runs the sidecar with leader election and
// an HTTP endpoint: /readyz turns ready, the Lease carries upstream's name
// (the driver name with non-alphanumerics replaced), the leader-election
// health check is the election's and answers, and /metrics serves upstream's metric names and the
// binder's after a claim is provisioned.
func TestEndpointsAndLeaderElection(t *testing.T) {
	port := freePort(t)
	endpoint := "127.0.0.1:" + strconv.Itoa(port)
	s := newStack(t, stackConfig{sidecarArgs: []string{
		"--http-endpoint=" + endpoint,
		"--leader-election", "--leader-election-namespace=kube-system",
		"--leader-election-lease-duration=4s", "--leader-election-renew-deadline=3s", "--leader-election-retry-period=1s",
	}})
	get := func(ctx context.Context, path string) (int, string, error) { return httpGet(ctx, endpoint, path) }
	testutil.Eventually(t, 0, "/readyz not ready", func(ctx context.Context) (bool, error) {
		code, _, err := get(ctx, "/readyz")
		return code == http.StatusOK, err
	})
	// Healthy, and client-go's check, not the answer served before the
	// election starts: that one answers 200 for ever, so a leader that
	// stopped renewing would never be restarted.
	testutil.Eventually(t, 0, "/healthz/leader-election not healthy, or not the election's check", func(ctx context.Context) (bool, error) {
		code, body, err := get(ctx, "/healthz/leader-election")
		return code == http.StatusOK && !strings.Contains(body, "has not started"), err
	})
	leaseName := strings.NewReplacer(".", "-").Replace(s.driver.Name)
	lease, err := s.c.CoordinationV1().Leases("kube-system").Get(t.Context(), leaseName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("Lease %s: %v", leaseName, err)
	}
	if lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity == "" {
		t.Errorf("Lease has no holder: %+v", lease.Spec)
	}

	sc := s.class("metrics", nil)
	claim := s.claim(testutil.NewPVC(s.ns, "m").Class(sc.Name))
	_, pv := s.waitBound(claim.Name)
	want := []string{
		`csi_sidecar_operations_seconds_count{driver_name="` + s.driver.Name + `",grpc_status_code="OK",method_name="/csi.v1.Controller/CreateVolume"}`,
		`controller_persistentvolumeclaim_provision_total{class="` + sc.Name + `",source=""} 1`,
		`csi_provisioner_binder_bound_pv_count{storage_class="` + sc.Name + `"} 1`,
		`csi_provisioner_binder_bound_pvc_count{storage_class="` + sc.Name + `"} 1`,
		`workqueue_adds_total{name="claims"}`,
		`rest_client_requests_total`,
		`promhttp_metric_handler_requests_total{code="200"}`, // from the second scrape on
	}
	waitMetrics(t, endpoint, want)
	s.deleteAndWaitGone(claim.Name, pv.Name)
}

// TestProvisionMetricsWithControllerManagerBinder runs the sidecar as
// upstream is deployed, its binder off and kube-controller-manager's on:
// claims provisioned without a failure count in
// controller_persistentvolumeclaim_provision_total only, as with upstream.
// The in-flight finalizer that the provisioner itself adds and removes here
// must not make the provisioning library sync the claim again, which it
// counts in controller_persistentvolumeclaim_provision_failed_total ("PV
// already exists") and announces with another Provisioning event.
func TestProvisionMetricsWithControllerManagerBinder(t *testing.T) {
	cp := controlplane.StartForTest(t, controlplane.Config{
		Controllers: append([]string{controlplane.PVBinderController}, controlplane.DefaultControllers...),
	})
	endpoint := "127.0.0.1:" + strconv.Itoa(freePort(t))
	s := newStack(t, stackConfig{controlPlane: cp, memory: true, sidecarArgs: []string{"--http-endpoint=" + endpoint, "--enable-binder=false"}})
	sc := s.class("kcm", nil)
	const n = 5
	claims := make([]*corev1.PersistentVolumeClaim, n)
	for i := range claims {
		claims[i] = s.claim(testutil.NewPVC(s.ns, fmt.Sprintf("c%d", i)).Class(sc.Name))
	}
	for _, c := range claims {
		bound, _ := s.waitBound(c.Name)
		if inflight.Has(bound) {
			testutil.Eventually(t, 0, "claim "+c.Name+" keeps the in-flight finalizer", func(ctx context.Context) (bool, error) {
				return !inflight.Has(s.getClaim(c.Name)), nil
			})
		}
	}
	waitMetrics(t, endpoint, []string{
		`controller_persistentvolumeclaim_provision_total{class="` + sc.Name + `",source=""} ` + strconv.Itoa(n),
	})
	_, body, err := httpGet(t.Context(), endpoint, "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(body) {
		if strings.HasPrefix(line, "controller_persistentvolumeclaim_provision_failed_total{") {
			t.Errorf("a failure counted for claims that were all provisioned at the first try: %s", strings.TrimSpace(line))
		}
	}
	for _, c := range claims {
		list, err := s.c.CoreV1().Events(s.ns).List(t.Context(), metav1.ListOptions{FieldSelector: "involvedObject.uid=" + string(c.UID) + ",reason=Provisioning"})
		if err != nil {
			t.Fatal(err)
		}
		var provisioning int32
		for _, e := range list.Items {
			provisioning += max(e.Count, 1)
		}
		if provisioning > 1 {
			t.Errorf("claim %s: %d Provisioning events, want 1", c.Name, provisioning)
		}
	}
}

// TestReadyzDriverUnhealthy runs the sidecar against the example driver
// whose storage disappears (its root replaced by an empty directory, as an
// unmounted disk leaves its mount point): the driver's Probe fails, /readyz
// answers 503 with the driver's reason while the sidecar keeps running, and
// once the storage is back /readyz answers 200 and a claim is provisioned.
func TestReadyzDriverUnhealthy(t *testing.T) {
	endpoint := "127.0.0.1:" + strconv.Itoa(freePort(t))
	s := newStack(t, stackConfig{sidecarArgs: []string{"--http-endpoint=" + endpoint}})
	readyz := func(ctx context.Context) (int, string, error) { return httpGet(ctx, endpoint, "/readyz") }
	testutil.Eventually(t, 0, "/readyz not ready", func(ctx context.Context) (bool, error) {
		code, _, err := readyz(ctx)
		return code == http.StatusOK, err
	})

	root, away := s.driver.Root, s.driver.Root+".away"
	if err := os.Rename(root, away); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	var body string
	testutil.Eventually(t, 0, "/readyz still 200 with the driver's storage gone", func(ctx context.Context) (bool, error) {
		code, b, err := readyz(ctx)
		body = b
		return code == http.StatusServiceUnavailable, err
	})
	for _, want := range []string{"csi-driver:", "FailedPrecondition", "dir backend storage is gone", "volumes: no such file or directory"} {
		if !strings.Contains(body, want) {
			t.Errorf("/readyz body %q does not contain %q", body, want)
		}
	}
	select {
	case <-s.sidecar.Exited():
		t.Fatalf("the sidecar exited when the driver turned unhealthy: %v", s.sidecar.ExitErr())
	default:
	}

	if err := os.Remove(root); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(away, root); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 0, "/readyz not 200 with the storage back", func(ctx context.Context) (bool, error) {
		code, _, err := readyz(ctx)
		return code == http.StatusOK, err
	})
	sc := s.class("back", nil)
	claim := s.claim(testutil.NewPVC(s.ns, "back").Class(sc.Name))
	_, pv := s.waitBound(claim.Name)
	s.deleteAndWaitGone(claim.Name, pv.Name)
}

// httpGet gets path from the sidecar's --http-endpoint; a sidecar that does
// not listen yet gives code 0 and no error.
func httpGet(ctx context.Context, endpoint, path string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+endpoint+path, nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", nil // not listening yet
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// waitMetrics waits until the sidecar's /metrics holds every line of want.
func waitMetrics(t *testing.T, endpoint string, want []string) {
	t.Helper()
	testutil.Eventually(t, 0, "metrics missing", func(ctx context.Context) (bool, error) {
		_, body, err := httpGet(ctx, endpoint, "/metrics")
		if err != nil {
			return false, err
		}
		for _, w := range want {
			if !strings.Contains(body, w) {
				t.Logf("/metrics lacks %s", w)
				return false, nil
			}
		}
		return true, nil
	})
}

func freePort(t *testing.T) int {
	t.Helper()
	port, err := controlplane.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return port
}
