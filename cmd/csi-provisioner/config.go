package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/kubernetes-csi/csi-lib-utils/leaderelection"
	"k8s.io/apimachinery/pkg/util/validation"
	utilversion "k8s.io/apimachinery/pkg/util/version"
	clientleaderelection "k8s.io/client-go/tools/leaderelection"
	"k8s.io/component-base/featuregate"
	logsapi "k8s.io/component-base/logs/api/v1"
	_ "k8s.io/component-base/logs/json/register" // --logging-format=json, as upstream

	"github.com/kube-storage/csi-provisioner/pkg/csiclient"
	"github.com/kube-storage/csi-provisioner/pkg/provisioner"
)

// Config is every command-line setting. Upstream's flags keep upstream's
// names and meanings; the defaults that differ from upstream are marked
// "ours" and explained in the README.
type Config struct {
	ShowVersion bool

	// Connection to the API server.
	Master       string
	Kubeconfig   string
	KubeAPIQPS   float64
	KubeAPIBurst int

	// The CSI driver.
	CSIAddress        string
	CSIConnectTimeout time.Duration // ours
	Timeout           time.Duration

	// Provisioning.
	VolumeNamePrefix            string
	VolumeNameUUIDLength        int
	RetryIntervalStart          time.Duration
	RetryIntervalMax            time.Duration
	WorkerThreads               int
	StrictTopology              bool
	ImmediateTopology           bool
	ExtraCreateMetadata         bool
	DefaultFSType               string
	ControllerPublishReadOnly   bool
	PreventVolumeModeConversion bool

	// The binder (ours).
	EnableBinder       bool
	BinderResyncPeriod time.Duration
	BinderWorkers      int

	// Leader election.
	LeaderElection              bool
	LeaderElectionNamespace     string
	LeaderElectionLeaseDuration time.Duration
	LeaderElectionRenewDeadline time.Duration
	LeaderElectionRetryPeriod   time.Duration
	LeaderElectionLabels        stringMap

	// HTTP.
	HTTPEndpoint   string
	MetricsAddress string
	MetricsPath    string
	EnablePprof    bool

	// Data sources.
	CloningProtectionThreads    int
	SnapshotOrphanSweepInterval time.Duration

	// Storage capacity (CSIStorageCapacity objects).
	CapacityThreads             int
	KubeAPICapacityQPS          float64
	KubeAPICapacityBurst        int
	EnableCapacity              bool
	CapacityForImmediateBinding bool
	CapacityPollInterval        time.Duration
	CapacityOwnerrefLevel       int
	// Namespace ($NAMESPACE) holds the CSIStorageCapacity objects; PodName
	// ($POD_NAME) is where the search for their owner starts.
	Namespace string
	PodName   string

	// Distributed provisioning: one sidecar per node (NodeName, from
	// $NODE_NAME).
	NodeDeployment                 bool
	NodeDeploymentImmediateBinding bool
	NodeDeploymentBaseDelay        time.Duration
	NodeDeploymentMaxDelay         time.Duration
	NodeName                       string

	// Accepted for compatibility; Go sets GOMAXPROCS from the CPU limit.
	Automaxprocs bool

	// FeatureGates are the provisioner's gates (--feature-gates).
	FeatureGates featuregate.MutableFeatureGate
	// Logging is component-base's logging configuration (-v, --logging-format, ...).
	Logging *logsapi.LoggingConfiguration
	// loggingGates are the logging feature gates; --feature-gates does not
	// reach them, as upstream.
	loggingGates featuregate.MutableVersionedFeatureGate

	set map[string]bool // flags given on the command line
	// given lists the flags given on the command line as --name=value, in
	// the order of their names, for the start-up log line.
	given []string
}

// Feature gates of the provisioner, with upstream's names.
const (
	// FeatureTopology is GA and on by default; as upstream it is not
	// locked: off, the driver's topology capability is ignored.
	FeatureTopology featuregate.Feature = "Topology"
	// FeatureVolumeAttributesClass passes VolumeAttributesClass parameters
	// as mutable_parameters.
	FeatureVolumeAttributesClass featuregate.Feature = "VolumeAttributesClass"
	// FeatureCrossNamespaceVolumeDataSource lets a claim's dataSourceRef name
	// a claim or VolumeSnapshot of another namespace that a Gateway API
	// ReferenceGrant there allows.
	FeatureCrossNamespaceVolumeDataSource featuregate.Feature = "CrossNamespaceVolumeDataSource"
	// FeatureReleaseLeaderElectionOnExit releases the Lease on a clean exit
	// so a new leader takes over at once.
	FeatureReleaseLeaderElectionOnExit featuregate.Feature = "ReleaseLeaderElectionOnExit"
)

// Defaults that differ from upstream, in one place. See the README section
// "Defaults that differ from upstream" for why.
const (
	defaultKubeAPIQPS    = 300 // upstream 5: caps provisioning under 2 volumes/s
	defaultKubeAPIBurst  = 600 // upstream 10
	defaultBinderWorkers = 16
	defaultWorkers       = 100 // upstream 100
)

func newConfig() *Config {
	c := &Config{
		FeatureGates: featuregate.NewFeatureGate(),
		Logging:      logsapi.NewLoggingConfiguration(),
		loggingGates: featuregate.NewVersionedFeatureGate(utilversion.MustParse("1.37")),
		set:          map[string]bool{},
	}
	if err := c.FeatureGates.Add(map[featuregate.Feature]featuregate.FeatureSpec{
		FeatureTopology:                       {Default: true, PreRelease: featuregate.GA},
		FeatureVolumeAttributesClass:          {Default: true, PreRelease: featuregate.GA},
		FeatureCrossNamespaceVolumeDataSource: {Default: false, PreRelease: featuregate.Alpha},
		FeatureReleaseLeaderElectionOnExit:    {Default: false, PreRelease: featuregate.Alpha},
	}); err != nil {
		panic(err) // a programming error in the table above
	}
	if err := logsapi.AddFeatureGates(c.loggingGates); err != nil {
		panic(err)
	}
	return c
}

// flagSet registers every flag on a new FlagSet bound to c.
func (c *Config) flagSet(output io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("csi-provisioner", flag.ContinueOnError)
	fs.SetOutput(output)

	fs.BoolVar(&c.ShowVersion, "version", false, "Show version and exit.")
	fs.StringVar(&c.Master, "master", "", "Master URL to build a client config from. Either this or kubeconfig needs to be set if the provisioner is being run out of cluster.")
	fs.StringVar(&c.Kubeconfig, "kubeconfig", "", "Absolute path to the kubeconfig file. Required only when running out of cluster.")
	fs.Float64Var(&c.KubeAPIQPS, "kube-api-qps", defaultKubeAPIQPS, "QPS to use while communicating with the kubernetes apiserver; events have a second budget of the same size. (upstream default 5)")
	fs.IntVar(&c.KubeAPIBurst, "kube-api-burst", defaultKubeAPIBurst, "Burst to use while communicating with the kubernetes apiserver. (upstream default 10)")

	fs.StringVar(&c.CSIAddress, "csi-address", "/run/csi/socket", "The gRPC endpoint for the CSI driver: a unix socket path, or a unix:// or unix: URL.")
	fs.DurationVar(&c.CSIConnectTimeout, "csi-connect-timeout", 30*time.Second, "How long to wait for the CSI driver's socket at start-up.")
	fs.DurationVar(&c.Timeout, "timeout", 10*time.Second, "Timeout for every call to the CSI driver.")

	fs.StringVar(&c.VolumeNamePrefix, "volume-name-prefix", "pvc", "Prefix to apply to the name of a created volume.")
	fs.IntVar(&c.VolumeNameUUIDLength, "volume-name-uuid-length", -1, "Truncates generated UUID of a created volume to this length (1 to 32). Defaults behavior is to NOT truncate.")
	fs.DurationVar(&c.RetryIntervalStart, "retry-interval-start", time.Second, "Initial retry interval of failed provisioning or deletion. It doubles with each failure, up to retry-interval-max.")
	fs.DurationVar(&c.RetryIntervalMax, "retry-interval-max", 5*time.Minute, "Maximum retry interval of failed provisioning or deletion.")
	fs.IntVar(&c.WorkerThreads, "worker-threads", defaultWorkers, "Number of provisioner worker threads, in other words nr. of simultaneous CSI calls.")
	fs.BoolVar(&c.StrictTopology, "strict-topology", false, "Late binding: pass only selected node topology to CreateVolume Request, unlike default behavior of passing aggregated cluster topologies that match with topology keys of the selected node.")
	fs.BoolVar(&c.ImmediateTopology, "immediate-topology", true, "Immediate binding: pass aggregated cluster topologies for all nodes where the CSI driver is available (enabled, the default) or no topology requirements (if disabled).")
	fs.BoolVar(&c.ExtraCreateMetadata, "extra-create-metadata", false, "If set, add pv/pvc metadata to plugin create requests as parameters.")
	fs.StringVar(&c.DefaultFSType, "default-fstype", "", "The default filesystem type of the volume to provision when fstype is unspecified in the StorageClass. If the default is not set and fstype is unset in the StorageClass, then no fstype will be set")
	fs.BoolVar(&c.ControllerPublishReadOnly, "controller-publish-readonly", false, "This option enables PV to be marked as readonly at controller publish volume call if PVC accessmode has been set to ROX.")
	fs.BoolVar(&c.PreventVolumeModeConversion, "prevent-volume-mode-conversion", true, "Prevents an unauthorised user from modifying the volume mode when creating a PVC from an existing VolumeSnapshot.")

	fs.BoolVar(&c.EnableBinder, "enable-binder", true, "Bind claims and volumes of this driver and release them (the job of kube-controller-manager's persistentvolume-binder). With false, the sidecar relies on kube-controller-manager, as upstream.")
	fs.DurationVar(&c.BinderResyncPeriod, "binder-resync-period", 15*time.Second, "How often the binder re-checks claims and volumes that may need work (the role of --pvclaimbinder-sync-period).")
	fs.IntVar(&c.BinderWorkers, "binder-workers", defaultBinderWorkers, "Number of binder workers for claims and, separately, for volumes.")

	fs.BoolVar(&c.LeaderElection, "leader-election", false, "Enable leader election.")
	fs.StringVar(&c.LeaderElectionNamespace, "leader-election-namespace", "", "Namespace where the leader election resource lives. Defaults to the pod namespace if not set.")
	fs.DurationVar(&c.LeaderElectionLeaseDuration, "leader-election-lease-duration", 15*time.Second, "Duration, in seconds, that non-leader candidates will wait to force acquire leadership. Defaults to 15 seconds.")
	fs.DurationVar(&c.LeaderElectionRenewDeadline, "leader-election-renew-deadline", 10*time.Second, "Duration, in seconds, that the acting leader will retry refreshing leadership before giving up. Defaults to 10 seconds.")
	fs.DurationVar(&c.LeaderElectionRetryPeriod, "leader-election-retry-period", 5*time.Second, "Duration, in seconds, the LeaderElector clients should wait between tries of actions. Defaults to 5 seconds.")
	fs.Var(&c.LeaderElectionLabels, "leader-election-labels", "List of labels to add to lease when given replica becomes leader. Formatted as a comma-separated list of key:value labels. Example: 'my-label:my-value,my-second-label:my-second-value'")

	fs.StringVar(&c.HTTPEndpoint, "http-endpoint", "", "The TCP network address where the HTTP server for diagnostics, including metrics, leader election health check and readiness (/readyz), will listen (example: `:8080`). The default is empty string, which means the server is disabled.")
	fs.StringVar(&c.MetricsAddress, "metrics-address", "", "(deprecated) The TCP network address where the prometheus metrics endpoint will listen (example: `:8080`). The default is empty string, which means metrics endpoint is disabled. Only one of `--metrics-address` and `--http-endpoint` can be set.")
	fs.StringVar(&c.MetricsPath, "metrics-path", "/metrics", "The HTTP path where prometheus metrics will be exposed. Default is `/metrics`.")
	fs.BoolVar(&c.EnablePprof, "enable-pprof", false, "Enable pprof profiling on the TCP network address specified by --http-endpoint (or --metrics-address). The HTTP path is /debug/pprof/.")
	fs.BoolVar(&c.EnablePprof, "enable-profiling", false, "Alias of --enable-pprof.")

	fs.IntVar(&c.CloningProtectionThreads, "cloning-protection-threads", 1, "Number of simultaneously running threads, handling cloning finalizer removal.")
	fs.DurationVar(&c.SnapshotOrphanSweepInterval, "snapshot-orphan-sweep-interval", 5*time.Minute, "Interval of the sweep for orphaned VolumeSnapshot finalizers; 0 disables it.")
	fs.IntVar(&c.CapacityThreads, "capacity-threads", 1, "Number of simultaneously running threads, handling CSIStorageCapacity objects.")
	fs.Float64Var(&c.KubeAPICapacityQPS, "kube-api-capacity-qps", 1, "QPS to use for storage capacity updates.")
	fs.IntVar(&c.KubeAPICapacityBurst, "kube-api-capacity-burst", 5, "Burst to use for storage capacity updates.")
	fs.BoolVar(&c.EnableCapacity, "enable-capacity", false, "This enables producing CSIStorageCapacity objects with capacity information from the driver's GetCapacity call. They are created in the namespace given by the NAMESPACE environment variable.")
	fs.BoolVar(&c.CapacityForImmediateBinding, "capacity-for-immediate-binding", false, "Enables producing capacity information for storage classes with immediate binding.")
	fs.DurationVar(&c.CapacityPollInterval, "capacity-poll-interval", time.Minute, "How long the external-provisioner waits before checking for storage capacity changes.")
	fs.IntVar(&c.CapacityOwnerrefLevel, "capacity-ownerref-level", 1, "The level indicates the number of objects that need to be traversed starting from the pod identified by the POD_NAME and NAMESPACE environment variables to reach the owning object for CSIStorageCapacity objects: -1 for no owner, 0 for the pod itself, 1 for a StatefulSet or DaemonSet, 2 for a Deployment, etc.")
	fs.BoolVar(&c.NodeDeployment, "node-deployment", false, "Enables deploying the external-provisioner together with a CSI driver on nodes to manage node-local volumes. The node is given by the NODE_NAME environment variable; the built-in binder is off (kube-controller-manager binds).")
	fs.BoolVar(&c.NodeDeploymentImmediateBinding, "node-deployment-immediate-binding", true, "Determines whether immediate binding is supported when deployed on each node.")
	fs.DurationVar(&c.NodeDeploymentBaseDelay, "node-deployment-base-delay", 20*time.Second, "Determines how long the external-provisioner sleeps initially before trying to own a PVC with immediate binding.")
	fs.DurationVar(&c.NodeDeploymentMaxDelay, "node-deployment-max-delay", 60*time.Second, "Determines how long the external-provisioner sleeps at most before trying to own a PVC with immediate binding.")
	fs.BoolVar(&c.Automaxprocs, "automaxprocs", false, "Automatically set GOMAXPROCS to match Linux container CPU quota. (Always done: the Go runtime of this build, 1.25 or later, sets GOMAXPROCS from the container's CPU limit unless GOMAXPROCS is set.)")

	fs.Var(featureGateFlag{c.FeatureGates}, "feature-gates", "A set of key=value pairs that describe feature gates for alpha/experimental features. Options are:\n"+strings.Join(c.FeatureGates.KnownFeatures(), "\n"))
	logsapi.AddGoFlags(c.Logging, fs)
	return fs
}

// featureGateFlag adapts a MutableFeatureGate to flag.Value.
type featureGateFlag struct{ featuregate.MutableFeatureGate }

func (f featureGateFlag) String() string {
	if s, ok := f.MutableFeatureGate.(fmt.Stringer); ok {
		return s.String()
	}
	return ""
}

// parseFlags parses args into a new Config. Errors are one line, without the
// usage text; --help prints the usage to output and returns flag.ErrHelp.
func parseFlags(args []string, output io.Writer) (*Config, error) {
	c := newConfig()
	fs := c.flagSet(io.Discard)
	if err := fs.Parse(attachedVerbosity(fs, args)); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(output)
			fs.PrintDefaults()
		}
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, unexpectedArgument(fs, args[:len(args)-fs.NArg()], fs.Arg(0))
	}
	fs.Visit(func(f *flag.Flag) {
		c.set[f.Name] = true
		c.given = append(c.given, "--"+f.Name+"="+f.Value.String())
	})
	c.Namespace, c.PodName, c.NodeName = os.Getenv("NAMESPACE"), os.Getenv("POD_NAME"), os.Getenv("NODE_NAME")
	if c.NodeDeployment && !c.set["enable-binder"] {
		// The binder is one per cluster; in node deployment every node
		// runs a sidecar, so kube-controller-manager binds, as upstream.
		c.EnableBinder = false
	}
	return c, nil
}

// unexpectedArgument is the error for arg, the first argument that is not a
// flag, after the flags in before. Upstream's parser (pflag) ignores such
// words, also a value given after a boolean flag without "=": there
// "--leader-election false" turns leader election on. Here the word stops
// the sidecar, and after a boolean flag the error says how to write it.
func unexpectedArgument(fs *flag.FlagSet, before []string, arg string) error {
	if n := len(before); n > 0 && before[n-1] != "--" && !strings.Contains(before[n-1], "=") {
		name := strings.TrimLeft(before[n-1], "-")
		if f := fs.Lookup(name); f != nil {
			if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
				return fmt.Errorf("unexpected argument %q after --%s: a boolean flag takes its value after = (--%s=%s); upstream ignores the word and turns the flag on", arg, name, name, arg)
			}
		}
	}
	return fmt.Errorf("unexpected argument %q: all settings are flags (see --help)", arg)
}

// attachedVerbosity returns args with -v<N> spelled -v=<N>. Upstream parses
// its flags with pflag, where -v is the shorthand of --v and takes its value
// attached too; Go's flag package would look for a flag named "v5". The
// value of a flag given as the next argument (--volume-name-prefix -v5) is
// left alone, as is everything from the first argument that is not a flag
// or "--" on, where parsing stops.
func attachedVerbosity(fs *flag.FlagSet, args []string) []string {
	out := slices.Clone(args)
	for i := 0; i < len(out); i++ {
		arg := out[i]
		if arg == "--" || len(arg) < 2 || arg[0] != '-' {
			break
		}
		if n, ok := strings.CutPrefix(arg, "-v"); ok && n != "" && strings.Trim(n, "0123456789") == "" {
			out[i] = "-v=" + n
			continue
		}
		name := strings.TrimLeft(arg, "-")
		if strings.Contains(name, "=") {
			continue
		}
		if f := fs.Lookup(name); f != nil {
			if b, ok := f.Value.(interface{ IsBoolFlag() bool }); !ok || !b.IsBoolFlag() {
				i++ // the next argument is this flag's value
			}
		}
	}
	return out
}

// Validate checks the combination of settings and applies the logging
// configuration. Errors are one line and name the flag.
func (c *Config) Validate() error {
	switch {
	case c.VolumeNamePrefix == "":
		return errors.New("--volume-name-prefix must not be empty")
	case c.VolumeNameUUIDLength == 0:
		// Upstream accepts 0 and names every volume "<prefix>-".
		return fmt.Errorf("--volume-name-uuid-length=0 would give every volume the same name %q: use -1 (the default) to keep the whole UID, or 1 to 32", c.VolumeNamePrefix+"-")
	case c.VolumeNameUUIDLength != -1 && (c.VolumeNameUUIDLength < 1 || c.VolumeNameUUIDLength > 32):
		return fmt.Errorf("--volume-name-uuid-length must be -1 (keep the whole UID) or between 1 and 32, got %d", c.VolumeNameUUIDLength)
	case c.Timeout <= 0:
		return fmt.Errorf("--timeout must be positive, got %s", c.Timeout)
	case c.CSIConnectTimeout <= 0:
		return fmt.Errorf("--csi-connect-timeout must be positive, got %s", c.CSIConnectTimeout)
	case c.WorkerThreads < 1:
		return fmt.Errorf("--worker-threads must be at least 1, got %d", c.WorkerThreads)
	case c.SnapshotOrphanSweepInterval < 0:
		return fmt.Errorf("--snapshot-orphan-sweep-interval must not be negative (0 disables the sweep), got %s", c.SnapshotOrphanSweepInterval)
	case c.CloningProtectionThreads < 1:
		return fmt.Errorf("--cloning-protection-threads must be at least 1, got %d", c.CloningProtectionThreads)
	case c.BinderWorkers < 1:
		return fmt.Errorf("--binder-workers must be at least 1, got %d", c.BinderWorkers)
	case c.BinderResyncPeriod <= 0:
		return fmt.Errorf("--binder-resync-period must be positive, got %s", c.BinderResyncPeriod)
	case c.RetryIntervalStart <= 0 || c.RetryIntervalMax < c.RetryIntervalStart:
		return fmt.Errorf("--retry-interval-start (%s) must be positive and at most --retry-interval-max (%s)", c.RetryIntervalStart, c.RetryIntervalMax)
	case !validRate(c.KubeAPIQPS, c.KubeAPIBurst):
		return fmt.Errorf("--kube-api-qps (%v) must be positive, with --kube-api-burst (%d) at least 1, or negative for no client-side limit", c.KubeAPIQPS, c.KubeAPIBurst)
	}
	if err := c.validateLeaderElection(); err != nil {
		return err
	}
	if err := provisioner.CheckVolumeNamePrefix(c.VolumeNamePrefix, c.VolumeNameUUIDLength); err != nil {
		return fmt.Errorf("--volume-name-prefix: %w", err)
	}
	if err := c.validateHTTP(); err != nil {
		return err
	}
	if err := c.validateCapacity(); err != nil {
		return err
	}
	if err := c.validateNodeDeployment(); err != nil {
		return err
	}
	if err := csiclient.CheckAddress(c.CSIAddress); err != nil {
		return fmt.Errorf("--csi-address: %w", err)
	}
	if err := logsapi.ValidateAndApply(c.Logging, c.loggingGates); err != nil {
		return fmt.Errorf("logging flags: %w", err)
	}
	return nil
}

// validateLeaderElection checks the leader election flags, when it is on.
func (c *Config) validateLeaderElection() error {
	switch {
	case !c.LeaderElection:
		return nil
	case c.LeaderElectionRetryPeriod <= 0 || c.LeaderElectionLeaseDuration <= c.LeaderElectionRenewDeadline ||
		c.LeaderElectionRenewDeadline <= time.Duration(clientleaderelection.JitterFactor*float64(c.LeaderElectionRetryPeriod)):
		// client-go's own checks, which would otherwise panic after start.
		return fmt.Errorf("leader election needs --leader-election-lease-duration (%s) > --leader-election-renew-deadline (%s) > 1.2 × --leader-election-retry-period (%s) > 0",
			c.LeaderElectionLeaseDuration, c.LeaderElectionRenewDeadline, c.LeaderElectionRetryPeriod)
	case c.LeaderElectionLeaseDuration < time.Second:
		// The Lease records whole seconds: 0 would make it expired for
		// every replica at once.
		return fmt.Errorf("--leader-election-lease-duration %s is under one second, which the Lease records as 0", c.LeaderElectionLeaseDuration)
	case c.LeaderElectionNamespace != "" && len(validation.IsDNS1123Label(c.LeaderElectionNamespace)) > 0:
		// Upstream retries creating the Lease there for ever.
		return fmt.Errorf("--leader-election-namespace %q is no namespace name: %s", c.LeaderElectionNamespace, strings.Join(validation.IsDNS1123Label(c.LeaderElectionNamespace), "; "))
	}
	return nil
}

// validateHTTP checks the HTTP endpoint flags.
func (c *Config) validateHTTP() error {
	switch {
	case c.HTTPEndpoint != "" && c.MetricsAddress != "":
		return errors.New("only one of --http-endpoint and --metrics-address can be set")
	case !strings.HasPrefix(c.MetricsPath, "/"):
		return fmt.Errorf("--metrics-path must start with /, got %q", c.MetricsPath)
	case c.MetricsPath == "/readyz" || c.MetricsPath == leaderelection.HealthCheckerAddress || strings.HasPrefix(c.MetricsPath, "/debug/pprof/"):
		// Served by the sidecar itself on the same address: two handlers
		// for one path would panic at start.
		return fmt.Errorf("--metrics-path %q is one of the sidecar's own paths (/readyz, /healthz/leader-election, /debug/pprof/)", c.MetricsPath)
	}
	if err := servablePath(c.MetricsPath); err != nil {
		return fmt.Errorf("--metrics-path %q is not a path the HTTP server can serve: %w", c.MetricsPath, err)
	}
	return nil
}

// servablePath registers path on a new http.ServeMux next to the sidecar's
// own paths, as serving metrics does, and returns what the ServeMux
// refuses (it panics: a space, a brace, a pattern that conflicts), so
// that the sidecar stops with one line instead of a stack trace once it
// has connected to the driver.
func servablePath(path string) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%v", r)
		}
	}()
	mux := http.NewServeMux()
	for _, own := range []string{"/readyz", leaderelection.HealthCheckerAddress, "/debug/pprof/"} {
		mux.Handle(own, http.NotFoundHandler())
	}
	mux.Handle(path, http.NotFoundHandler())
	return nil
}

// validRate reports whether a client's QPS and burst flags make sense.
// A negative QPS turns client-go's rate limiter off (rest.Config documents
// it; upstream passes the flag through, so manifests use it), and the burst
// is then unused. Zero is refused: client-go would silently turn it into
// its default of 5 QPS, which caps provisioning under 2 volumes/s.
func validRate(qps float64, burst int) bool {
	return qps < 0 || (qps > 0 && burst >= 1)
}

// validateCapacity checks the storage capacity flags and, with
// --enable-capacity, the environment they need.
func (c *Config) validateCapacity() error {
	switch {
	case c.CapacityThreads < 1:
		return fmt.Errorf("--capacity-threads must be at least 1, got %d", c.CapacityThreads)
	case !validRate(c.KubeAPICapacityQPS, c.KubeAPICapacityBurst):
		return fmt.Errorf("--kube-api-capacity-qps (%v) must be positive, with --kube-api-capacity-burst (%d) at least 1, or negative for no client-side limit", c.KubeAPICapacityQPS, c.KubeAPICapacityBurst)
	case c.CapacityPollInterval <= 0:
		return fmt.Errorf("--capacity-poll-interval must be positive, got %s", c.CapacityPollInterval)
	case c.CapacityOwnerrefLevel < -1:
		return fmt.Errorf("--capacity-ownerref-level must be -1 (no owner) or more, got %d", c.CapacityOwnerrefLevel)
	case c.EnableCapacity && c.Namespace == "":
		return errors.New("--enable-capacity needs the NAMESPACE environment variable: the namespace of the CSIStorageCapacity objects (set it from the pod's metadata.namespace)")
	case c.EnableCapacity && c.CapacityOwnerrefLevel >= 0 && c.PodName == "":
		return fmt.Errorf("--enable-capacity with --capacity-ownerref-level=%d needs the POD_NAME environment variable (set it from the pod's metadata.name), or --capacity-ownerref-level=-1 for objects without an owner", c.CapacityOwnerrefLevel)
	}
	return nil
}

// validateNodeDeployment checks the distributed provisioning flags and,
// with --node-deployment, the environment and the flags that cannot go
// with it.
func (c *Config) validateNodeDeployment() error {
	switch {
	case c.NodeDeploymentBaseDelay <= 0 || c.NodeDeploymentMaxDelay < c.NodeDeploymentBaseDelay:
		return fmt.Errorf("--node-deployment-base-delay (%s) must be positive and at most --node-deployment-max-delay (%s)", c.NodeDeploymentBaseDelay, c.NodeDeploymentMaxDelay)
	case !c.NodeDeployment:
		return nil
	case c.NodeName == "":
		return errors.New("--node-deployment needs the NODE_NAME environment variable: the node this sidecar serves (set it from the pod's spec.nodeName)")
	case c.LeaderElection:
		return errors.New("--node-deployment runs one sidecar on every node and each serves its own node; --leader-election would stop all but one")
	case c.EnableBinder:
		return errors.New("--node-deployment cannot run the built-in binder (--enable-binder=true): every node runs a sidecar and they would all bind the same claims; kube-controller-manager binds, as upstream")
	}
	return nil
}

// stringMap is a flag of comma-separated key:value pairs, as csi-lib-utils'
// --leader-election-labels.
type stringMap map[string]string

func (m *stringMap) String() string {
	var parts []string
	for k, v := range *m {
		parts = append(parts, k+":"+v)
	}
	return strings.Join(parts, ",")
}

// Set adds the labels of value; a repeated flag adds to the earlier ones,
// as csi-lib-utils' flag does. Each item is one key:value label, checked
// here rather than when the Lease is written.
func (m *stringMap) Set(value string) error {
	if *m == nil {
		*m = stringMap{}
	}
	for _, pair := range strings.Split(value, ",") {
		if pair == "" {
			continue
		}
		k, v, ok := strings.Cut(pair, ":")
		if !ok || k == "" || strings.Contains(v, ":") {
			return fmt.Errorf("%q is not key:value", pair)
		}
		if errs := append(validation.IsQualifiedName(k), validation.IsValidLabelValue(v)...); len(errs) > 0 {
			return fmt.Errorf("%q is not a valid label: %s", pair, strings.Join(errs, "; "))
		}
		(*m)[k] = v
	}
	return nil
}
