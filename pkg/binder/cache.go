package binder

import (
	"strconv"
	"sync"
)

// versioned is an API object pointer: a PersistentVolume or a claim.
type versioned interface {
	comparable
	GetResourceVersion() string
}

// writeCache holds the objects the binder itself has written, as the API
// server returned them, until the informer has caught up with them.
//
// One binding produces four writes whose watch events arrive later and in
// any order. Reading only from the informer, the next sync would act on a
// copy older than the binder's own last write: it would repeat work and run
// into conflicts. So every read goes through [writeCache.newest], which picks
// the copy with the higher resourceVersion and forgets the own copy as soon
// as the informer's is at least as new. Memory therefore holds only the
// writes of the last moments.
//
// Deletions are the informer's business: an object that the informer does
// not have is treated as absent, whatever this cache holds (the binder never
// creates objects, so the informer always saw an object before the binder
// wrote it), and the informer's delete handler drops the own copy.
type writeCache[T versioned] struct {
	mu   sync.Mutex
	objs map[string]T
}

func newWriteCache[T versioned]() *writeCache[T] {
	return &writeCache[T]{objs: make(map[string]T)}
}

// store remembers obj, the result of a write, unless a newer copy is known.
func (c *writeCache[T]) store(key string, obj T) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if old, ok := c.objs[key]; ok && newer(old.GetResourceVersion(), obj.GetResourceVersion()) {
		return
	}
	c.objs[key] = obj
}

// newest returns whichever of the informer's copy and the own copy is newer.
// A zero informer copy means the object does not exist: the result is zero
// and the own copy is dropped. The result is shared: never modify it.
func (c *writeCache[T]) newest(key string, informer T) T {
	var zero T
	c.mu.Lock()
	defer c.mu.Unlock()
	own, ok := c.objs[key]
	if informer == zero {
		if ok {
			delete(c.objs, key)
		}
		return zero
	}
	if !ok {
		return informer
	}
	if newer(own.GetResourceVersion(), informer.GetResourceVersion()) {
		return own
	}
	delete(c.objs, key)
	return informer
}

// observe is called with each object the informer delivers; it drops the own
// copy once the informer has caught up.
func (c *writeCache[T]) observe(key string, informer T) { c.newest(key, informer) }

// forget drops the own copy (the object was deleted).
func (c *writeCache[T]) forget(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.objs, key)
}

// snapshot returns the own copies (for the few lookups that cannot go by key).
func (c *writeCache[T]) snapshot() []T {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]T, 0, len(c.objs))
	for _, o := range c.objs {
		out = append(out, o)
	}
	return out
}

// len returns the number of own copies held.
func (c *writeCache[T]) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.objs)
}

// newer reports whether resourceVersion a is newer than b. Versions are
// compared as integers, as the in-tree controller does; if either does not
// parse, a is not newer, so the informer's copy wins and a stale decision
// costs at most a conflict on the next write.
func newer(a, b string) bool {
	av, err := strconv.ParseUint(a, 10, 64)
	if err != nil {
		return false
	}
	bv, err := strconv.ParseUint(b, 10, 64)
	if err != nil {
		return false
	}
	return av > bv
}
