package provisioner

import (
	"context"
	"sync"

	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
)

// newQueue returns a queue named name (in the workqueue metrics) whose
// failed keys are retried with the backoff of WithRetryIntervals.
func (p *Provisioner) newQueue(name string) workqueue.TypedRateLimitingInterface[string] {
	return workqueue.NewTypedRateLimitingQueueWithConfig(p.retryLimiter(),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: name})
}

// retryLimiter returns the backoff of a failed key (WithRetryIntervals).
func (p *Provisioner) retryLimiter() workqueue.TypedRateLimiter[string] {
	if p.cfg.retryMax == 0 {
		return workqueue.DefaultTypedControllerRateLimiter[string]()
	}
	return workqueue.NewTypedItemExponentialFailureRateLimiter[string](p.cfg.retryStart, p.cfg.retryMax)
}

// runQueue runs workers (at least one) that hand each key of queue to syncKey
// until ctx is done, then shuts the queue down and returns once they have
// stopped. It is the one place that turns a sync's result into queue
// operations: an error requeues the key with backoff (logged with what the
// queue does), success forgets its backoff.
func runQueue(ctx context.Context, queue workqueue.TypedRateLimitingInterface[string], workers int, what string, syncKey func(context.Context, string) error) {
	var wg sync.WaitGroup
	for range max(workers, 1) {
		wg.Go(func() {
			for processNext(ctx, queue, what, syncKey) {
			}
		})
	}
	<-ctx.Done()
	queue.ShutDown()
	wg.Wait()
}

// processNext syncs one key; it returns false when the queue shut down.
func processNext(ctx context.Context, queue workqueue.TypedRateLimitingInterface[string], what string, syncKey func(context.Context, string) error) bool {
	key, quit := queue.Get()
	if quit {
		return false
	}
	defer queue.Done(key)
	if err := syncKey(ctx, key); err != nil {
		klog.FromContext(ctx).Error(err, what+" sync failed; retrying", "pvc", key)
		queue.AddRateLimited(key)
		return true
	}
	queue.Forget(key)
	return true
}
