package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kubernetes-csi/csi-lib-utils/leaderelection"
	"github.com/kubernetes-csi/csi-lib-utils/metrics"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	k8smetrics "k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"  // client-go request metrics
	_ "k8s.io/component-base/metrics/prometheus/workqueue" // workqueue metrics
	"k8s.io/klog/v2"
)

// httpServer serves /metrics, /readyz, /healthz/leader-election (registered
// by csi-lib-utils' leader election) and, with --enable-pprof,
// /debug/pprof/. The listener opens before the driver is connected, so
// /readyz can say what the sidecar waits for.
type httpServer struct {
	mux *http.ServeMux
	// libRegistry holds the provisioner library's metrics.
	libRegistry *prometheus.Registry
	// kubeRegistry holds the binder's component-base metrics.
	kubeRegistry k8smetrics.KubeRegistry
	metricsMux   *http.ServeMux // the mux that serves metrics: mux, or the --metrics-address one
	// election is where csi-lib-utils' leader election registers its
	// /healthz/leader-election check (see electionHealth).
	election *electionHealth
}

// electionHealth serves /healthz/leader-election from the moment the
// listener opens: 200 until the leader election registers its check, then
// that check. The election starts only once the driver answers and the
// start-up checks pass, which can take minutes (a driver still
// initialising its backend); a liveness probe on a path that answered 404
// until then (or, upstream, on a port not open yet) restarted the sidecar
// again and again meanwhile, into CrashLoopBackOff, whose delay then
// outlasted the driver's wait. Nothing can fail to be renewed before the
// election starts, as client-go's check answers 200 for a process that
// does not lead. /readyz says what the sidecar waits for.
type electionHealth struct {
	check atomic.Pointer[http.Handler]
}

// Handle is csi-lib-utils' leaderelection.Server: it takes the check.
func (e *electionHealth) Handle(_ string, h http.Handler) { e.check.Store(&h) }

func (e *electionHealth) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if h := e.check.Load(); h != nil {
		(*h).ServeHTTP(w, r)
		return
	}
	_, _ = w.Write([]byte("ok: the leader election has not started yet (see /readyz)"))
}

func startHTTP(ctx context.Context, cfg *Config, health *health) (*httpServer, error) {
	s := &httpServer{
		mux:          http.NewServeMux(),
		libRegistry:  prometheus.NewRegistry(),
		kubeRegistry: k8smetrics.NewKubeRegistry(),
	}
	s.metricsMux = s.mux
	addr := cfg.HTTPEndpoint
	if cfg.MetricsAddress != "" {
		addr = cfg.MetricsAddress
	}
	if addr == "" {
		if cfg.EnablePprof {
			klog.FromContext(ctx).Info("--enable-pprof has no effect without --http-endpoint or --metrics-address (as upstream)")
		}
		return s, nil
	}
	if cfg.HTTPEndpoint != "" {
		s.mux.Handle("/readyz", health)
		if cfg.LeaderElection {
			s.election = &electionHealth{}
			s.mux.Handle(leaderelection.HealthCheckerAddress, s.election)
		}
	}
	if cfg.EnablePprof { // on either address, as upstream
		s.mux.HandleFunc("/debug/pprof/", pprof.Index)
		s.mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		s.mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		s.mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		s.mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on --http-endpoint/--metrics-address %q: %w", addr, err)
	}
	logger := klog.FromContext(ctx)
	srv := &http.Server{Handler: s.mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error(err, "HTTP server stopped", "address", addr)
		}
	}()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	logger.Info("Serving HTTP", "address", l.Addr().String())
	return s, nil
}

// serveMetrics registers the metrics handler: the CSI call histogram
// (csi_sidecar_operations_seconds), the provisioner library's
// controller_persistentvolume* metrics, the binder's metrics and the
// process, Go, client-go and workqueue metrics of the legacy registry.
func (s *httpServer) serveMetrics(cfg *Config, mm metrics.CSIMetricsManager) {
	gatherers := prometheus.Gatherers{legacyregistry.DefaultGatherer, mm.GetRegistry(), s.libRegistry, s.kubeRegistry}
	// As upstream, the handler counts its own requests
	// (promhttp_metric_handler_requests_total, _requests_in_flight).
	s.metricsMux.Handle(cfg.MetricsPath, promhttp.InstrumentMetricHandler(s.libRegistry,
		promhttp.HandlerFor(gatherers, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})))
}

// health is the /readyz check: every registered check must pass. A check
// is registered when the part it checks exists (the driver connection, the
// informers of the leader), so a missing check means "not ready yet".
type health struct {
	mu     sync.Mutex
	checks map[string]func(context.Context) error
}

func newHealth() *health { return &health{checks: map[string]func(context.Context) error{}} }

func (h *health) add(name string, check func(context.Context) error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.checks[name] = check
}

func (h *health) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.mu.Lock()
	names := make([]string, 0, len(h.checks))
	checks := make(map[string]func(context.Context) error, len(h.checks))
	for n, c := range h.checks {
		names = append(names, n)
		checks[n] = c
	}
	h.mu.Unlock()
	sort.Strings(names)
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	var failed []string
	if _, ok := checks["csi-driver"]; !ok {
		failed = append(failed, "csi-driver: not connected yet")
	}
	for _, n := range names {
		if err := checks[n](ctx); err != nil {
			failed = append(failed, n+": "+err.Error())
		}
	}
	if len(failed) > 0 {
		http.Error(w, "not ready: "+strings.Join(failed, "; "), http.StatusServiceUnavailable)
		return
	}
	_, _ = w.Write([]byte("ok"))
}
