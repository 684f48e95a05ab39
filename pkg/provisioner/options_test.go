package provisioner

import (
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kube-storage/csi-provisioner/internal/testutil"
	"github.com/kube-storage/csi-provisioner/pkg/csiclient"
)

func TestNewValidation(t *testing.T) {
	tests := []struct {
		name    string
		caps    csiclient.Capabilities
		opts    []Option
		wantErr string // substring; "" for success
	}{
		{name: "defaults", caps: baseCaps()},
		{name: "uuid length 32", caps: baseCaps(), opts: []Option{WithVolumeNameUUIDLength(32)}},
		{name: "uuid length 1", caps: baseCaps(), opts: []Option{WithVolumeNameUUIDLength(1)}},
		{name: "empty prefix", caps: baseCaps(), opts: []Option{WithVolumeNamePrefix("")}, wantErr: "volume name prefix must not be empty"},
		{name: "prefix not a name", caps: baseCaps(), opts: []Option{WithVolumeNamePrefix("Bad_Prefix")}, wantErr: "does not start a valid PersistentVolume name"},
		// A PV name has at most 253 characters: the prefix, a dash and the
		// 36 characters of a UID, or the configured number of its digits.
		{name: "longest prefix for whole UIDs", caps: baseCaps(), opts: []Option{WithVolumeNamePrefix(strings.Repeat("p", 216))}},
		{
			name: "prefix too long for whole UIDs", caps: baseCaps(), opts: []Option{WithVolumeNamePrefix(strings.Repeat("p", 217))},
			wantErr: "does not start a valid PersistentVolume name (the prefix, a dash and 36 characters of the claim UID): must be no more than 253 characters",
		},
		{name: "longest prefix for 8 UID digits", caps: baseCaps(), opts: []Option{WithVolumeNamePrefix(strings.Repeat("p", 244)), WithVolumeNameUUIDLength(8)}},
		{
			name: "prefix too long for 8 UID digits", caps: baseCaps(), opts: []Option{WithVolumeNamePrefix(strings.Repeat("p", 245)), WithVolumeNameUUIDLength(8)},
			wantErr: "(the prefix, a dash and 8 characters of the claim UID): must be no more than 253 characters",
		},
		{name: "uuid length 33", caps: baseCaps(), opts: []Option{WithVolumeNameUUIDLength(33)}, wantErr: "between 1 and 32, got 33"},
		{name: "uuid length 0", caps: baseCaps(), opts: []Option{WithVolumeNameUUIDLength(0)}, wantErr: "got 0"},
		{name: "uuid length -2", caps: baseCaps(), opts: []Option{WithVolumeNameUUIDLength(-2)}, wantErr: "got -2"},
		{name: "empty identity", caps: baseCaps(), opts: []Option{WithIdentity("")}, wantErr: "identity must not be empty"},
		{name: "nil clock", caps: baseCaps(), opts: []Option{WithClock(nil)}, wantErr: "clock must not be nil"},
		{name: "driver without name", caps: csiclient.Capabilities{}, wantErr: "reports no name"},
		{name: "driver name with capitals", caps: csiclient.Capabilities{DriverName: "Test.CSI.example.com"}},
		{
			name: "driver name with an underscore", caps: csiclient.Capabilities{DriverName: "my_driver.example.com"},
			wantErr: `the CSI driver reports the name "my_driver.example.com", which no PersistentVolume can name (spec.csi.driver: a lowercase RFC 1123 subdomain must consist of`,
		},
		{
			name: "driver name of 64 characters", caps: csiclient.Capabilities{DriverName: strings.Repeat("a", 52) + ".example.com"},
			wantErr: "must be no more than 63 characters",
		},
		{name: "retry start above max", caps: baseCaps(), opts: []Option{WithRetryIntervals(time.Minute, time.Second)}, wantErr: "retry intervals: start 1m0s must not be negative nor above max 1s"},
		{
			name: "all errors joined", caps: baseCaps(),
			opts:    []Option{WithVolumeNamePrefix(""), WithVolumeNameUUIDLength(40)},
			wantErr: "volume name prefix must not be empty\nvolume name UUID length",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			client := fake.NewClientset()
			_, err := New(client, &fakeDriver{caps: tt.caps}, informers.NewSharedInformerFactory(client, 0), tt.opts...)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("New: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("New error = %v, want it to contain %q", err, tt.wantErr)
			}
		})
	}
}

func TestNewNilArguments(t *testing.T) {
	client := fake.NewClientset()
	factory := informers.NewSharedInformerFactory(client, 0)
	driver := &fakeDriver{caps: baseCaps()}
	if _, err := New(nil, driver, factory); err == nil {
		t.Error("New with nil client succeeded")
	}
	if _, err := New(client, nil, factory); err == nil {
		t.Error("New with nil driver succeeded")
	}
	if _, err := New(client, driver, nil); err == nil {
		t.Error("New with nil factory succeeded")
	}
}

// TestNewInformers checks which informers New registers on the factory.
func TestNewInformers(t *testing.T) {
	tests := []struct {
		name string
		caps func(*csiclient.Capabilities)
		want []string
	}{
		{name: "no topology, no attach", caps: func(*csiclient.Capabilities) {}, want: []string{"*v1.PersistentVolume", "*v1.PersistentVolumeClaim", "*v1.StorageClass"}},
		{
			name: "topology", caps: func(c *csiclient.Capabilities) { c.VolumeAccessibility = true },
			want: []string{"*v1.CSINode", "*v1.Node", "*v1.PersistentVolume", "*v1.PersistentVolumeClaim", "*v1.StorageClass"},
		},
		{
			name: "publish", caps: func(c *csiclient.Capabilities) { c.PublishUnpublish = true },
			want: []string{"*v1.PersistentVolume", "*v1.PersistentVolumeClaim", "*v1.StorageClass", "*v1.VolumeAttachment"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			caps := baseCaps()
			tt.caps(&caps)
			client := fake.NewClientset()
			factory := informers.NewSharedInformerFactory(client, 0)
			if _, err := New(client, &fakeDriver{caps: caps}, factory); err != nil {
				t.Fatal(err)
			}
			factory.Start(t.Context().Done())
			t.Cleanup(factory.Shutdown)
			var got []string
			for typ, ok := range factory.WaitForCacheSync(t.Context().Done()) {
				if !ok {
					t.Fatalf("%v did not sync", typ)
				}
				got = append(got, typ.String())
			}
			slices.Sort(got)
			if !slices.Equal(got, tt.want) {
				t.Errorf("informers = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestDefaultIdentity: upstream's form, <unix ms>-<random 0..9999>-<driver>,
// and in node deployment -<node> after it, as upstream.
func TestDefaultIdentity(t *testing.T) {
	for _, tt := range []struct {
		name string
		opts []Option
		want string
	}{
		{name: "central", want: `^1700000000123-\d{1,4}-` + regexp.QuoteMeta(testDriver) + `$`},
		{name: "node deployment", opts: []Option{withNode()}, want: `^1700000000123-\d{1,4}-` + regexp.QuoteMeta(testDriver) + `-` + thisNode + `$`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			clk := clocktesting.NewFakeClock(time.UnixMilli(1700000000123))
			client := fake.NewClientset()
			caps := baseCaps()
			caps.VolumeAccessibility = true
			p, err := New(client, &fakeDriver{caps: caps}, informers.NewSharedInformerFactory(client, 0), append(tt.opts, WithClock(clk))...)
			if err != nil {
				t.Fatal(err)
			}
			if !regexp.MustCompile(tt.want).MatchString(p.Identity()) {
				t.Errorf("identity = %q, want %s", p.Identity(), tt.want)
			}
		})
	}
}

func TestVolumeName(t *testing.T) {
	const uid = "3a6f1c1e-5b8d-4f4e-9c2b-0d8e7f6a5b4c"
	tests := []struct {
		name   string
		prefix string
		length int
		want   string
		// wantUIDPrefix: the name is the prefix, a dash and the whole UID.
		wantUIDPrefix string
	}{
		{name: "defaults", prefix: "pvc", length: -1, want: "pvc-" + uid, wantUIDPrefix: "pvc"},
		{name: "prefix", prefix: "test", length: -1, want: "test-" + uid, wantUIDPrefix: "test"},
		{name: "truncated without dashes", prefix: "pvc", length: 5, want: "pvc-3a6f1"},
		{name: "whole without dashes", prefix: "pvc", length: 32, want: "pvc-3a6f1c1e5b8d4f4e9c2b0d8e7f6a5b4c"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			client := fake.NewClientset()
			p, err := New(client, &fakeDriver{caps: baseCaps()}, informers.NewSharedInformerFactory(client, 0),
				WithVolumeNamePrefix(tt.prefix), WithVolumeNameUUIDLength(tt.length))
			if err != nil {
				t.Fatal(err)
			}
			claim := testutil.NewPVC(testNS, "c").UID(uid).Obj()
			if got := p.VolumeName(claim); got != tt.want {
				t.Errorf("VolumeName = %q, want %q", got, tt.want)
			}
			if got := p.UIDNamePrefix(); got != tt.wantUIDPrefix {
				t.Errorf("UIDNamePrefix = %q, want %q", got, tt.wantUIDPrefix)
			}
			if tt.wantUIDPrefix != "" && tt.want != tt.wantUIDPrefix+"-"+uid {
				t.Errorf("UIDNamePrefix %q does not name the volume", tt.wantUIDPrefix)
			}
		})
	}
	t.Run("short uid", func(t *testing.T) {
		client := fake.NewClientset()
		p, err := New(client, &fakeDriver{caps: baseCaps()}, informers.NewSharedInformerFactory(client, 0), WithVolumeNameUUIDLength(10))
		if err != nil {
			t.Fatal(err)
		}
		claim := &corev1.PersistentVolumeClaim{}
		claim.UID = types.UID("a-b")
		if got := p.VolumeName(claim); got != "pvc-ab" {
			t.Errorf("VolumeName = %q, want pvc-ab", got)
		}
	})
}

func TestSupportsBlock(t *testing.T) {
	h := newHarness(t, baseCaps(), nil)
	if !h.p.SupportsBlock(t.Context()) {
		t.Error("SupportsBlock = false")
	}
}

// objs is a shorthand for the objects of a harness.
func objs(o ...runtime.Object) []runtime.Object { return o }

// volumeAttributesClass is a VAC of driver.
func volumeAttributesClass(name, driver string, params map[string]string) *storagev1.VolumeAttributesClass {
	v := &storagev1.VolumeAttributesClass{DriverName: driver, Parameters: params}
	v.Name = name
	return v
}

// TestRetryIntervals: the provisioner's own queues (cloning protection,
// in-flight guard) back off as --retry-interval-start/-max say, as
// upstream's claim queue does, and with client-go's default without them.
func TestRetryIntervals(t *testing.T) {
	tests := []struct {
		name string
		opts []Option
		want []time.Duration // the backoff after the 1st, 2nd, ... failure
	}{
		{name: "default", want: []time.Duration{5 * time.Millisecond, 10 * time.Millisecond, 20 * time.Millisecond}},
		{name: "upstream's defaults", opts: []Option{WithRetryIntervals(time.Second, 5*time.Minute)},
			want: []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 32 * time.Second, 64 * time.Second, 128 * time.Second, 256 * time.Second, 5 * time.Minute, 5 * time.Minute}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, baseCaps(), nil, tt.opts...)
			limiter := h.p.retryLimiter()
			for i, want := range tt.want {
				if got := limiter.When("ns/a"); got != want {
					t.Errorf("backoff after failure %d = %s, want %s", i+1, got, want)
				}
			}
		})
	}
}
