package main

import (
	"bytes"
	"flag"
	"fmt"
	"slices"
	"strings"
	"testing"

	logsapi "k8s.io/component-base/logs/api/v1"
)

// TestUpstreamFlagDefaults checks that every upstream flag is accepted with
// upstream's default (reference §1a–1b), except the documented differences.
func TestUpstreamFlagDefaults(t *testing.T) {
	c, err := parseFlags(nil, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	fs := c.flagSet(&bytes.Buffer{})
	want := map[string]string{
		"master": "", "kubeconfig": "", "csi-address": "/run/csi/socket",
		"volume-name-prefix": "pvc", "volume-name-uuid-length": "-1",
		"retry-interval-start": "1s", "retry-interval-max": "5m0s", "worker-threads": "100",
		"cloning-protection-threads": "1", "snapshot-orphan-sweep-interval": "5m0s", "capacity-threads": "1",
		"timeout": "10s", "strict-topology": "false", "immediate-topology": "true", "extra-create-metadata": "false",
		"enable-pprof": "false", "default-fstype": "", "kube-api-capacity-qps": "1", "kube-api-capacity-burst": "5",
		"enable-capacity": "false", "capacity-for-immediate-binding": "false", "capacity-poll-interval": "1m0s",
		"capacity-ownerref-level": "1", "node-deployment": "false", "node-deployment-immediate-binding": "true",
		"node-deployment-base-delay": "20s", "node-deployment-max-delay": "1m0s", "controller-publish-readonly": "false",
		"prevent-volume-mode-conversion": "true", "version": "false", "leader-election": "false",
		"leader-election-namespace": "", "leader-election-lease-duration": "15s", "leader-election-renew-deadline": "10s",
		"leader-election-retry-period": "5s", "http-endpoint": "", "metrics-address": "", "metrics-path": "/metrics",
		"automaxprocs": "false",
		// Ours, differing on purpose (README "Defaults that differ from upstream").
		"kube-api-qps": "300", "kube-api-burst": "600",
	}
	for name, def := range want {
		f := fs.Lookup(name)
		if f == nil {
			t.Errorf("flag --%s is not accepted", name)
			continue
		}
		if f.DefValue != def {
			t.Errorf("--%s default = %q, want %q", name, f.DefValue, def)
		}
	}
	for _, name := range []string{"feature-gates", "leader-election-labels", "v", "vmodule", "logging-format", "log-flush-frequency", "log-json-split-stream", "log-json-info-buffer-size", "log-text-split-stream", "enable-binder", "binder-resync-period"} {
		if fs.Lookup(name) == nil {
			t.Errorf("flag --%s is not accepted", name)
		}
	}
	resetLoggingAtCleanup(t)
	if err := c.Validate(); err != nil {
		t.Errorf("defaults do not validate: %v", err)
	}
}

func TestFlagErrors(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		wantErr string // a fragment of the one-line message
	}{
		{name: "unknown flag", args: []string{"--no-such-flag"}, wantErr: "no-such-flag"},
		{name: "bad duration", args: []string{"--timeout=ten"}, wantErr: "timeout"},
		{name: "uuid length over 32", args: []string{"--volume-name-uuid-length=33"}, wantErr: "--volume-name-uuid-length must be -1"},
		{name: "negative uuid length", args: []string{"--volume-name-uuid-length=-2"}, wantErr: "--volume-name-uuid-length"},
		{name: "uuid length 0 (upstream names every volume pvc-)", args: []string{"--volume-name-uuid-length=0"}, wantErr: `--volume-name-uuid-length=0 would give every volume the same name "pvc-"`},
		{name: "empty prefix", args: []string{"--volume-name-prefix="}, wantErr: "--volume-name-prefix must not be empty"},
		{name: "prefix not a name", args: []string{"--volume-name-prefix=PVC"}, wantErr: `--volume-name-prefix: volume name prefix "PVC" does not start a valid PersistentVolume name`},
		{name: "prefix too long for a whole UID", args: []string{"--volume-name-prefix=" + strings.Repeat("p", 217)}, wantErr: "must be no more than 253 characters"},
		{name: "zero timeout", args: []string{"--timeout=0s"}, wantErr: "--timeout must be positive"},
		{name: "no workers", args: []string{"--worker-threads=0"}, wantErr: "--worker-threads"},
		{name: "no cloning protection workers", args: []string{"--cloning-protection-threads=0"}, wantErr: "--cloning-protection-threads must be at least 1"},
		{name: "negative snapshot sweep interval", args: []string{"--snapshot-orphan-sweep-interval=-1s"}, wantErr: "--snapshot-orphan-sweep-interval must not be negative"},
		{name: "both endpoints", args: []string{"--http-endpoint=:8080", "--metrics-address=:8081"}, wantErr: "only one of --http-endpoint and --metrics-address"},
		{name: "lease shorter than renew", args: []string{"--leader-election", "--leader-election-lease-duration=5s"}, wantErr: "leader election needs"},
		{name: "renew within client-go's jitter of the retry period", args: []string{"--leader-election", "--leader-election-retry-period=9s"}, wantErr: "leader election needs"},
		{name: "zero retry period", args: []string{"--leader-election", "--leader-election-retry-period=0s"}, wantErr: "leader election needs"},
		{name: "lease under one second", args: []string{"--leader-election", "--leader-election-lease-duration=900ms", "--leader-election-renew-deadline=800ms", "--leader-election-retry-period=500ms"}, wantErr: "--leader-election-lease-duration 900ms is under one second"},
		{name: "lease namespace that is no name", args: []string{"--leader-election", "--leader-election-namespace=Bad_NS"}, wantErr: `--leader-election-namespace "Bad_NS" is no namespace name: a lowercase RFC 1123 label`},
		{name: "unknown feature gate", args: []string{"--feature-gates=NoSuchGate=true"}, wantErr: "NoSuchGate"},
		// Upstream's binary accepts kube-apiserver's gates (README, Flags).
		{name: "kube-apiserver feature gate", args: []string{"--feature-gates=WatchList=false"}, wantErr: "unrecognized feature gate: WatchList"},
		{name: "positional argument", args: []string{"extra"}, wantErr: `unexpected argument "extra": all settings are flags`},
		// Upstream's pflag ignores the word and turns leader election on.
		{name: "value after a boolean flag", args: []string{"--leader-election", "false"}, wantErr: `unexpected argument "false" after --leader-election: a boolean flag takes its value after = (--leader-election=false)`},
		{name: "word after a boolean flag given a value", args: []string{"--leader-election=true", "false"}, wantErr: `unexpected argument "false": all settings are flags`},
		{name: "word after a flag's value", args: []string{"--timeout", "5s", "true"}, wantErr: `unexpected argument "true": all settings are flags`},
		{name: "metrics on the readiness path", args: []string{"--http-endpoint=:8080", "--metrics-path=/readyz"}, wantErr: "one of the sidecar's own paths"},
		{name: "metrics on a pprof path", args: []string{"--http-endpoint=:8080", "--metrics-path=/debug/pprof/heap"}, wantErr: "one of the sidecar's own paths"},
		// http.ServeMux panics on these: refused before the sidecar
		// starts, with or without an HTTP address.
		{name: "metrics path with a space", args: []string{"--metrics-path=/a b"}, wantErr: `--metrics-path "/a b" is not a path the HTTP server can serve`},
		{name: "metrics path with a brace", args: []string{"--http-endpoint=:8080", "--metrics-path=/a{b"}, wantErr: `--metrics-path "/a{b" is not a path the HTTP server can serve: parsing "/a{b"`},
		{name: "bad labels", args: []string{"--leader-election-labels=novalue"}, wantErr: "key:value"},
		{name: "label with two colons", args: []string{"--leader-election-labels=a:b:c"}, wantErr: `"a:b:c" is not key:value`},
		{name: "invalid label value", args: []string{"--leader-election-labels=a:b c"}, wantErr: `"a:b c" is not a valid label`},
		{name: "bad logging format", args: []string{"--logging-format=xml"}, wantErr: "logging"},
		{name: "retry start above max", args: []string{"--retry-interval-start=10m"}, wantErr: "--retry-interval-start"},
		{name: "tcp csi address", args: []string{"--csi-address=tcp://127.0.0.1:10000"}, wantErr: "--csi-address: CSI driver at \"tcp://127.0.0.1:10000\": the CSI endpoint must be a unix domain socket"},
		{name: "relative csi address", args: []string{"--csi-address=csi.sock"}, wantErr: "must be absolute"},
		{name: "relative unix: csi address", args: []string{"--csi-address=unix:csi.sock"}, wantErr: "must be absolute"},
		{name: "no capacity workers", args: []string{"--capacity-threads=0"}, wantErr: "--capacity-threads must be at least 1"},
		{name: "zero capacity qps", args: []string{"--kube-api-capacity-qps=0"}, wantErr: "--kube-api-capacity-qps"},
		{name: "zero qps (client-go would make it 5)", args: []string{"--kube-api-qps=0"}, wantErr: "--kube-api-qps (0) must be positive"},
		{name: "zero burst", args: []string{"--kube-api-burst=0"}, wantErr: "--kube-api-burst (0) at least 1"},
		{name: "zero capacity poll interval", args: []string{"--capacity-poll-interval=0s"}, wantErr: "--capacity-poll-interval must be positive"},
		{name: "ownerref level below -1", args: []string{"--capacity-ownerref-level=-2"}, wantErr: "--capacity-ownerref-level must be -1"},
		{name: "node deployment without NODE_NAME", args: []string{"--node-deployment"}, env: map[string]string{"NODE_NAME": ""}, wantErr: "--node-deployment needs the NODE_NAME environment variable"},
		{name: "node deployment with leader election", args: []string{"--node-deployment", "--leader-election"}, env: map[string]string{"NODE_NAME": "n1"}, wantErr: "--leader-election would stop all but one"},
		{name: "node deployment with the binder", args: []string{"--node-deployment", "--enable-binder=true"}, env: map[string]string{"NODE_NAME": "n1"}, wantErr: "--node-deployment cannot run the built-in binder"},
		{name: "node deployment delays", args: []string{"--node-deployment-base-delay=2m"}, wantErr: "--node-deployment-base-delay (2m0s) must be positive and at most --node-deployment-max-delay (1m0s)"},
		{name: "capacity without NAMESPACE", args: []string{"--enable-capacity"}, env: map[string]string{"NAMESPACE": "", "POD_NAME": "p"}, wantErr: "--enable-capacity needs the NAMESPACE environment variable"},
		{name: "capacity owner without POD_NAME", args: []string{"--enable-capacity"}, env: map[string]string{"NAMESPACE": "ns", "POD_NAME": ""}, wantErr: "needs the POD_NAME environment variable"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			var stdout, stderr bytes.Buffer
			code := run(tt.args, &stdout, &stderr)
			if code != 2 {
				t.Errorf("exit code = %d, want 2", code)
			}
			msg := stderr.String()
			if !strings.Contains(msg, tt.wantErr) {
				t.Errorf("stderr = %q, want it to contain %q", msg, tt.wantErr)
			}
			if n := strings.Count(strings.TrimSpace(msg), "\n"); n != 0 {
				t.Errorf("error is %d lines, want one: %q", n+1, msg)
			}
		})
	}
}

// TestTopologyGate: upstream's Topology gate is GA but not locked, so
// --feature-gates=Topology=false is accepted (with component-base's GA
// warning) and turns topology off, as upstream.
func TestTopologyGate(t *testing.T) {
	c, err := parseFlags([]string{"--feature-gates=Topology=false"}, &bytes.Buffer{})
	if err != nil {
		t.Fatalf("--feature-gates=Topology=false: %v", err)
	}
	if c.FeatureGates.Enabled(FeatureTopology) {
		t.Error("Topology is still enabled")
	}
	c, err = parseFlags(nil, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if !c.FeatureGates.Enabled(FeatureTopology) {
		t.Error("Topology is off by default")
	}
}

func TestVersionAndHelp(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run([]string{"--version"}, &stdout, &stderr); code != 0 || !strings.Contains(stdout.String(), "csi-provisioner") {
		t.Errorf("--version: code %d, stdout %q, stderr %q", code, stdout.String(), stderr.String())
	}
	stdout.Reset()
	if code := run([]string{"--help"}, &stdout, &stderr); code != 0 || !strings.Contains(stdout.String(), "-csi-address") {
		t.Errorf("--help: code %d, stdout %q", code, stdout.String())
	}
}

// TestHelpBoolFlagsShowNoValue: --help must not show a value after a
// boolean flag. The flag package takes the first `quoted` word of a usage
// as the name of the flag's value: "-enable-pprof /debug/pprof/" read as if
// the flag took a path.
func TestHelpBoolFlagsShowNoValue(t *testing.T) {
	fs := newConfig().flagSet(&bytes.Buffer{})
	fs.VisitAll(func(f *flag.Flag) {
		b, ok := f.Value.(interface{ IsBoolFlag() bool })
		if !ok || !b.IsBoolFlag() {
			return
		}
		if name, _ := flag.UnquoteUsage(f); name != "" {
			t.Errorf("--help shows -%s %s, as if the boolean flag took a value", f.Name, name)
		}
	})
}

func TestLeaderElectionLabels(t *testing.T) {
	// A repeated flag adds to the earlier labels, as csi-lib-utils' does.
	c, err := parseFlags([]string{"--leader-election-labels=a:b", "--leader-election-labels=c:d"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if len(c.LeaderElectionLabels) != 2 || c.LeaderElectionLabels["a"] != "b" || c.LeaderElectionLabels["c"] != "d" {
		t.Errorf("labels = %v", c.LeaderElectionLabels)
	}
}

// TestCapacityEnvironment checks that --enable-capacity validates with the
// environment the chart and the kustomize Deployment set, and that
// --capacity-ownerref-level=-1 needs no POD_NAME.
func TestCapacityEnvironment(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		wantErr bool
	}{
		{name: "namespace and pod", args: []string{"--enable-capacity"}, env: map[string]string{"NAMESPACE": "kube-system", "POD_NAME": "csi-0"}},
		{name: "no owner, no pod", args: []string{"--enable-capacity", "--capacity-ownerref-level=-1"}, env: map[string]string{"NAMESPACE": "kube-system", "POD_NAME": ""}},
		{name: "capacity off ignores the environment", env: map[string]string{"NAMESPACE": "", "POD_NAME": ""}},
		{name: "no namespace", args: []string{"--enable-capacity", "--capacity-ownerref-level=-1"}, env: map[string]string{"NAMESPACE": "", "POD_NAME": ""}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			c, err := parseFlags(tt.args, &bytes.Buffer{})
			if err != nil {
				t.Fatal(err)
			}
			if c.Namespace != tt.env["NAMESPACE"] || c.PodName != tt.env["POD_NAME"] {
				t.Errorf("Namespace, PodName = %q, %q, want the environment's", c.Namespace, c.PodName)
			}
			resetLoggingAtCleanup(t)
			if err := c.Validate(); (err != nil) != tt.wantErr {
				t.Errorf("Validate() = %v, want error %t", err, tt.wantErr)
			}
		})
	}
}

// TestNodeDeploymentBinder checks that --node-deployment turns the built-in
// binder off unless --enable-binder is given, and that the result
// validates with NODE_NAME set.
func TestNodeDeploymentBinder(t *testing.T) {
	t.Setenv("NODE_NAME", "worker-1")
	for _, tt := range []struct {
		args       []string
		wantBinder bool
	}{
		{args: nil, wantBinder: true},
		{args: []string{"--node-deployment"}, wantBinder: false},
		{args: []string{"--node-deployment", "--enable-binder=false"}, wantBinder: false},
	} {
		c, err := parseFlags(tt.args, &bytes.Buffer{})
		if err != nil {
			t.Fatal(err)
		}
		if c.EnableBinder != tt.wantBinder || c.NodeName != "worker-1" {
			t.Errorf("%v: EnableBinder %t, NodeName %q; want %t, worker-1", tt.args, c.EnableBinder, c.NodeName, tt.wantBinder)
		}
		err = c.Validate()
		if resetErr := logsapi.ResetForTest(nil); resetErr != nil {
			t.Errorf("reset logging: %v", resetErr)
		}
		if err != nil {
			t.Errorf("%v: Validate() = %v", tt.args, err)
		}
	}
}

// TestCSIAddressForms: every spelling of a unix socket that upstream
// (csi-lib-utils and gRPC) dials is accepted, unix:/path included.
func TestCSIAddressForms(t *testing.T) {
	for _, address := range []string{"/run/csi/socket", "unix:///run/csi/socket", "unix:/run/csi/socket"} {
		t.Run(address, func(t *testing.T) {
			c, err := parseFlags([]string{"--csi-address=" + address}, &bytes.Buffer{})
			if err != nil {
				t.Fatal(err)
			}
			resetLoggingAtCleanup(t)
			if err := c.Validate(); err != nil {
				t.Errorf("--csi-address=%s: %v", address, err)
			}
		})
	}
}

// TestVerbosityShorthand: upstream parses its flags with pflag, where -v is
// the shorthand of --v and takes its value attached (-v5) as well as after
// = or a space. The attached form is rewritten only where it is a flag, not
// the value of the flag before it.
func TestVerbosityShorthand(t *testing.T) {
	tests := []struct {
		args       []string
		wantV      string
		wantPrefix string
	}{
		{args: []string{"-v5"}, wantV: "5", wantPrefix: "pvc"},
		{args: []string{"-v=5"}, wantV: "5", wantPrefix: "pvc"},
		{args: []string{"-v", "5"}, wantV: "5", wantPrefix: "pvc"},
		{args: []string{"--v=3", "-v12"}, wantV: "12", wantPrefix: "pvc"},
		{args: []string{"--leader-election", "-v4"}, wantV: "4", wantPrefix: "pvc"},
		{args: []string{"--volume-name-prefix", "-v5"}, wantV: "0", wantPrefix: "-v5"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			c, err := parseFlags(tt.args, &bytes.Buffer{})
			if err != nil {
				t.Fatal(err)
			}
			if got := fmt.Sprint(c.Logging.Verbosity); got != tt.wantV {
				t.Errorf("verbosity = %s, want %s", got, tt.wantV)
			}
			if c.VolumeNamePrefix != tt.wantPrefix {
				t.Errorf("--volume-name-prefix = %q, want %q", c.VolumeNamePrefix, tt.wantPrefix)
			}
		})
	}
}

// TestNegativeQPSTurnsLimiterOff: as upstream, which hands the flags to
// client-go unchanged, a negative --kube-api-qps or --kube-api-capacity-qps
// means no client-side rate limit, whatever the burst.
func TestNegativeQPSTurnsLimiterOff(t *testing.T) {
	for _, args := range [][]string{
		{"--kube-api-qps=-1"},
		{"--kube-api-qps=-1", "--kube-api-burst=0"},
		{"--kube-api-capacity-qps=-1", "--kube-api-capacity-burst=0"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			c, err := parseFlags(append(args, "--master=https://127.0.0.1:6443"), &bytes.Buffer{})
			if err != nil {
				t.Fatal(err)
			}
			resetLoggingAtCleanup(t)
			if err := c.Validate(); err != nil {
				t.Fatalf("%v: %v", args, err)
			}
			restCfg, err := buildRESTConfig(c)
			if err != nil {
				t.Fatal(err)
			}
			if restCfg.QPS >= 0 && c.KubeAPIQPS < 0 {
				t.Errorf("client QPS = %v, want negative (no limiter)", restCfg.QPS)
			}
		})
	}
}

// resetLoggingAtCleanup undoes, when t ends, the logging configuration
// that Validate applies (a process may apply it only once), so that the
// next test, or the same one again (go test -count), can validate.
func resetLoggingAtCleanup(t *testing.T) {
	t.Helper()
	t.Cleanup(func() {
		if err := logsapi.ResetForTest(nil); err != nil {
			t.Errorf("reset logging: %v", err)
		}
	})
}

// TestKubeconfigFromEnvironment: as upstream, $KUBECONFIG wins over
// --kubeconfig, and an error names where the file it could not use came
// from.
func TestKubeconfigFromEnvironment(t *testing.T) {
	tests := []struct {
		name, env, flag, wantErr string
	}{
		{name: "flag only", flag: "/nonexistent/flag", wantErr: `(--kubeconfig "/nonexistent/flag", --master ""): stat /nonexistent/flag`},
		{name: "environment wins", env: "/nonexistent/env", flag: "/nonexistent/flag", wantErr: `($KUBECONFIG "/nonexistent/env", which wins over --kubeconfig "/nonexistent/flag", --master ""): stat /nonexistent/env`},
		{name: "environment only", env: "/nonexistent/env", wantErr: `($KUBECONFIG "/nonexistent/env", --master ""): stat /nonexistent/env`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("KUBECONFIG", tt.env)
			_, err := buildRESTConfig(&Config{Kubeconfig: tt.flag, KubeAPIQPS: 1, KubeAPIBurst: 1})
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("error = %v, want it to contain %q", err, tt.wantErr)
			}
		})
	}
}

// TestGivenFlags: the start-up log line lists the flags given, as
// --name=value by name, whatever their spelling, and nothing else.
func TestGivenFlags(t *testing.T) {
	tests := []struct {
		args []string
		want []string
	}{
		{args: nil, want: nil},
		{
			args: []string{"--worker-threads", "7", "-v4", "--timeout=30s", "--leader-election", "--feature-gates=Topology=false"},
			want: []string{"--feature-gates=Topology=false", "--leader-election=true", "--timeout=30s", "--v=4", "--worker-threads=7"},
		},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			c, err := parseFlags(tt.args, &bytes.Buffer{})
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(c.given, tt.want) {
				t.Errorf("given = %q, want %q", c.given, tt.want)
			}
		})
	}
}
