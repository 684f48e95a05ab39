//go:build linux

package backend

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// bindMount bind-mounts source onto target, then remounts it read-only
// when readOnly is set (a bind mount ignores MS_RDONLY on the first call).
func bindMount(source, target string, readOnly bool) error {
	if err := syscall.Mount(source, target, "", syscall.MS_BIND, ""); err != nil {
		return mountError("bind mount "+source+" on "+target, err)
	}
	if readOnly {
		flags := uintptr(syscall.MS_BIND | syscall.MS_REMOUNT | syscall.MS_RDONLY)
		if err := syscall.Mount("", target, "", flags, ""); err != nil {
			_ = syscall.Unmount(target, 0)
			return mountError("remount "+target+" read-only", err)
		}
	}
	return nil
}

// unmount unmounts target. A target that is not a mount point (EINVAL) or
// does not exist (ENOENT) is not an error.
func unmount(target string) error {
	err := syscall.Unmount(target, 0)
	if err == nil || errors.Is(err, syscall.EINVAL) || errors.Is(err, syscall.ENOENT) {
		return nil
	}
	return mountError("unmount "+target, err)
}

func mountError(what string, err error) error {
	if errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.EACCES) {
		return fmt.Errorf("%s: %w: running as uid %d: %w", what, ErrMountNotPermitted, os.Geteuid(), err)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// CheckBindMount reports whether this process may bind mount, by doing
// one bind mount between two directories it creates (and removes) under
// dir. It returns nil when it may, an error wrapping ErrMountNotPermitted
// when it may not, or another error when dir is unusable.
func CheckBindMount(dir string) error {
	probe, err := os.MkdirTemp(dir, "mount-probe-")
	if err != nil {
		return fmt.Errorf("check bind mount: %w", err)
	}
	defer os.RemoveAll(probe)
	source, target := filepath.Join(probe, "source"), filepath.Join(probe, "target")
	for _, d := range []string{source, target} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return fmt.Errorf("check bind mount: %w", err)
		}
	}
	if err := bindMount(source, target, false); err != nil {
		return fmt.Errorf("check bind mount: %w", err)
	}
	return unmount(target)
}
