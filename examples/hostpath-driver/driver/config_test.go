package driver

import (
	"errors"
	"math"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
)

func TestParseEndpoint(t *testing.T) {
	tests := []struct {
		endpoint    string
		want        string
		wantErr     bool
		unsupported bool
	}{
		{endpoint: "unix:///tmp/csi.sock", want: "/tmp/csi.sock"},
		{endpoint: "/tmp/csi.sock", want: "/tmp/csi.sock"},
		{endpoint: "csi.sock", want: "csi.sock"},
		{endpoint: "unix://tmp/csi.sock", wantErr: true},
		{endpoint: "unix://", wantErr: true},
		{endpoint: "", wantErr: true},
		{endpoint: "tcp://127.0.0.1:10000", wantErr: true, unsupported: true},
		{endpoint: "dns:///localhost:10000", wantErr: true, unsupported: true},
	}
	for _, tt := range tests {
		t.Run(tt.endpoint, func(t *testing.T) {
			got, err := ParseEndpoint(tt.endpoint)
			if (err != nil) != tt.wantErr {
				t.Fatalf("ParseEndpoint(%q) = %q, %v; want error %t", tt.endpoint, got, err, tt.wantErr)
			}
			if errors.Is(err, ErrUnsupportedEndpoint) != tt.unsupported {
				t.Errorf("error %v: errors.Is(ErrUnsupportedEndpoint) = %t, want %t", err, !tt.unsupported, tt.unsupported)
			}
			if got != tt.want {
				t.Errorf("path %q, want %q", got, tt.want)
			}
		})
	}
}

func TestParseCode(t *testing.T) {
	tests := []struct {
		name    string
		want    codes.Code
		wantErr bool
	}{
		{name: "Unavailable", want: codes.Unavailable},
		{name: "UNAVAILABLE", want: codes.Unavailable},
		{name: "DeadlineExceeded", want: codes.DeadlineExceeded},
		{name: "DEADLINE_EXCEEDED", want: codes.DeadlineExceeded},
		{name: "resourceexhausted", want: codes.ResourceExhausted},
		{name: "Unauthenticated", want: codes.Unauthenticated},
		{name: "Bogus", wantErr: true},
		{name: "", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseCode(tt.name)
			if (err != nil) != tt.wantErr || (err == nil && got != tt.want) {
				t.Errorf("ParseCode(%q) = %s, %v; want %s, error %t", tt.name, got, err, tt.want, tt.wantErr)
			}
		})
	}
}

func TestConfigValidate(t *testing.T) {
	valid := func() Config {
		c := DefaultConfig()
		c.NodeID = "node-1"
		c.Root = "/var/lib/hostpath"
		return c
	}
	tests := []struct {
		name    string
		mutate  func(*Config)
		wantErr string // substring; "" means valid
		wantIs  error
	}{
		{name: "defaults with node and root"},
		{name: "memory", mutate: func(c *Config) { c.Backend, c.Root = BackendMemory, "" }},
		{name: "tcp endpoint", mutate: func(c *Config) { c.Endpoint = "tcp://0.0.0.0:9000" }, wantErr: "only unix socket", wantIs: ErrUnsupportedEndpoint},
		{name: "no node", mutate: func(c *Config) { c.NodeID = "" }, wantErr: "node ID is required"},
		{name: "long node with topology", mutate: func(c *Config) { c.NodeID = strings.Repeat("n", 64) }, wantErr: "63 characters"},
		{name: "long node without topology", mutate: func(c *Config) { c.NodeID, c.EnableTopology = strings.Repeat("n", 64), false }},
		{name: "dir without root", mutate: func(c *Config) { c.Root = "" }, wantErr: "--root"},
		{name: "memory with root", mutate: func(c *Config) { c.Backend = BackendMemory }, wantErr: "memory backend keeps nothing"},
		{name: "unknown backend", mutate: func(c *Config) { c.Backend = "lvm" }, wantErr: `backend "lvm"`},
		{name: "bad driver name", mutate: func(c *Config) { c.DriverName = "-bad-" }, wantErr: "driver name"},
		{name: "no version", mutate: func(c *Config) { c.VendorVersion = "" }, wantErr: "vendor version"},
		{name: "zero capacity", mutate: func(c *Config) { c.CapacityBytes = 0 }, wantErr: "capacity must be positive"},
		{name: "zero max size", mutate: func(c *Config) { c.MaxVolumeSize = 0 }, wantErr: "maximum volume size"},
		{name: "empty secret key", mutate: func(c *Config) { c.RequireCreateSecrets = map[string]string{"": "v"} }, wantErr: "create secret has an empty key"},
		{name: "rate above 1", mutate: func(c *Config) { c.Faults.FailCreateRate = 1.5 }, wantErr: "fail-create-rate"},
		{name: "negative rate", mutate: func(c *Config) { c.Faults.HangDeleteRate = -0.1 }, wantErr: "hang-delete-rate"},
		{name: "NaN rate", mutate: func(c *Config) { c.Faults.HangCreateRate = math.NaN() }, wantErr: "hang-create-rate"},
		{name: "negative latency", mutate: func(c *Config) { c.Faults.CreateLatency = -1 }, wantErr: "latencies"},
		{name: "two problems on one line", mutate: func(c *Config) { c.NodeID, c.CapacityBytes = "", -1 }, wantErr: "node ID is required (--node-id); capacity must be positive"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := valid()
			if tt.mutate != nil {
				tt.mutate(&c)
			}
			err := c.Validate()
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Validate: %v, want an error containing %q", err, tt.wantErr)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("error %q spans several lines", err)
			}
			var ce *ConfigError
			if !errors.As(err, &ce) {
				t.Errorf("error %T is not a *ConfigError", err)
			}
			if tt.wantIs != nil && !errors.Is(err, tt.wantIs) {
				t.Errorf("errors.Is(%v, %v) is false", err, tt.wantIs)
			}
		})
	}
}
