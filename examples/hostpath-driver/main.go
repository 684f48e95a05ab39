// Command hostpath-driver is a small, real CSI driver for one node, the
// example that csi-provisioner's integration tests, demo, benchmark and
// chaos tests run. See README.md and package driver.
//
// main only turns flags into a driver.Config, validates it and calls
// driver.Run until SIGTERM or SIGINT. Exit codes: 0 after a clean
// shutdown (or --version, --help), 2 for bad flags or configuration, 1
// when the driver fails.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/klog/v2"

	"github.com/kube-storage/csi-provisioner/examples/hostpath-driver/driver"
)

// version is stamped at build time: go build -ldflags "-X main.version=v1.2.3".
var version = "dev"

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run is main without the process exit, so that tests can call it.
func run(args []string, stdout, stderr io.Writer) int {
	cfg, showVersion, err := parseFlags(args, stderr)
	switch {
	case errors.Is(err, flag.ErrHelp):
		return 0
	case err != nil:
		return 2 // parseFlags has printed the error
	case showVersion:
		fmt.Fprintln(stdout, version)
		return 0
	}
	if err := cfg.Validate(); err != nil {
		fmt.Fprintf(stderr, "hostpath-driver: %v\n", err)
		return 2
	}
	defer klog.Flush()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	ctx = klog.NewContext(ctx, klog.Background())
	if err := driver.Run(ctx, cfg); err != nil {
		klog.Background().Error(err, "Driver failed")
		return 1
	}
	return 0
}

// parseFlags parses args into a driver.Config. It prints any error to
// stderr as one line before returning it; --help prints the usage.
func parseFlags(args []string, stderr io.Writer) (driver.Config, bool, error) {
	cfg := driver.DefaultConfig()
	cfg.VendorVersion = version
	capacity := quantity(cfg.CapacityBytes)
	maxVolume := quantity(cfg.MaxVolumeSize)
	createSecrets, deleteSecrets := keyValues{}, keyValues{}
	failCode := cfg.Faults.FailCode.String()

	fs := flag.NewFlagSet("hostpath-driver", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	showVersion := fs.Bool("version", false, "Print the version and exit.")
	fs.StringVar(&cfg.Endpoint, "endpoint", cfg.Endpoint, "CSI endpoint: a unix socket path or unix:// URL. Other schemes are refused: CSI only allows unix sockets.")
	fs.StringVar(&cfg.DriverName, "drivername", cfg.DriverName, "Name of the driver, returned by GetPluginInfo.")
	fs.StringVar(&cfg.NodeID, "node-id", "", "ID of the node this driver serves (required).")
	fs.StringVar(&cfg.Backend, "backend", cfg.Backend, `Where volumes live: "dir" (directories and sparse files under --root, state in <root>/state.json) or "memory" (nothing on disk).`)
	fs.StringVar(&cfg.Root, "root", "", "Directory of the dir backend (required with --backend=dir).")
	fs.Var(&capacity, "capacity", "Total bytes the driver may hand out to volumes, as a quantity (e.g. 100Gi).")
	fs.Var(&maxVolume, "max-volume-size", "Largest volume, as a quantity (e.g. 10Gi).")
	fs.BoolVar(&cfg.EnableTopology, "enable-topology", cfg.EnableTopology, "Report topology "+driver.TopologyKey+"=<node-id> and honour accessibility requirements.")
	fs.BoolVar(&cfg.EnableAttach, "enable-attach", cfg.EnableAttach, "Advertise PUBLISH_UNPUBLISH_VOLUME and implement ControllerPublish/UnpublishVolume.")
	fs.BoolVar(&cfg.SingleNodeMultiWriter, "single-node-multi-writer", cfg.SingleNodeMultiWriter, "Advertise SINGLE_NODE_MULTI_WRITER and accept the SINGLE_NODE_SINGLE_WRITER and SINGLE_NODE_MULTI_WRITER access modes.")
	fs.Var(createSecrets, "require-create-secret", "KEY=VALUE that every CreateVolume must carry in its secrets, else UNAUTHENTICATED. Repeatable.")
	fs.Var(deleteSecrets, "require-delete-secret", "KEY=VALUE that every DeleteVolume must carry in its secrets, else UNAUTHENTICATED. Repeatable.")
	fs.DurationVar(&cfg.Faults.CreateLatency, "create-latency", 0, "Fault injection: CreateVolume does its work, then waits this long before answering.")
	fs.DurationVar(&cfg.Faults.DeleteLatency, "delete-latency", 0, "Fault injection: DeleteVolume does its work, then waits this long before answering.")
	fs.Float64Var(&cfg.Faults.FailCreateRate, "fail-create-rate", 0, "Fault injection: fraction (0..1) of CreateVolume calls that fail with --fail-code before changing anything.")
	fs.Float64Var(&cfg.Faults.FailDeleteRate, "fail-delete-rate", 0, "Fault injection: fraction (0..1) of DeleteVolume calls that fail with --fail-code before changing anything.")
	fs.StringVar(&failCode, "fail-code", failCode, "Fault injection: gRPC code of injected failures (e.g. Unavailable, ResourceExhausted, DEADLINE_EXCEEDED).")
	fs.Float64Var(&cfg.Faults.HangCreateRate, "hang-create-rate", 0, "Fault injection: fraction (0..1) of CreateVolume calls that create the volume and then never answer until the caller gives up.")
	fs.Float64Var(&cfg.Faults.HangDeleteRate, "hang-delete-rate", 0, "Fault injection: fraction (0..1) of DeleteVolume calls that delete the volume and then never answer until the caller gives up.")
	fs.BoolVar(&cfg.Faults.IgnoreContentSource, "ignore-content-source", false, "Fault injection: CreateVolume ignores the volume content source (clone or snapshot) and creates an empty volume, answering without content_source.")
	fs.BoolVar(&cfg.Faults.EchoSecrets, "echo-secrets", false, "Fault injection: a CreateVolume or DeleteVolume refused for its secrets (--require-create-secret, --require-delete-secret) quotes the secrets it was sent in its error message, as a driver that formats the request into its errors does.")
	fs.Uint64Var(&cfg.Faults.Seed, "fault-seed", 0, "Fault injection: seed of the random generator; 0 picks one and logs it.")
	klog.InitFlags(fs)

	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(stderr)
			fs.PrintDefaults()
		} else {
			fmt.Fprintf(stderr, "hostpath-driver: %v\n", err)
		}
		return cfg, false, err
	}
	if fs.NArg() > 0 {
		err := fmt.Errorf("unexpected arguments: %q", fs.Args())
		fmt.Fprintf(stderr, "hostpath-driver: %v\n", err)
		return cfg, false, err
	}
	code, err := driver.ParseCode(failCode)
	if err != nil {
		err = fmt.Errorf("--fail-code: %w", err)
		fmt.Fprintf(stderr, "hostpath-driver: %v\n", err)
		return cfg, false, err
	}
	cfg.Faults.FailCode = code
	cfg.CapacityBytes = int64(capacity)
	cfg.MaxVolumeSize = int64(maxVolume)
	cfg.RequireCreateSecrets = createSecrets
	cfg.RequireDeleteSecrets = deleteSecrets
	return cfg, *showVersion, nil
}

// quantity is a flag.Value for a byte count written as a Kubernetes
// resource quantity (100Gi, 1T, 512Mi, 1073741824).
type quantity int64

func (q *quantity) String() string {
	return resource.NewQuantity(int64(*q), resource.BinarySI).String()
}

func (q *quantity) Set(s string) error {
	v, err := resource.ParseQuantity(s)
	if err != nil {
		return err
	}
	if v.Sign() < 0 || v.CmpInt64(math.MaxInt64) > 0 {
		return fmt.Errorf("%s is not a whole number of bytes that fits in 64 bits", s)
	}
	n := v.Value() // rounds a fraction up
	if v.Cmp(*resource.NewQuantity(n, resource.BinarySI)) != 0 {
		return fmt.Errorf("%s is not a whole number of bytes that fits in 64 bits", s)
	}
	*q = quantity(n)
	return nil
}

// keyValues is a repeatable KEY=VALUE flag.Value. String never shows
// values: they are secrets.
type keyValues map[string]string

func (kv keyValues) String() string {
	keys := make([]string, 0, len(kv))
	for k := range kv {
		keys = append(keys, k+"=***")
	}
	sort.Strings(keys)
	return strings.Join(keys, ",")
}

func (kv keyValues) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return errors.New("want KEY=VALUE")
	}
	kv[k] = v
	return nil
}
