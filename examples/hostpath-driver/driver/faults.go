package driver

import (
	"context"
	crand "crypto/rand"
	"encoding/binary"
	"math/rand/v2"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// operation names the calls that faults apply to.
type operation string

const (
	opCreate operation = "CreateVolume"
	opDelete operation = "DeleteVolume"
)

// injector draws the faults of each call from one seeded generator.
type injector struct {
	cfg Faults
	mu  sync.Mutex // guards rng
	rng *rand.Rand
}

// newInjector returns an injector for cfg and the seed it uses.
func newInjector(cfg Faults) (*injector, uint64) {
	seed := cfg.Seed
	if seed == 0 {
		var b [8]byte
		_, _ = crand.Read(b[:])
		// Never 0: a logged seed must reproduce the run, and 0 would
		// mean "pick one" again.
		seed = binary.LittleEndian.Uint64(b[:]) | 1
	}
	return &injector{cfg: cfg, rng: rand.New(rand.NewPCG(seed, seed))}, seed
}

// plan is what the injector decided for one call.
type plan struct {
	op      operation
	fail    bool
	code    codes.Code
	hang    bool
	latency time.Duration
}

// draw decides the faults of one call of op. It draws from the generator
// only for the faults that are configured, so enabling latency does not
// change which calls fail.
func (in *injector) draw(op operation) plan {
	p := plan{op: op, code: in.cfg.FailCode}
	failRate, hangRate := in.cfg.FailCreateRate, in.cfg.HangCreateRate
	p.latency = in.cfg.CreateLatency
	if op == opDelete {
		failRate, hangRate = in.cfg.FailDeleteRate, in.cfg.HangDeleteRate
		p.latency = in.cfg.DeleteLatency
	}
	if failRate == 0 && hangRate == 0 {
		return p
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	if failRate > 0 {
		p.fail = in.rng.Float64() < failRate
	}
	if hangRate > 0 && !p.fail {
		p.hang = in.rng.Float64() < hangRate
	}
	return p
}

// failure is the error of a call that the plan fails.
func (p plan) failure() error {
	return status.Errorf(p.code, "injected failure: %s failed on purpose (fault injection), nothing was changed", p.op)
}

// wait spends the plan's hang or latency after the call's work is done.
// It returns nil when the call may answer, or the error to answer
// instead: the caller's context error when the caller gave up (the work
// stays done), UNAVAILABLE when a hang ends because the driver stops.
// A latency cut short by the driver stopping answers normally.
func (p plan) wait(ctx context.Context, stop <-chan struct{}) error {
	switch {
	case p.hang:
		select {
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		case <-stop:
			return status.Errorf(codes.Unavailable, "%s: the driver is shutting down", p.op)
		}
	case p.latency > 0:
		timer := time.NewTimer(p.latency)
		defer timer.Stop()
		select {
		case <-timer.C:
		case <-stop:
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		}
	}
	return nil
}
