package driver

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestFaultLatency(t *testing.T) {
	const latency = 300 * time.Millisecond
	create := func(ctx context.Context, d *Driver, _ string) error {
		_, err := d.CreateVolume(ctx, createReq("new", gi))
		return err
	}
	deleteVolume := func(ctx context.Context, d *Driver, id string) error {
		_, err := d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id})
		return err
	}
	tests := []struct {
		name    string
		faults  Faults
		call    func(ctx context.Context, d *Driver, existingID string) error
		timeout time.Duration // 0: no caller timeout
		// wantCode and wantVolumes describe the answer and the volumes
		// left: the existing one, plus "new" after a create.
		wantCode    codes.Code
		wantVolumes int
	}{
		{name: "create answers after the latency", faults: Faults{CreateLatency: latency}, call: create, wantVolumes: 2},
		{name: "delete answers after the latency", faults: Faults{DeleteLatency: latency}, call: deleteVolume, wantVolumes: 0},
		{
			name: "create keeps the volume when the caller gives up", faults: Faults{CreateLatency: time.Hour}, call: create,
			timeout: 100 * time.Millisecond, wantCode: codes.DeadlineExceeded, wantVolumes: 2,
		},
		{
			name: "delete keeps the deletion when the caller gives up", faults: Faults{DeleteLatency: time.Hour}, call: deleteVolume,
			timeout: 100 * time.Millisecond, wantCode: codes.DeadlineExceeded, wantVolumes: 0,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := newTestDriver(t, nil)
			existing := mustCreate(t, d, createReq("existing", gi)).GetVolumeId()
			d.faults, _ = newInjector(tt.faults)
			ctx := t.Context()
			if tt.timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tt.timeout)
				defer cancel()
			}
			start := time.Now()
			err := tt.call(ctx, d, existing)
			elapsed := time.Since(start)
			wantCode(t, err, tt.wantCode)
			if err == nil && elapsed < latency {
				t.Errorf("answered after %v, before the latency of %v", elapsed, latency)
			}
			if n := len(volumeIDs(t, d)); n != tt.wantVolumes {
				t.Errorf("%d volumes, want %d: the work is done before the wait", n, tt.wantVolumes)
			}
		})
	}
}

func TestFaultFailRate(t *testing.T) {
	tests := []struct {
		name     string
		rate     float64
		code     codes.Code
		calls    int
		minFails int
		maxFails int
	}{
		{name: "never", rate: 0, code: codes.Unavailable, calls: 50, minFails: 0, maxFails: 0},
		{name: "always, resource exhausted", rate: 1, code: codes.ResourceExhausted, calls: 50, minFails: 50, maxFails: 50},
		{name: "always, default code", rate: 1, calls: 10, minFails: 10, maxFails: 10},
		// With seed 42 the outcome is fixed; the bounds only say it is
		// about half, so a change of generator does not break the test.
		{name: "half", rate: 0.5, code: codes.Aborted, calls: 400, minFails: 150, maxFails: 250},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := newTestDriver(t, func(c *Config) {
				c.Faults.FailCreateRate, c.Faults.FailDeleteRate, c.Faults.FailCode, c.Faults.Seed = tt.rate, tt.rate, tt.code, 42
			})
			wantFailCode := tt.code
			if wantFailCode == codes.OK {
				wantFailCode = codes.Unavailable
			}
			createFails, deleteFails := 0, 0
			for i := range tt.calls {
				resp, err := d.CreateVolume(t.Context(), createReq(fmt.Sprintf("pvc-%d", i), gi))
				switch code := status.Code(err); code {
				case codes.OK:
					if _, err := d.DeleteVolume(t.Context(), &csi.DeleteVolumeRequest{VolumeId: resp.GetVolume().GetVolumeId()}); err != nil {
						wantCode(t, err, wantFailCode)
						deleteFails++
					}
				case wantFailCode:
					createFails++
				default:
					t.Fatalf("CreateVolume failed with %s, want OK or %s: %v", code, wantFailCode, err)
				}
			}
			if createFails < tt.minFails || createFails > tt.maxFails {
				t.Errorf("%d of %d CreateVolume calls failed, want %d..%d", createFails, tt.calls, tt.minFails, tt.maxFails)
			}
			// A failed CreateVolume changes nothing; a failed DeleteVolume
			// leaves its volume.
			if n := len(volumeIDs(t, d)); n != deleteFails {
				t.Errorf("%d volumes left, want %d (one per failed delete)", n, deleteFails)
			}
		})
	}
}

func TestFaultSeedIsDeterministic(t *testing.T) {
	outcomes := func(seed uint64) string {
		d := newTestDriver(t, func(c *Config) { c.Faults.FailCreateRate, c.Faults.Seed = 0.5, seed })
		var out strings.Builder
		for i := range 64 {
			if _, err := d.CreateVolume(t.Context(), createReq(fmt.Sprintf("pvc-%d", i), 1)); err != nil {
				out.WriteByte('x')
			} else {
				out.WriteByte('.')
			}
		}
		return out.String()
	}
	a, b, c := outcomes(7), outcomes(7), outcomes(8)
	if a != b {
		t.Errorf("seed 7 gave %s, then %s", a, b)
	}
	if a == c {
		t.Errorf("seeds 7 and 8 gave the same faults %s", a)
	}
}

func TestFaultHang(t *testing.T) {
	t.Run("create hangs after creating", func(t *testing.T) {
		d := newTestDriver(t, func(c *Config) { c.Faults.HangCreateRate = 1 })
		ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
		defer cancel()
		_, err := d.CreateVolume(ctx, createReq("pvc-1", gi))
		wantCode(t, err, codes.DeadlineExceeded)
		if n := len(volumeIDs(t, d)); n != 1 {
			t.Fatalf("%d volumes after a hung CreateVolume, want 1", n)
		}
	})
	t.Run("delete hangs after deleting", func(t *testing.T) {
		d := newTestDriver(t, func(c *Config) { c.Faults.HangDeleteRate = 1 })
		id := mustCreate(t, d, createReq("pvc-1", gi)).GetVolumeId()
		ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
		defer cancel()
		_, err := d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id})
		wantCode(t, err, codes.DeadlineExceeded)
		if n := len(volumeIDs(t, d)); n != 0 {
			t.Fatalf("%d volumes after a hung DeleteVolume, want 0", n)
		}
	})
	t.Run("a hang ends when the driver closes", func(t *testing.T) {
		d := newTestDriver(t, func(c *Config) { c.Faults.HangCreateRate = 1 })
		errs := make(chan error, 1)
		go func() {
			_, err := d.CreateVolume(t.Context(), createReq("pvc-1", gi))
			errs <- err
		}()
		_ = d.Close()
		select {
		case err := <-errs:
			wantCode(t, err, codes.Unavailable)
		case <-time.After(30 * time.Second):
			t.Fatal("CreateVolume still hangs 30s after Close")
		}
	})
	t.Run("other calls proceed during a hang", func(t *testing.T) {
		d := newTestDriver(t, func(c *Config) { c.Faults.HangCreateRate = 1 })
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		errs := make(chan error, 1)
		go func() {
			_, err := d.CreateVolume(ctx, createReq("pvc-1", gi))
			errs <- err
		}()
		// The volume shows up while CreateVolume hangs: the hang does not
		// hold the driver's mutex.
		waitFor(t, func() bool { return len(volumeIDs(t, d)) == 1 })
		select {
		case err := <-errs:
			t.Fatalf("CreateVolume answered %v instead of hanging", err)
		default:
		}
		cancel()
		wantCode(t, <-errs, codes.Canceled)
	})
}

// TestIgnoreContentSource: with the fault, a clone is created empty and
// answered without content_source, and a retry of the same request is
// still compatible (idempotent by name).
func TestIgnoreContentSource(t *testing.T) {
	d := newTestDriver(t, func(c *Config) { c.Faults.IgnoreContentSource = true })
	src := mustCreate(t, d, createReq("source", gi))
	req := createReq("clone", gi)
	req.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{
		Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: src.GetVolumeId()},
	}}
	for i := range 2 {
		v := mustCreate(t, d, req)
		if v.GetContentSource() != nil {
			t.Errorf("call %d answered content_source %v, want none", i, v.GetContentSource())
		}
	}
	if got := len(volumeIDs(t, d)); got != 2 {
		t.Errorf("%d volumes, want the source and one clone", got)
	}
}
