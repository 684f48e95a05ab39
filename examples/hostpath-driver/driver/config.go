package driver

import (
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
)

// Defaults, in one place; the binary's flags use them too.
const (
	DefaultEndpoint      = "unix:///tmp/hostpath-csi.sock"
	DefaultDriverName    = "hostpath.csi.kube-storage.io"
	DefaultCapacity      = int64(1) << 40 // 1Ti
	DefaultMaxVolumeSize = int64(1) << 40 // 1Ti
	// DefaultVolumeSize is the size of a volume whose CreateVolume asks
	// for no particular size (required_bytes 0), capped by limit_bytes and
	// by the maximum volume size.
	DefaultVolumeSize = int64(1) << 30 // 1Gi
	// DefaultShutdownTimeout bounds how long Serve waits for calls in
	// flight once its context ends.
	DefaultShutdownTimeout = 10 * time.Second

	// TopologyKey is the one topology segment this driver reports; its
	// value is the node ID.
	TopologyKey = "topology.hostpath.csi/node"

	// BackendDir and BackendMemory are the values of Config.Backend.
	BackendDir    = "dir"
	BackendMemory = "memory"
)

// Config is everything the driver needs. Build it with DefaultConfig, set
// fields, and check it with Validate before New.
type Config struct {
	// Endpoint is where Run listens: a unix socket path or unix:// URL.
	Endpoint string
	// DriverName is returned by GetPluginInfo.
	DriverName string
	// VendorVersion is returned by GetPluginInfo.
	VendorVersion string
	// NodeID identifies the one node this driver serves.
	NodeID string

	// Backend is BackendDir or BackendMemory; Root is the dir backend's
	// directory.
	Backend string
	Root    string

	// CapacityBytes is the total the driver may hand out to volumes;
	// MaxVolumeSize caps a single volume.
	CapacityBytes int64
	MaxVolumeSize int64

	// EnableTopology reports TopologyKey=NodeID on volumes and the node,
	// and honours CreateVolume's accessibility requirements.
	EnableTopology bool
	// EnableAttach advertises PUBLISH_UNPUBLISH_VOLUME and implements
	// ControllerPublishVolume/ControllerUnpublishVolume.
	EnableAttach bool
	// SingleNodeMultiWriter advertises SINGLE_NODE_MULTI_WRITER (controller
	// and node) and accepts the SINGLE_NODE_SINGLE_WRITER and
	// SINGLE_NODE_MULTI_WRITER access modes.
	SingleNodeMultiWriter bool

	// RequireCreateSecrets and RequireDeleteSecrets are key/value pairs
	// that every CreateVolume / DeleteVolume must carry in its secrets,
	// or it fails with UNAUTHENTICATED.
	RequireCreateSecrets map[string]string
	RequireDeleteSecrets map[string]string

	// Faults configures fault injection; the zero value injects nothing.
	Faults Faults

	// ShutdownTimeout bounds how long Serve waits for calls in flight
	// after its context ends; 0 means DefaultShutdownTimeout.
	ShutdownTimeout time.Duration
}

// Faults makes CreateVolume and DeleteVolume misbehave on purpose, for
// reliability tests of the sidecar. For each call, in this order:
//
//  1. with probability Fail*Rate the call fails with FailCode before it
//     looks at the request or changes anything;
//  2. otherwise the call does its work (which may succeed or fail);
//  3. then, with probability Hang*Rate, it does not answer until the
//     caller's context ends (a client timeout after the work was done);
//  4. otherwise it waits *Latency before answering. If the caller gives up
//     during the wait, the work stays done, as with a real backend.
//
// Random draws come from one generator seeded with Seed, so a run with the
// same seed and the same sequence of calls injects the same faults.
type Faults struct {
	CreateLatency  time.Duration
	DeleteLatency  time.Duration
	FailCreateRate float64
	FailDeleteRate float64
	// FailCode is the gRPC code of injected failures; codes.OK means the
	// default, codes.Unavailable.
	FailCode       codes.Code
	HangCreateRate float64
	HangDeleteRate float64
	// Seed seeds the generator; 0 picks a random seed, which New logs.
	Seed uint64
	// IgnoreContentSource makes every CreateVolume ignore the request's
	// volume_content_source: the volume is created empty and the answer
	// has no content_source, as from a driver that does not support the
	// source it was given (the CO must not take such a volume for a
	// clone or a restore).
	IgnoreContentSource bool
	// EchoSecrets makes a CreateVolume or DeleteVolume refused for its
	// secrets (RequireCreateSecrets, RequireDeleteSecrets) quote the
	// secrets it was sent in its error message, as a careless driver that
	// formats the request into its errors does (the CO must not show them).
	EchoSecrets bool
}

// Enabled reports whether any fault is configured.
func (f Faults) Enabled() bool {
	return f.CreateLatency > 0 || f.DeleteLatency > 0 ||
		f.FailCreateRate > 0 || f.FailDeleteRate > 0 ||
		f.HangCreateRate > 0 || f.HangDeleteRate > 0 ||
		f.IgnoreContentSource || f.EchoSecrets
}

// DefaultConfig returns a Config with every default set. NodeID is empty
// and Root is empty, so it does not Validate until they are set (or the
// backend is memory).
func DefaultConfig() Config {
	return Config{
		Endpoint:        DefaultEndpoint,
		DriverName:      DefaultDriverName,
		VendorVersion:   "dev",
		Backend:         BackendDir,
		CapacityBytes:   DefaultCapacity,
		MaxVolumeSize:   DefaultMaxVolumeSize,
		EnableTopology:  true,
		ShutdownTimeout: DefaultShutdownTimeout,
		Faults:          Faults{FailCode: codes.Unavailable},
	}
}

// ErrUnsupportedEndpoint is wrapped by ParseEndpoint and Validate when the
// endpoint is not a unix socket: the CSI spec only allows unix sockets
// between a CO and a plugin.
var ErrUnsupportedEndpoint = errors.New("only unix socket endpoints are supported (CSI requires unix domain sockets)")

// ParseEndpoint returns the socket path of endpoint, which is either a
// bare absolute or relative path or a unix:// URL (unix:///abs/path).
// Any other scheme (tcp://, dns:///, ...) yields an error wrapping
// ErrUnsupportedEndpoint.
func ParseEndpoint(endpoint string) (string, error) {
	if endpoint == "" {
		return "", errors.New("endpoint is empty")
	}
	if !strings.Contains(endpoint, "://") {
		return endpoint, nil
	}
	u, err := url.Parse(endpoint)
	if err != nil {
		return "", fmt.Errorf("parse endpoint %q: %w", endpoint, err)
	}
	if u.Scheme != "unix" {
		return "", fmt.Errorf("endpoint %q: %w", endpoint, ErrUnsupportedEndpoint)
	}
	// unix://tmp/x.sock would parse as host "tmp": refuse it rather than
	// listen somewhere unexpected.
	if u.Host != "" {
		return "", fmt.Errorf("endpoint %q: a unix URL needs three slashes and an absolute path, e.g. unix:///tmp/csi.sock", endpoint)
	}
	if u.Path == "" {
		return "", fmt.Errorf("endpoint %q has no socket path", endpoint)
	}
	return u.Path, nil
}

// ParseCode returns the gRPC code with the given name. It accepts the Go
// names ("Unavailable", "DeadlineExceeded") and the proto names
// ("UNAVAILABLE", "DEADLINE_EXCEEDED"), in any case.
func ParseCode(name string) (codes.Code, error) {
	want := strings.ToLower(strings.ReplaceAll(name, "_", ""))
	for c := codes.OK; c <= codes.Unauthenticated; c++ {
		if strings.ToLower(c.String()) == want {
			return c, nil
		}
	}
	return codes.Unknown, fmt.Errorf("unknown gRPC code %q", name)
}

// pluginNameRE is the CSI spec's rule for GetPluginInfo's name (domain
// name notation, at most 63 characters, alphanumeric at both ends).
var pluginNameRE = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9.\-_]{0,61}[A-Za-z0-9])?$`)

// ConfigError lists every problem Validate found. Its message is one line.
type ConfigError struct {
	Problems []error
}

func (e *ConfigError) Error() string {
	msgs := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		msgs[i] = p.Error()
	}
	return "invalid configuration: " + strings.Join(msgs, "; ")
}

// Unwrap lets errors.Is find, for example, ErrUnsupportedEndpoint.
func (e *ConfigError) Unwrap() []error { return e.Problems }

// Validate checks c and returns a *ConfigError listing every problem, or
// nil.
func (c Config) Validate() error {
	var problems []error
	bad := func(format string, args ...any) { problems = append(problems, fmt.Errorf(format, args...)) }

	if _, err := ParseEndpoint(c.Endpoint); err != nil {
		problems = append(problems, err)
	}
	if !pluginNameRE.MatchString(c.DriverName) {
		bad("driver name %q is not a valid CSI plugin name (domain notation, at most 63 characters, alphanumeric at both ends)", c.DriverName)
	}
	if c.VendorVersion == "" {
		bad("vendor version is empty")
	}
	switch {
	case c.NodeID == "":
		bad("node ID is required (--node-id)")
	case len(c.NodeID) > 256:
		bad("node ID is longer than the 256 bytes CSI allows")
	case c.EnableTopology && len(c.NodeID) > 63:
		bad("node ID %q is longer than 63 characters, which a topology segment value may not be", c.NodeID)
	}
	switch c.Backend {
	case BackendDir:
		if c.Root == "" {
			bad("the dir backend needs a root directory (--root)")
		}
	case BackendMemory:
		if c.Root != "" {
			bad("root %q is set but the memory backend keeps nothing on disk", c.Root)
		}
	default:
		bad("backend %q is neither %q nor %q", c.Backend, BackendDir, BackendMemory)
	}
	if c.CapacityBytes <= 0 {
		bad("capacity must be positive, not %d", c.CapacityBytes)
	}
	if c.MaxVolumeSize <= 0 {
		bad("maximum volume size must be positive, not %d", c.MaxVolumeSize)
	}
	if _, ok := c.RequireCreateSecrets[""]; ok {
		bad("a required create secret has an empty key")
	}
	if _, ok := c.RequireDeleteSecrets[""]; ok {
		bad("a required delete secret has an empty key")
	}
	if c.ShutdownTimeout < 0 {
		bad("shutdown timeout is negative")
	}
	problems = append(problems, c.Faults.validate()...)
	if len(problems) > 0 {
		return &ConfigError{Problems: problems}
	}
	return nil
}

func (f Faults) validate() []error {
	var problems []error
	for _, r := range []struct {
		name string
		rate float64
	}{
		{"fail-create-rate", f.FailCreateRate}, {"fail-delete-rate", f.FailDeleteRate},
		{"hang-create-rate", f.HangCreateRate}, {"hang-delete-rate", f.HangDeleteRate},
	} {
		if !(r.rate >= 0 && r.rate <= 1) { // also catches NaN
			problems = append(problems, fmt.Errorf("%s must be between 0 and 1, not %v", r.name, r.rate))
		}
	}
	if f.CreateLatency < 0 || f.DeleteLatency < 0 {
		problems = append(problems, errors.New("latencies must not be negative"))
	}
	if f.FailCode > codes.Unauthenticated {
		problems = append(problems, fmt.Errorf("fail code %d is not a gRPC code", f.FailCode))
	}
	return problems
}
