package main

import (
	"context"
	"errors"
	"io"
	"net"
	"syscall"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	"k8s.io/klog/v2"
)

// startupBackoff paces the retries of one start-up read (discovery, access
// reviews, the owner of CSIStorageCapacity objects) that failed for a
// passing reason: 0.2 s doubling to 5 s, about two minutes in all. Without
// them one 503 from an API server under load stopped the sidecar at start
// (exit status 1), and its pod restarted.
var startupBackoff = wait.Backoff{Duration: 200 * time.Millisecond, Factor: 2, Cap: 5 * time.Second, Steps: 30}

// retryTransient calls call until it returns nil or an error that is not
// transient (see transient), backoff runs out or ctx ends; it returns the
// last error. Each transient failure is logged with what.
func retryTransient(ctx context.Context, backoff wait.Backoff, what string, call func(context.Context) error) error {
	var last error
	err := wait.ExponentialBackoffWithContext(ctx, backoff, func(ctx context.Context) (bool, error) {
		last = call(ctx)
		switch {
		case last == nil:
			return true, nil
		case !transient(last):
			return false, last
		}
		klog.FromContext(ctx).Info("Start-up read failed; trying again", "what", what, "err", last)
		return false, nil
	})
	if err != nil && last != nil {
		return last
	}
	return err
}

// transient reports whether err may go away by itself: the API server
// overloaded, restarting or unreachable for a moment. Refusals (not found,
// forbidden, invalid) are not.
func transient(err error) bool {
	switch {
	// Not IsUnexpectedServerError: client-go sets it on every answer
	// without a Status body, such as discovery's 404 for a group the API
	// server does not serve.
	case apierrors.IsServiceUnavailable(err), apierrors.IsInternalError(err), apierrors.IsTooManyRequests(err),
		apierrors.IsServerTimeout(err), apierrors.IsTimeout(err):
		return true
	case utilnet.IsConnectionRefused(err), utilnet.IsConnectionReset(err), utilnet.IsProbableEOF(err),
		utilnet.IsHTTP2ConnectionLost(err), errors.Is(err, syscall.EPIPE), errors.Is(err, io.ErrUnexpectedEOF):
		return true
	}
	var netErr net.Error
	return errors.As(err, &netErr) && netErr.Timeout()
}

// retryingDiscovery retries the group version reads of the discovery
// client it wraps, with startupBackoff.
type retryingDiscovery struct {
	discovery.ServerResourcesInterfaceWithContext
}

func (d retryingDiscovery) ServerResourcesForGroupVersionWithContext(ctx context.Context, groupVersion string) (*metav1.APIResourceList, error) {
	var list *metav1.APIResourceList
	err := retryTransient(ctx, startupBackoff, "discover "+groupVersion, func(ctx context.Context) error {
		var err error
		list, err = d.ServerResourcesInterfaceWithContext.ServerResourcesForGroupVersionWithContext(ctx, groupVersion)
		return err
	})
	return list, err
}
