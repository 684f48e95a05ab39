package provisioner

import (
	"context"
	"sync"
)

// background runs the provisioner's goroutines that outlive the library
// sync that starts them: in node deployment, the wait for another node to
// take a declined claim and the retries of its untaken-claim event. RunGuard
// ties them to the sidecar's lifetime (start) and, when the sidecar stops,
// ends them and waits for them (stop); from then on none starts. Before
// start they end only by themselves (unit tests that drive the provisioner
// without RunGuard). The zero value is ready to use.
type background struct {
	mu      sync.Mutex
	life    context.Context // nil until start
	end     context.CancelFunc
	stopped bool
	wg      sync.WaitGroup
}

// start ties the goroutines started from now on to ctx.
func (b *background) start(ctx context.Context) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.life, b.end = context.WithCancel(ctx)
}

// stop ends the running goroutines' contexts, refuses new ones and waits
// until every one has returned.
func (b *background) stop() {
	b.mu.Lock()
	b.stopped = true
	if b.end != nil {
		b.end()
	}
	b.mu.Unlock()
	b.wg.Wait()
}

// run runs f in a goroutine with a context that keeps ctx's values (its
// logger) but not its end, which comes with the sidecar's (see start).
// After stop it runs nothing and returns false.
func (b *background) run(ctx context.Context, f func(context.Context)) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.stopped {
		return false
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	detach := func() bool { return false }
	if b.life != nil {
		detach = context.AfterFunc(b.life, cancel)
	}
	b.wg.Go(func() {
		defer cancel()
		defer detach()
		f(ctx)
	})
	return true
}
