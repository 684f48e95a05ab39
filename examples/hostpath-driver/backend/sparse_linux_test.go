package backend

import (
	"os"
	"syscall"
	"testing"
)

// checkSparse fails the test if path has more than maxAllocated bytes of
// blocks on disk.
func checkSparse(t *testing.T, path string, maxAllocated int64) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return
	}
	if allocated := st.Blocks * 512; allocated > maxAllocated {
		t.Errorf("%s has %d bytes allocated, want at most %d: holes were not kept", path, allocated, maxAllocated)
	}
}
