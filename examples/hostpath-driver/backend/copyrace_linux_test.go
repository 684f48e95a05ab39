package backend

import (
	"bytes"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"
)

// TestCopyTreeDirectorySwapped: the volume's user swaps a subdirectory of
// the volume with a symbolic link to a host directory, over and over, while
// clones or snapshots of it are copied. O_NOFOLLOW guards only the last
// component of a path: a copy that resolved paths from the top followed the
// swapped directory, copying a host file into the clone and writing the
// user's file into the host directory, within a few dozen copies. No copy
// may do either.
func TestCopyTreeDirectorySwapped(t *testing.T) {
	base := t.TempDir()
	host := filepath.Join(base, "host") // stands for /etc
	if err := os.Mkdir(host, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(host, "shadow"), []byte("HOST SECRET"), 0o600); err != nil {
		t.Fatal(err)
	}
	vol := filepath.Join(base, "vol")
	sub := filepath.Join(vol, "sub")
	alt := filepath.Join(vol, "alt")
	if err := os.MkdirAll(sub, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(sub, "planted"), []byte("ATTACKER"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(host, alt); err != nil {
		t.Fatal(err)
	}
	var stop atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		for !stop.Load() {
			_ = unix.Renameat2(unix.AT_FDCWD, sub, unix.AT_FDCWD, alt, unix.RENAME_EXCHANGE)
		}
	}()
	defer func() { stop.Store(true); <-done }()

	var leaked, wroteHost int
	for i := 0; i < 2000 && (leaked == 0 || wroteHost == 0); i++ {
		dst := filepath.Join(base, "copies", "c")
		_ = os.RemoveAll(filepath.Join(base, "copies"))
		_ = os.MkdirAll(filepath.Join(base, "copies"), 0o755)
		_ = copyTree(vol, dst)
		_ = filepath.WalkDir(dst, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.Type().IsRegular() {
				if b, _ := os.ReadFile(p); bytes.Contains(b, []byte("HOST SECRET")) {
					if leaked == 0 {
						t.Logf("iteration %d: host file copied into the clone at %s", i, p)
					}
					leaked++
				}
			}
			return nil
		})
		if _, err := os.Lstat(filepath.Join(host, "planted")); err == nil {
			t.Logf("iteration %d: copy wrote the attacker's file into the host directory", i)
			wroteHost++
			_ = os.Remove(filepath.Join(host, "planted"))
		}
	}
	if leaked > 0 || wroteHost > 0 {
		t.Errorf("copyTree followed a swapped directory: %d copies held a host file, %d writes into the host directory", leaked, wroteHost)
	}
}
