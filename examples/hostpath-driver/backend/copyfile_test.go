package backend

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestCopyFileRefusesSwappedSources: a source that is no longer a regular
// file when it is opened (the volume's user swapped it after the walk saw
// it) is refused at once: a symbolic link is not followed, a FIFO is not
// waited on.
func TestCopyFileRefusesSwappedSources(t *testing.T) {
	dir := t.TempDir()
	secret := filepath.Join(dir, "host-secret")
	if err := os.WriteFile(secret, []byte("host data"), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(secret, link); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct{ name, src, want string }{
		{"symbolic link", link, "too many levels of symbolic links"},
		{"fifo", fifo, "not a regular file"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dst := filepath.Join(t.TempDir(), "copy")
			done := make(chan error, 1)
			go func() { done <- copyFile(tt.src, dst) }()
			select {
			case err := <-done:
				if err == nil || !strings.Contains(err.Error(), tt.want) {
					t.Errorf("copyFile(%s) = %v, want an error containing %q", tt.name, err, tt.want)
				}
				if _, err := os.Stat(dst); !os.IsNotExist(err) {
					t.Errorf("the copy exists (%v)", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("copyFile(%s) did not return within 10s", tt.name)
			}
		})
	}
}
