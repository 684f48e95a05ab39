package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kubernetes-csi/csi-lib-utils/leaderelection"

	"github.com/kube-storage/csi-provisioner/internal/testutil"
)

// readyz returns the status and body of /readyz.
func readyz(h *health) (int, string) {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	return rec.Code, rec.Body.String()
}

// TestAwaitCachesReadiness checks that /readyz says "not ready" while the
// caches sync: awaitCaches registers its check before it waits (a check
// registered after the wait would leave /readyz at 200 during the sync,
// with the driver connected).
func TestAwaitCachesReadiness(t *testing.T) {
	h := newHealth()
	h.add("csi-driver", func(context.Context) error { return nil })
	var provisioner, binder atomic.Bool
	binder.Store(true)
	synced := map[string]func() bool{"provisioner": provisioner.Load, "binder": binder.Load}

	done := make(chan bool, 1)
	go func() { done <- awaitCaches(t.Context(), h, synced, provisioner.Load) }()
	testutil.Eventually(t, 0, "/readyz 503 during the sync", func(context.Context) (bool, error) {
		code, body := readyz(h)
		return code == http.StatusServiceUnavailable && strings.Contains(body, "informers: provisioner caches not synced"), nil
	})
	select {
	case <-done:
		t.Fatal("awaitCaches returned before the caches synced")
	default:
	}

	provisioner.Store(true)
	select {
	case ok := <-done:
		if !ok {
			t.Fatal("awaitCaches = false after the caches synced")
		}
	case <-time.After(time.Minute):
		t.Fatal("awaitCaches did not return after the caches synced")
	}
	if code, body := readyz(h); code != http.StatusOK {
		t.Errorf("/readyz after the sync: %d %q, want 200", code, body)
	}
}

func TestAwaitCachesCanceled(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	never := func() bool { return false }
	if awaitCaches(ctx, newHealth(), map[string]func() bool{"provisioner": never}, never) {
		t.Error("awaitCaches = true with ctx done and caches never synced")
	}
}

// TestPprofOnEitherAddress: --enable-pprof serves /debug/pprof/ on
// --metrics-address too, as upstream; /readyz stays --http-endpoint's.
func TestPprofOnEitherAddress(t *testing.T) {
	for _, tt := range []struct {
		name       string
		cfg        Config
		wantReadyz int
	}{
		{"--http-endpoint", Config{HTTPEndpoint: "127.0.0.1:0", EnablePprof: true, MetricsPath: "/metrics"}, http.StatusServiceUnavailable},
		{"--metrics-address", Config{MetricsAddress: "127.0.0.1:0", EnablePprof: true, MetricsPath: "/metrics"}, http.StatusNotFound},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s, err := startHTTP(t.Context(), &tt.cfg, newHealth())
			if err != nil {
				t.Fatal(err)
			}
			for path, want := range map[string]int{"/debug/pprof/": http.StatusOK, "/readyz": tt.wantReadyz} {
				rec := httptest.NewRecorder()
				s.mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
				if rec.Code != want {
					t.Errorf("%s: status %d, want %d", path, rec.Code, want)
				}
			}
		})
	}
}

// TestLeaderElectionHealthBeforeElection: /healthz/leader-election, the
// liveness probe's path, answers 200 from the moment the listener opens,
// while the sidecar still waits for its driver and the election has not
// started; a 404 there (or a closed port, upstream) got the sidecar
// restarted again and again while its driver initialised. Once the
// election registers its check, that check answers.
func TestLeaderElectionHealthBeforeElection(t *testing.T) {
	cfg := Config{HTTPEndpoint: "127.0.0.1:0", LeaderElection: true, MetricsPath: "/metrics"}
	s, err := startHTTP(t.Context(), &cfg, newHealth())
	if err != nil {
		t.Fatal(err)
	}
	get := func() int {
		rec := httptest.NewRecorder()
		s.mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, leaderelection.HealthCheckerAddress, nil))
		return rec.Code
	}
	if code := get(); code != http.StatusOK {
		t.Errorf("before the election: status %d, want 200", code)
	}
	s.election.Handle(leaderelection.HealthCheckerAddress, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "lease not renewed", http.StatusInternalServerError)
	}))
	if code := get(); code != http.StatusInternalServerError {
		t.Errorf("with the election's check failing: status %d, want 500", code)
	}

	noLE := Config{HTTPEndpoint: "127.0.0.1:0", MetricsPath: "/metrics"}
	s, err = startHTTP(t.Context(), &noLE, newHealth())
	if err != nil {
		t.Fatal(err)
	}
	if code := get(); code != http.StatusNotFound {
		t.Errorf("without --leader-election: status %d, want 404 (as upstream)", code)
	}
}
