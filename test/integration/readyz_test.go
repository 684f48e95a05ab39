package integration

import (
	"context"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/kube-storage/csi-provisioner/internal/controlplane"
	"github.com/kube-storage/csi-provisioner/internal/testutil"
)

// TestReadyzDuringStartUp: while the sidecar's start-up checks wait for
// the API server (here its access reviews answered 503, which it retries),
// /readyz answers 503 naming them, although the driver is connected; once
// they pass, 200. A pod that said Ready before its checks were done let a
// rolling update move on while it could not work yet, and might still exit.
func TestReadyzDuringStartUp(t *testing.T) {
	cp := controlplane.Need(t, shared)
	e := newEnv(t, cp)
	var refuse atomic.Bool
	refuse.Store(true)
	_, kubeconfig := startFaultProxy(t, cp, 1, func(r *http.Request, _ bool, _ *rand.Rand) fault {
		if refuse.Load() && strings.Contains(r.URL.Path, "/apis/authorization.k8s.io/") {
			return fault503
		}
		return faultNone
	})
	port, err := controlplane.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	endpoint := "127.0.0.1:" + strconv.Itoa(port)
	s := e.startStackWith(stackConfig{kubeconfig: kubeconfig, noWait: true, sidecarArgs: []string{"--http-endpoint=" + endpoint,
		"--leader-election", "--leader-election-namespace=" + e.ns}})
	get := func(ctx context.Context, path string) (int, string) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+endpoint+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, "" // not listening yet
		}
		defer func() { _ = resp.Body.Close() }()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	readyz := func(ctx context.Context) (int, string) { return get(ctx, "/readyz") }
	if err := s.sidecar.WaitLog(t.Context(), "Start-up read failed; trying again"); err != nil {
		t.Fatal(err)
	}
	code, body := readyz(t.Context())
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "start-up: start-up checks under way") || strings.Contains(body, "csi-driver") {
		t.Errorf("/readyz during the start-up checks, with the driver connected = %d %q; want 503 naming only the start-up checks", code, body)
	}
	// The liveness probe's path: the election has not started, nothing
	// can fail to be renewed, and a failure would get the sidecar
	// restarted while it waits.
	if code, body := get(t.Context(), "/healthz/leader-election"); code != http.StatusOK {
		t.Errorf("/healthz/leader-election during the start-up checks = %d %q, want 200", code, body)
	}
	refuse.Store(false)
	testutil.Eventually(t, 0, "/readyz not ready once the start-up checks passed", func(ctx context.Context) (bool, error) {
		code, _ := readyz(ctx)
		return code == http.StatusOK, nil
	})
}
