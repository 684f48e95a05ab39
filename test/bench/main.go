// Command bench measures a provisioner sidecar end to end on a local control
// plane: throughput and latency of provisioning and binding, deletion rate,
// API requests per volume, the sidecar's CPU and memory, and the API
// server's write ceiling measured in the same run. `make bench` runs it.
//
// The sidecar runs as a separate process so its CPU and memory are its own.
// The example hostpath driver runs with its memory backend (zero latency).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/kube-storage/csi-provisioner/internal/controlplane"
	"github.com/kube-storage/csi-provisioner/internal/e2e"
)

type options struct {
	N              int
	Rate           float64
	Binder         string
	ProvisionerCmd string
	SidecarArgs    string
	SidecarEnv     string
	QPS            float64
	Burst          int
	KCMQPS         float64
	KCMBurst       int
	CeilingN       int
	Concurrency    int
	Idle           time.Duration
	Fsync          bool
	BinDir         string
	Out            string
	Timeout        time.Duration
	KeepDir        bool
	HeapProfile    string
	CPUProfile     string
	// APIServerProfile is the prefix of two CPU profiles of kube-apiserver:
	// <prefix>-ceiling.pprof while the ceiling writer writes, and
	// <prefix>-provision.pprof while the provisioner provisions.
	APIServerProfile string
}

func main() {
	var o options
	flag.IntVar(&o.N, "n", 1000, "number of PVCs")
	flag.Float64Var(&o.Rate, "rate", 0, "offered PVC creations per second (0: all at once)")
	flag.StringVar(&o.Binder, "binder", "ours", "who binds: ours (the sidecar's binder) or kcm (kube-controller-manager's persistentvolume-binder; the sidecar runs with --enable-binder=false)")
	flag.StringVar(&o.ProvisionerCmd, "provisioner-cmd", "", "run this provisioner command instead of ours, with the same flags (for example an upstream external-provisioner binary)")
	flag.StringVar(&o.SidecarArgs, "sidecar-args", "", "extra flags for the provisioner, space separated")
	flag.StringVar(&o.SidecarEnv, "sidecar-env", "", "extra environment variables for the provisioner, space separated NAME=value (for example GOMEMLIMIT=100MiB)")
	flag.Float64Var(&o.QPS, "qps", 0, "--kube-api-qps for the provisioner (0: its default)")
	flag.IntVar(&o.Burst, "burst", 0, "--kube-api-burst for the provisioner (0: its default)")
	flag.Float64Var(&o.KCMQPS, "kcm-qps", 1000, "kube-controller-manager --kube-api-qps: its protection controllers remove a finalizer from every deleted claim and volume, and its default (20) would cap deletion at the environment, not the provisioner")
	flag.IntVar(&o.KCMBurst, "kcm-burst", 2000, "kube-controller-manager --kube-api-burst")
	flag.IntVar(&o.CeilingN, "ceiling-n", 500, "volumes written by the unthrottled reference writer that measures the API server's write ceiling")
	flag.IntVar(&o.Concurrency, "concurrency", 64, "concurrent requests of the benchmark's own clients")
	flag.DurationVar(&o.Idle, "idle", 0, "after binding, measure the provisioner's idle CPU over this long (e.g. 1m)")
	flag.BoolVar(&o.Fsync, "fsync", false, "let etcd fsync (slower, as in production)")
	flag.StringVar(&o.BinDir, "bin-dir", "", "directory with csi-provisioner and hostpath-driver (default: build them)")
	flag.StringVar(&o.Out, "out", "", "JSON result file (default test/bench/results/<time>.json)")
	flag.DurationVar(&o.Timeout, "timeout", 30*time.Minute, "give up after this long")
	flag.BoolVar(&o.KeepDir, "keep-dir", false, "keep the working directory with the logs of every process")
	flag.StringVar(&o.CPUProfile, "cpu-profile", "", "save a 10s CPU profile of the provisioner taken while it provisions (our sidecar, started with --enable-pprof)")
	flag.StringVar(&o.APIServerProfile, "apiserver-profile", "", "save 5s CPU profiles of kube-apiserver to <prefix>-ceiling.pprof (while the ceiling writer writes; make it take longer with -ceiling-n) and <prefix>-provision.pprof (while the provisioner provisions, after the benchmark created the claims)")
	flag.StringVar(&o.HeapProfile, "heap-profile", "", "after binding, save the provisioner's heap profile here (our sidecar, started with --enable-pprof)")
	flag.Parse()
	if o.Binder != "ours" && o.Binder != "kcm" {
		fmt.Fprintln(os.Stderr, "bench: -binder must be ours or kcm")
		os.Exit(2)
	}
	for _, kv := range strings.Fields(o.SidecarEnv) {
		if name, _, ok := strings.Cut(kv, "="); !ok || name == "" {
			fmt.Fprintf(os.Stderr, "bench: -sidecar-env: %q is not NAME=value\n", kv)
			os.Exit(2)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	res, err := run(ctx, o)
	if res != nil {
		printResult(os.Stdout, res)
		if werr := writeJSON(o, res); werr != nil {
			fmt.Fprintf(os.Stderr, "bench: %v\n", werr)
		}
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench: %v\n", err)
		os.Exit(1)
	}
}

// apiServerArgs turns kube-apiserver's profiling on for -apiserver-profile
// (the control plane turns it off: tests do not need it).
func apiServerArgs(o options) []string {
	if o.APIServerProfile == "" {
		return nil
	}
	return []string{"--profiling=true"}
}

func writeJSON(o options, res *result) error {
	path := o.Out
	if path == "" {
		root, err := controlplane.RepoRoot()
		if err != nil {
			return err
		}
		path = filepath.Join(root, "test", "bench", "results", time.Now().UTC().Format("20060102-150405")+".json")
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return err
	}
	fmt.Printf("\nJSON: %s\n", path)
	return nil
}

func run(ctx context.Context, o options) (*result, error) {
	res := &result{Options: o, Machine: describeMachine()}
	bins, err := e2e.Build(ctx, o.BinDir)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "csi-provisioner-bench-")
	if err != nil {
		return nil, err
	}
	if o.KeepDir {
		logf("logs are kept in %s", dir)
	} else {
		defer func() { _ = os.RemoveAll(dir) }()
	}

	logf("starting the control plane (etcd fsync %v)", o.Fsync)
	cp, err := controlplane.Start(ctx, controlplane.Config{
		Dir: filepath.Join(dir, "cp"), Fsync: o.Fsync,
		ControllerManagerQPS: float32(o.KCMQPS), ControllerManagerBurst: o.KCMBurst,
		ExtraAPIServerArgs: apiServerArgs(o),
	})
	if err != nil {
		return nil, err
	}
	defer func() { _ = cp.Stop() }()
	b := newBench(cp, o)

	logf("measuring the API server's write ceiling with %d volumes", o.CeilingN)
	if res.Ceiling, err = b.measureCeiling(ctx, "ceiling"); err != nil {
		return res, err
	}
	logf("ceiling: %.1f volumes/s (%.0f writes/s)", res.Ceiling.VolumesPerSecond, res.Ceiling.WritesPerSecond)

	if o.Binder == "kcm" {
		if err := cp.StartControllerManager(append([]string{controlplane.PVBinderController}, controlplane.DefaultControllers...)...); err != nil {
			return res, err
		}
	}
	driver, err := e2e.StartDriver(ctx, bins.Driver, e2e.DriverConfig{Dir: dir, Memory: true, Name: "bench.csi.kube-storage.io",
		Args: []string{"--capacity=1Ei"}}) // room for any -n of 1Gi claims
	if err != nil {
		return res, err
	}
	defer func() { _ = driver.Stop(5 * time.Second) }()
	b.driver = driver

	proc, err := b.startProvisioner(ctx, bins, dir)
	if err != nil {
		return res, err
	}
	defer func() { _ = proc.Stop(10 * time.Second) }()
	res.Provisioner = strings.Join(proc.Cmd.Args, " ")
	sampler := sampleAnon(proc.Cmd.Process.Pid)
	defer sampler.close()

	if err := b.provision(ctx, res); err != nil {
		return res, err
	}
	if u, err := readProc(proc.Cmd.Process.Pid); err == nil {
		res.Sidecar.CPUSecondsProvision = u.CPU.Seconds()
		res.Sidecar.RSSAfterBindMiB = mib(u.RSS)
		res.Sidecar.PeakRSSMiB = mib(u.PeakRSS)
	}
	anon, file := sampler.peaks()
	res.Sidecar.PeakAnonMiB, res.Sidecar.PeakFileMiB = mib(anon), mib(file)
	if o.HeapProfile != "" {
		if err := b.saveProfile(ctx, "/debug/pprof/heap?gc=1", o.HeapProfile); err != nil {
			return res, err
		}
	}
	if o.Idle > 0 {
		if err := b.measureIdle(ctx, proc.Cmd.Process.Pid, res); err != nil {
			return res, err
		}
	}
	if err := b.deleteAll(ctx, res); err != nil {
		return res, err
	}
	res.SidecarMetricsAfterDelete = b.scrapeSidecar(ctx)
	if u, err := readProc(proc.Cmd.Process.Pid); err == nil {
		res.Sidecar.CPUSecondsTotal = u.CPU.Seconds()
		res.Sidecar.PeakRSSMiB = mib(u.PeakRSS)
	}
	anon, file = sampler.peaks()
	res.Sidecar.PeakAnonMiB, res.Sidecar.PeakFileMiB = mib(anon), mib(file)

	if o.Binder != "kcm" {
		if err := proc.Stop(10 * time.Second); err != nil {
			return res, err
		}
		logf("measuring the write ceiling again, with the provisioner stopped")
		c, err := b.measureCeiling(ctx, "ceiling-after")
		if err != nil {
			return res, err
		}
		res.CeilingAfter = &c
		res.Provision.FractionOfCeilingAfter = res.Provision.VolumesPerSecond / c.VolumesPerSecond
		logf("ceiling after: %.1f volumes/s (%.0f writes/s)", c.VolumesPerSecond, c.WritesPerSecond)
	}
	return res, nil
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s bench: %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, args...))
}
