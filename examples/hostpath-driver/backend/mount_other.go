//go:build !linux

package backend

import "fmt"

func bindMount(source, target string, _ bool) error {
	return fmt.Errorf("bind mount %s on %s: %w", source, target, ErrMountNotPermitted)
}

// unmount has nothing to undo: bindMount never succeeds off Linux.
func unmount(string) error { return nil }

// CheckBindMount always fails off Linux: see ErrMountNotPermitted.
func CheckBindMount(string) error {
	return fmt.Errorf("check bind mount: %w", ErrMountNotPermitted)
}
