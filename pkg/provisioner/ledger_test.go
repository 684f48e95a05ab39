package provisioner

import (
	"fmt"
	"testing"

	"k8s.io/apimachinery/pkg/types"
)

// TestLedgerForgetsPinnedNames: a forgotten claim's pinned volume name goes
// with its state (no entry per deleted claim for the life of the process),
// and the names of the claims still held survive the shrink after a burst.
func TestLedgerForgetsPinnedNames(t *testing.T) {
	l := newLedger()
	const n, kept = 2000, 100
	uid := func(i int) types.UID { return types.UID(fmt.Sprintf("uid-%d", i)) }
	for i := range n {
		if !l.begin(uid(i)) {
			t.Fatalf("begin %d refused", i)
		}
		l.pin(uid(i), fmt.Sprintf("pvc-%d", i))
	}
	for i := kept; i < n; i++ {
		l.forget(uid(i))
	}
	if len(l.names) != kept {
		t.Errorf("%d pinned names left after forgetting all but %d claims, want %d", len(l.names), kept, kept)
	}
	for i := range n {
		name, ok := l.pinned(uid(i))
		if want := i < kept; ok != want || ok && name != fmt.Sprintf("pvc-%d", i) {
			t.Errorf("pinned(%s) = %q, %t; want pinned %t", uid(i), name, ok, want)
		}
	}
}
