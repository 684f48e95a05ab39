package testutil

import (
	"context"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// DefaultTimeout is the generous bound of [Eventually]: conditions in tests
// normally hold within a second or two; the bound only stops a hung test.
const DefaultTimeout = 2 * time.Minute

// Eventually polls cond every 50ms until it returns true, then returns. It
// fails the test with msg if cond does not hold within timeout (0 means
// DefaultTimeout) or returns an error. The last error or state is reported
// through cond's own t.Log calls, if any.
func Eventually(t testing.TB, timeout time.Duration, msg string, cond func(ctx context.Context) (bool, error)) {
	t.Helper()
	if timeout == 0 {
		timeout = DefaultTimeout
	}
	if err := wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, timeout, true, cond); err != nil {
		t.Fatalf("%s: %v", msg, err)
	}
}
