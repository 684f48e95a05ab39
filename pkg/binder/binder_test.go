package binder

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/component-base/metrics"

	"github.com/kube-storage/csi-provisioner/internal/events"
)

func TestNew(t *testing.T) {
	client := fake.NewClientset()
	tests := []struct {
		name    string
		driver  string
		opts    []Option
		wantErr string
	}{
		{name: "defaults", driver: driver},
		{name: "no driver", wantErr: "driver name is required"},
		{name: "zero workers", driver: driver, opts: []Option{WithWorkers(0)}, wantErr: "workers must be at least 1"},
		{name: "zero resync", driver: driver, opts: []Option{WithResyncPeriod(0)}, wantErr: "resync period must be positive"},
		{name: "negative grace", driver: driver, opts: []Option{WithProvisioningGrace(-time.Second)}, wantErr: "grace must not be negative"},
		{name: "nil clock", driver: driver, opts: []Option{WithClock(nil)}, wantErr: "clock must not be nil"},
		{name: "metrics", driver: driver, opts: []Option{WithMetricsRegistry(metrics.NewKubeRegistry())}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(client, tt.driver, informers.NewSharedInformerFactory(client, 0), tt.opts...)
			if tt.wantErr == "" && err != nil {
				t.Fatalf("New: %v", err)
			}
			if tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Fatalf("New: error %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestNewDefaults(t *testing.T) {
	client := fake.NewClientset()
	b, err := New(client, driver, informers.NewSharedInformerFactory(client, 0), WithResyncPeriod(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if b.cfg.workers != DefaultWorkers || b.cfg.grace != 20*time.Second {
		t.Errorf("workers %d, grace %v; want %d and twice the resync period", b.cfg.workers, b.cfg.grace, DefaultWorkers)
	}
	if b.broadcaster == nil {
		t.Error("no event broadcaster without WithEventRecorder")
	}
	// A Deduplicator given as recorder is used as it is, so the provisioner
	// and the binder can share it.
	shared := events.NewDeduplicator(&eventLog{}, 0)
	b, err = New(client, driver, informers.NewSharedInformerFactory(client, 0), WithEventRecorder(shared))
	if err != nil {
		t.Fatal(err)
	}
	if b.recorder != shared || b.broadcaster != nil {
		t.Error("a Deduplicator given as recorder is not used as it is")
	}
}

// TestHandleResult checks the one place that maps sync results to queue
// operations.
func TestHandleResult(t *testing.T) {
	conflict := apierrors.NewConflict(schema.GroupResource{Resource: "persistentvolumes"}, "pv1", errors.New("modified"))
	tests := []struct {
		name         string
		res          result
		err          error
		wantRequeues int           // rate-limited retries counted for the key
		wantAfter    time.Duration // the key comes back after this long; 0: it does not
	}{
		{name: "success forgets the key", wantRequeues: 0},
		{name: "error: rate-limited retry", err: errors.New("boom"), wantRequeues: 1, wantAfter: retryBaseDelay},
		{name: "conflict: rate-limited retry", err: conflict, wantRequeues: 1, wantAfter: retryBaseDelay},
		{name: "lost reservation race: rate-limited retry", err: fmt.Errorf("x: %w", errVolumeTaken), wantRequeues: 1, wantAfter: retryBaseDelay},
		{name: "requeue after: delayed add, backoff forgotten", res: result{requeueAfter: time.Minute}, wantAfter: time.Minute},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, nil)
			q := f.binder.claimQueue
			f.binder.handleResult(f.ctx, q, "ns/c1", tt.res, tt.err)
			if got := q.NumRequeues("ns/c1"); got != tt.wantRequeues {
				t.Errorf("requeues = %d, want %d", got, tt.wantRequeues)
			}
			if q.Len() != 0 {
				t.Fatalf("the key is queued at once")
			}
			if tt.wantAfter == 0 {
				return
			}
			// The queue's timer goroutine registers the key asynchronously:
			// move the fake clock on until it has fired.
			err := wait.PollUntilContextTimeout(f.ctx, time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
				f.clock.Step(tt.wantAfter)
				return q.Len() == 1, nil
			})
			if err != nil {
				t.Fatalf("the key did not come back after %v", tt.wantAfter)
			}
			if k, _ := q.Get(); k != "ns/c1" {
				t.Errorf("got key %q", k)
			}
		})
	}
}
