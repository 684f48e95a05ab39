package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kubernetes-csi/csi-lib-utils/leaderelection"
	"k8s.io/client-go/kubernetes/fake"
)

// TestLeaderElectionRegistersItsHealthCheck: once the election runs,
// /healthz/leader-election is client-go's check (which fails for a leader
// that stopped renewing), not the placeholder that answers 200 for ever.
func TestLeaderElectionRegistersItsHealthCheck(t *testing.T) {
	cfg := newConfig()
	cfg.HTTPEndpoint, cfg.MetricsPath, cfg.LeaderElection = "127.0.0.1:0", "/metrics", true
	cfg.LeaderElectionNamespace = "default"
	cfg.LeaderElectionLeaseDuration, cfg.LeaderElectionRenewDeadline, cfg.LeaderElectionRetryPeriod = 15*time.Second, 10*time.Second, 2*time.Second
	srv, err := startHTTP(t.Context(), cfg, newHealth())
	if err != nil {
		t.Fatal(err)
	}
	leading := make(chan struct{})
	// Never canceled: csi-lib-utils exits the process when the election ends.
	go func() {
		_ = runWithLeaderElection(context.Background(), cfg, fake.NewClientset(), newFence(cfg.LeaderElectionLeaseDuration, func(string) {}),
			"test.csi.example.com", srv, func(context.Context) { close(leading); select {} }, func() {})
	}()
	select {
	case <-leading:
	case <-time.After(30 * time.Second):
		t.Fatal("never led")
	}
	rec := httptest.NewRecorder()
	srv.mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, leaderelection.HealthCheckerAddress, nil))
	if srv.election.check.Load() == nil || strings.Contains(rec.Body.String(), "has not started") {
		t.Errorf("leading, /healthz/leader-election = %d %q: the election's check is not registered", rec.Code, rec.Body.String())
	}
}
