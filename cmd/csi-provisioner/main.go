// Command csi-provisioner is a CSI provisioner sidecar: it watches
// PersistentVolumeClaims, creates volumes through the CSI driver on
// --csi-address, creates PersistentVolumes for them, binds them and reclaims
// them. It accepts upstream external-provisioner's flags.
//
// main only wires: flags → Config → Validate → components → Run.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"runtime/debug"
	"runtime/metrics"
	"strings"
	"syscall"

	"k8s.io/klog/v2"
)

// defaultGCPercent is the garbage collector's target unless GOGC is set.
const defaultGCPercent = 50

// version is stamped at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run returns the process exit code: 0 on a clean stop (SIGTERM or SIGINT,
// also one that comes while the sidecar still starts), 1 when the sidecar
// fails at run time, 2 for bad flags. With --leader-election, csi-lib-utils
// ends the process itself, with status 1, once the election ends (also
// after a clean stop), as upstream's.
func run(args []string, stdout, stderr io.Writer) int {
	cfg, err := parseFlags(args, stdout)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "csi-provisioner: %v\n", err)
		return 2
	}
	if cfg.ShowVersion {
		fmt.Fprintf(stdout, "csi-provisioner %s\n", version)
		return 0
	}
	if err := cfg.Validate(); err != nil {
		fmt.Fprintf(stderr, "csi-provisioner: %v\n", err)
		return 2
	}
	routeStandardLog()
	if os.Getenv("GOGC") == "" {
		// The sidecar's heap is mostly its informer cache, which lives as
		// long as the process: collecting at 50% growth instead of 100%
		// keeps its resident memory about 20% lower for a few percent more
		// CPU (README, Performance). GOGC in the environment wins.
		debug.SetGCPercent(defaultGCPercent)
	}
	logger := klog.Background()
	signals := make(chan os.Signal, 2)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(signals)
	ctx := stopOnSignal(klog.NewContext(context.Background(), logger), signals, func() {
		klog.FlushAndExit(klog.ExitFlushTimeout, 1)
	})
	// One line says what this process was asked to do: the flags given (the
	// rest have the defaults of --help) and the collector target.
	logger.Info("Starting csi-provisioner", "version", version, "flags", cfg.given, "gcPercent", gcPercent())

	err = runSidecar(ctx, cfg)
	if err != nil && ctx.Err() != nil {
		// Stopped while starting (waiting for the driver's socket or
		// Probe, or for the API server): the stop cut that short, and it
		// is no failure to report with status 1.
		logger.Info("Stopped while starting", "err", err)
		err = nil
	}
	klog.Flush()
	if err != nil {
		fmt.Fprintf(stderr, "csi-provisioner: %v\n", err)
		return 1
	}
	return 0
}

// stopOnSignal returns a context that ends at the first signal on
// signals (SIGTERM or SIGINT): the sidecar then stops, which takes up to
// the event drain (2 s) and, for a leader with ReleaseLeaderElectionOnExit,
// the release of its Lease (up to --leader-election-renew-deadline while
// the API server does not answer). A second signal calls exit at once, as
// upstream's signal handler does, so that an operator's second Ctrl-C or
// kill does not wait for that.
func stopOnSignal(parent context.Context, signals <-chan os.Signal, exit func()) context.Context {
	ctx, stop := context.WithCancel(parent)
	logger := klog.FromContext(parent)
	go func() {
		sig := <-signals
		logger.Info("Stopping; a second signal stops at once", "signal", sig.String())
		stop()
		sig = <-signals
		logger.Info("Second signal: exiting without finishing the stop", "signal", sig.String())
		exit()
	}()
	return ctx
}

// routeStandardLog sends what libraries write with the standard log package
// (net/http's server errors, for one) through klog, as upstream does with
// component-base's InitLogs, so that those lines have klog's header, honour
// --logging-format=json and reach the same stream as every other line.
// InitLogs itself is not called: it would turn contextual logging off again
// after Validate applied the logging configuration.
func routeStandardLog() {
	log.SetOutput(standardLogWriter{})
	log.SetFlags(0)
}

// standardLogWriter writes a standard log line as a klog info line that
// names the caller of the log function (component-base's KlogWriter names
// package log's own file instead).
type standardLogWriter struct{}

// standardLogDepth skips Write, log's output and log's Print/Printf/Println.
const standardLogDepth = 3

func (standardLogWriter) Write(p []byte) (int, error) {
	klog.InfoDepth(standardLogDepth, strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// gcPercent returns the collector's target as set (GOGC or the default).
func gcPercent() uint64 {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return s[0].Value.Uint64()
}
