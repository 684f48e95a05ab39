// Package expiring holds a set whose members expire: the sidecar's short
// records of what it did or saw (a claim gone, a volume deleted, a deletion
// finished) that only have to outlast the watch events and retries that
// follow, and must not grow with every object ever seen.
package expiring

import (
	"time"

	utilcache "k8s.io/apimachinery/pkg/util/cache"
	"k8s.io/utils/clock"
)

// Set is a set of keys, each a member for ttl after it was last added.
// It is safe for concurrent use; apimachinery's expiring cache keeps the
// keys and drops expired ones as new ones come, so memory follows the
// keys added in the last ttl.
type Set[K comparable] struct {
	keys *utilcache.Expiring
	ttl  time.Duration
}

// NewSet returns an empty set whose members expire ttl after they were
// added, as clk tells time.
func NewSet[K comparable](clk clock.Clock, ttl time.Duration) *Set[K] {
	return &Set[K]{keys: utilcache.NewExpiringWithClock(clk), ttl: ttl}
}

// Add makes key a member for the set's ttl from now.
func (s *Set[K]) Add(key K) { s.keys.Set(key, struct{}{}, s.ttl) }

// Delete removes key.
func (s *Set[K]) Delete(key K) { s.keys.Delete(key) }

// Has reports whether key was added less than the set's ttl ago and not
// deleted since.
func (s *Set[K]) Has(key K) bool {
	_, ok := s.keys.Get(key)
	return ok
}

// Len returns how many keys the set holds, counting expired keys it has
// not dropped yet (it drops them as keys are added).
func (s *Set[K]) Len() int { return s.keys.Len() }
