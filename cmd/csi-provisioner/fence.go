package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
)

// errFenced refuses a write of a process that does not hold the Lease, or
// whose hold may have ended.
var errFenced = errors.New("not the leader: this process does not hold the leader election Lease (or its hold may have ended), so it writes nothing")

// fence keeps a replica that does not hold the Lease from writing to the
// API server. client-go's elector only gives up leadership when a renewal
// has failed for --leader-election-renew-deadline: a leader that was paused
// (SIGSTOP, a frozen VM or container) past its Lease resumes believing it
// leads, and for up to that deadline runs its controllers next to the new
// leader, on a cache that is seconds old. The fence watches the election's
// own Lease reads and writes (see electionClient) and refuses every write
// (see wrap) unless this process's last renewal started less than the
// Lease duration ago: no other replica can have taken the Lease since. It
// calls lost, once, when a hold ends without a release: the Lease expired
// by the local clock, a write was refused for that reason, or the Lease
// read names another holder. Safe for concurrent use.
type fence struct {
	leaseDuration time.Duration
	now           func() time.Time
	lost          func(reason string)

	mu       sync.Mutex
	identity string    // the holder this process writes; "" before it first led
	leading  bool      // its last Lease write made it the holder
	renewed  time.Time // when that write started
	timer    *time.Timer
	ended    bool // lost was called
}

// newFence returns a fence for Leases of leaseDuration; lost is called,
// once, from the goroutine that noticed the loss. The Lease records its
// duration in whole seconds (client-go truncates), and the other replicas
// go by that record: so does the fence.
func newFence(leaseDuration time.Duration, lost func(reason string)) *fence {
	return &fence{leaseDuration: leaseDuration.Truncate(time.Second), now: time.Now, lost: lost}
}

// allow returns nil while this process holds the Lease by the local clock,
// errFenced otherwise (and then, if it held it, the hold is lost).
func (f *fence) allow() error {
	f.mu.Lock()
	if !f.leading || f.ended {
		f.mu.Unlock()
		return errFenced
	}
	if age := f.now().Sub(f.renewed); age >= f.leaseDuration {
		f.mu.Unlock()
		f.lose(fmt.Sprintf("the Lease was last renewed %s ago, longer than its duration %s (the process was paused or the API server unreachable): another replica may lead", age.Round(time.Millisecond), f.leaseDuration))
		return errFenced
	}
	f.mu.Unlock()
	return nil
}

// wrote records the result of this process's Lease write that started at
// start: the holder it wrote is this process's identity; "" is a release.
func (f *fence) wrote(start time.Time, lease *coordinationv1.Lease) {
	holder := holderOf(lease)
	f.mu.Lock()
	defer f.mu.Unlock()
	if holder == "" {
		f.leading = false
		if f.timer != nil {
			f.timer.Stop()
		}
		return
	}
	f.identity, f.leading, f.renewed = holder, true, start
	wait := f.leaseDuration - f.now().Sub(start)
	if f.timer == nil {
		f.timer = time.AfterFunc(wait, f.expire)
	} else {
		f.timer.Reset(wait)
	}
}

// read records a Lease this process read: while it leads, another holder
// means the hold has ended (the Lease was deleted and taken, or its
// expiry was missed).
func (f *fence) read(lease *coordinationv1.Lease) {
	holder := holderOf(lease)
	f.mu.Lock()
	taken := f.leading && holder != "" && holder != f.identity
	f.mu.Unlock()
	if taken {
		f.lose(fmt.Sprintf("the Lease is held by %s", holder))
	}
}

// expire is the timer of the last renewal: unless renewed since, the hold
// has ended.
func (f *fence) expire() { _ = f.allow() }

func (f *fence) lose(reason string) {
	f.mu.Lock()
	if f.ended {
		f.mu.Unlock()
		return
	}
	f.ended, f.leading = true, false
	if f.timer != nil {
		f.timer.Stop()
	}
	f.mu.Unlock()
	f.lost(reason)
}

func holderOf(lease *coordinationv1.Lease) string {
	if lease == nil || lease.Spec.HolderIdentity == nil {
		return ""
	}
	return *lease.Spec.HolderIdentity
}

// wrap is a rest.Config transport wrapper that sends a request that may
// change something only while f allows it. Reads (watches included) and
// access reviews, which change nothing, always go.
func (f *fence) wrap(rt http.RoundTripper) http.RoundTripper {
	return fencedTransport{next: rt, fence: f}
}

type fencedTransport struct {
	next  http.RoundTripper
	fence *fence
}

func (t fencedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	switch req.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
	default:
		// Contains, not HasPrefix: a kubeconfig server URL may carry a
		// path (a proxy such as Rancher's, kubectl proxy --api-prefix).
		if !strings.Contains(req.URL.Path, "/apis/authorization.k8s.io/") {
			if err := t.fence.allow(); err != nil {
				return nil, fmt.Errorf("%s %s: %w", req.Method, req.URL.Path, err)
			}
		}
	}
	return t.next.RoundTrip(req)
}

// electionClient is the leader election's client: its Lease reads and
// writes go to the fence too.
type electionClient struct {
	kubernetes.Interface
	fence *fence
}

func (c electionClient) CoordinationV1() coordinationv1client.CoordinationV1Interface {
	return electionCoordination{CoordinationV1Interface: c.Interface.CoordinationV1(), fence: c.fence}
}

type electionCoordination struct {
	coordinationv1client.CoordinationV1Interface
	fence *fence
}

func (c electionCoordination) Leases(namespace string) coordinationv1client.LeaseInterface {
	return electionLeases{LeaseInterface: c.CoordinationV1Interface.Leases(namespace), fence: c.fence}
}

type electionLeases struct {
	coordinationv1client.LeaseInterface
	fence *fence
}

func (l electionLeases) Get(ctx context.Context, name string, opts metav1.GetOptions) (*coordinationv1.Lease, error) {
	lease, err := l.LeaseInterface.Get(ctx, name, opts)
	if err == nil {
		l.fence.read(lease)
	}
	return lease, err
}

func (l electionLeases) Create(ctx context.Context, lease *coordinationv1.Lease, opts metav1.CreateOptions) (*coordinationv1.Lease, error) {
	start := l.fence.now()
	created, err := l.LeaseInterface.Create(ctx, lease, opts)
	if err == nil {
		l.fence.wrote(start, created)
	}
	return created, err
}

func (l electionLeases) Update(ctx context.Context, lease *coordinationv1.Lease, opts metav1.UpdateOptions) (*coordinationv1.Lease, error) {
	start := l.fence.now()
	updated, err := l.LeaseInterface.Update(ctx, lease, opts)
	if err == nil {
		l.fence.wrote(start, updated)
	}
	return updated, err
}
