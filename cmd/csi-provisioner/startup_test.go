package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"syscall"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
)

// TestRetryTransient: a start-up read that fails for a passing reason is
// tried again until it succeeds or the backoff runs out; a refusal is not
// retried; the last error is returned.
func TestRetryTransient(t *testing.T) {
	gr := schema.GroupResource{Group: "snapshot.storage.k8s.io", Resource: "volumesnapshots"}
	unavailable := apierrors.NewServiceUnavailable("injected")
	discoveryNotFound := apierrors.NewGenericServerResponse(http.StatusNotFound, "get", gr, "", "404 page not found", 0, true)
	backoff := wait.Backoff{Duration: time.Millisecond, Factor: 1, Steps: 4}
	tests := []struct {
		name      string
		errs      []error // the answers of the calls in turn; past the end: nil
		wantCalls int
		wantErr   error
	}{
		{name: "answered at once", wantCalls: 1},
		{name: "503 twice, then answered", errs: []error{unavailable, unavailable}, wantCalls: 3},
		{name: "429, 500, a server timeout, then answered",
			errs:      []error{apierrors.NewTooManyRequests("slow down", 1), apierrors.NewInternalError(errors.New("boom")), apierrors.NewServerTimeout(gr, "get", 1)},
			wantCalls: 4},
		{name: "connection refused, wrapped, then answered",
			errs:      []error{fmt.Errorf("discover: %w", &net.OpError{Op: "dial", Err: syscall.ECONNREFUSED})},
			wantCalls: 2},
		// A connection the server or a proxy dropped under a POST (an
		// access review): client-go retries neither.
		{name: "HTTP/2 connection lost, broken pipe, then answered",
			errs:      []error{errors.New(`Post "https://k8s/apis": http2: client connection lost`), fmt.Errorf("post: %w", &net.OpError{Op: "write", Err: syscall.EPIPE})},
			wantCalls: 3},
		{name: "forbidden is not retried", errs: []error{apierrors.NewForbidden(gr, "", errors.New("no"))}, wantCalls: 1, wantErr: apierrors.NewForbidden(gr, "", errors.New("no"))},
		{name: "not found is not retried", errs: []error{apierrors.NewNotFound(gr, "")}, wantCalls: 1, wantErr: apierrors.NewNotFound(gr, "")},
		// What discovery returns for a group the API server does not serve:
		// a 404 without a Status body, marked as an unexpected answer.
		{name: "discovery's not found is not retried", errs: []error{discoveryNotFound}, wantCalls: 1, wantErr: discoveryNotFound},
		{name: "503 until the backoff runs out: the last error", errs: []error{unavailable, unavailable, unavailable, unavailable, unavailable}, wantCalls: 4, wantErr: unavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			calls := 0
			err := retryTransient(t.Context(), backoff, "test read", func(context.Context) error {
				calls++
				if calls <= len(tt.errs) {
					return tt.errs[calls-1]
				}
				return nil
			})
			if calls != tt.wantCalls {
				t.Errorf("calls = %d, want %d", calls, tt.wantCalls)
			}
			if (err == nil) != (tt.wantErr == nil) || (err != nil && err.Error() != tt.wantErr.Error()) {
				t.Errorf("err = %v, want %v", err, tt.wantErr)
			}
		})
	}
}

// flakyDiscovery answers 503 to the first failures lookups.
type flakyDiscovery struct {
	discovery.ServerResourcesInterfaceWithContext
	failures, calls int
}

func (d *flakyDiscovery) ServerResourcesForGroupVersionWithContext(_ context.Context, gv string) (*metav1.APIResourceList, error) {
	d.calls++
	if d.calls <= d.failures {
		return nil, apierrors.NewServiceUnavailable("injected")
	}
	return &metav1.APIResourceList{GroupVersion: gv, APIResources: []metav1.APIResource{{Name: "volumesnapshots"}}}, nil
}

// TestRetryingDiscovery: a resource lookup through the wrapper survives
// two 503 answers (before, the first one stopped the sidecar at start).
func TestRetryingDiscovery(t *testing.T) {
	d := &flakyDiscovery{failures: 2}
	served, err := resourceServed(t.Context(), retryingDiscovery{d}, "snapshot.storage.k8s.io/v1", "volumesnapshots")
	if err != nil || !served {
		t.Fatalf("resourceServed = %v, %v; want true, nil", served, err)
	}
	if d.calls != 3 {
		t.Errorf("lookups = %d, want 3", d.calls)
	}
}
