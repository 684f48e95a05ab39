package expiring

import (
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

// FuzzSet runs Add, Delete and clock steps in the order ops gives them
// (two bytes each: the operation and its key, or the seconds to step) on a
// Set and on a reference model, a map of each key's last Add time, and
// checks after every step: Has agrees with the model for every key (a
// member for exactly ttl after its last Add, not after a Delete), and Len
// counts at least the members, and exactly them right after an Add with a
// positive ttl (expired keys are dropped as keys are added).
func FuzzSet(f *testing.F) {
	f.Add(uint8(60), []byte{0, 0, 2, 30, 0, 1, 2, 30, 0, 1, 2, 20, 1, 1, 2, 59, 2, 1})
	f.Add(uint8(0), []byte{0, 0, 0, 1, 2, 0, 0, 0})
	f.Add(uint8(1), []byte{0, 0, 2, 1, 0, 1, 1, 0, 0, 0})
	f.Fuzz(func(t *testing.T, ttlSeconds uint8, ops []byte) {
		const keys = 4
		ttl := time.Duration(ttlSeconds) * time.Second
		clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
		s := NewSet[int](clk, ttl)
		added := map[int]time.Time{} // key → last Add, absent when deleted or never added
		for i := 0; i+2 <= len(ops) && i < 2000; i += 2 {
			op, arg := ops[i]%3, int(ops[i+1])
			switch op {
			case 0:
				s.Add(arg % keys)
				added[arg%keys] = clk.Now()
			case 1:
				s.Delete(arg % keys)
				delete(added, arg%keys)
			case 2:
				clk.Step(time.Duration(arg%64) * time.Second)
			}
			members := 0
			for k := range keys {
				at, ok := added[k]
				want := ok && clk.Now().Before(at.Add(ttl))
				if want {
					members++
				}
				if got := s.Has(k); got != want {
					t.Fatalf("op %d: Has(%d) = %v, want %v (ttl %s, added at %v, now %v)", i/2, k, got, want, ttl, at, clk.Now())
				}
			}
			n := s.Len()
			if n < members || n > keys || (op == 0 && ttl > 0 && n != members) {
				t.Fatalf("op %d: Len() = %d with %d members (ttl %s)", i/2, n, members, ttl)
			}
		}
	})
}
