package backend

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"syscall"
)

// Whence values of lseek(2) that find the data and holes of a sparse file
// (Linux, and most other Unix systems). Where they are unsupported, Seek
// fails and copySparse falls back to a plain copy.
const (
	seekData = 3
	seekHole = 4
)

// fsync flushes f (a file or a directory) to stable storage. Tests
// replace it to see what was flushed.
var fsync = (*os.File).Sync

// makeSparseFile creates path if needed and grows it, without allocating
// blocks, to size bytes. A larger file is left as it is.
func makeSparseFile(path string, size int64) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY, 0o640)
	if err != nil {
		return fmt.Errorf("create block volume: %w", err)
	}
	fi, err := f.Stat()
	if err == nil && fi.Size() < size {
		err = f.Truncate(size)
	}
	if err == nil {
		err = fsync(f)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("size block volume %s: %w", path, err)
	}
	return syncDir(filepath.Dir(path))
}

// copyFile copies the regular file src to the new file dst, keeping its
// mode and its holes, and fsyncs dst: the caller acknowledges the copy
// (a clone, restore or snapshot) right after, so it must survive a power
// loss. The caller fsyncs dst's directory.
//
// src must still be a regular file when it is opened: the volume's user may
// have replaced it since the caller looked, with a symbolic link (to a file
// of the host, which would end up in the copy) or a FIFO (whose open would
// block the driver for ever). Neither is followed nor waited for.
func copyFile(src, dst string) error {
	in, err := os.OpenFile(src, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return fmt.Errorf("copy %s: %w", src, err)
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return fmt.Errorf("copy %s: %w", src, err)
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("copy %s: not a regular file (%s)", src, fi.Mode().Type())
	}
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, fi.Mode().Perm())
	if err != nil {
		return fmt.Errorf("copy %s: %w", src, err)
	}
	err = copySparse(out, in, fi.Size())
	if err == nil {
		// Holes at the end are not written; truncate restores the size.
		err = out.Truncate(fi.Size())
	}
	if err == nil {
		err = fsync(out)
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("copy %s to %s: %w", src, dst, err)
	}
	return nil
}

// copySparse copies the first size bytes of in to out at the same
// offsets, skipping the holes that SEEK_DATA/SEEK_HOLE report.
func copySparse(out, in *os.File, size int64) error {
	for off := int64(0); off < size; {
		data, err := in.Seek(off, seekData)
		if errors.Is(err, syscall.ENXIO) {
			return nil // only a hole after off
		}
		if err != nil {
			return copyRange(out, in, off, size-off)
		}
		hole, err := in.Seek(data, seekHole)
		if err != nil {
			return copyRange(out, in, data, size-data)
		}
		if err := copyRange(out, in, data, hole-data); err != nil {
			return err
		}
		off = hole
	}
	return nil
}

func copyRange(out, in *os.File, off, n int64) error {
	if _, err := out.Seek(off, io.SeekStart); err != nil {
		return err
	}
	_, err := io.Copy(out, io.NewSectionReader(in, off, n))
	return err
}

// copyTree copies the directory src to the new directory dst: directories,
// regular files (sparsely) and symbolic links, with their modes. Device
// files, sockets and pipes are skipped. Ownership is not copied. Every
// file and directory of dst is fsynced before it returns (see copyFile);
// the caller fsyncs dst's parent.
func copyTree(src, dst string) error {
	var dirs []string
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch mode := info.Mode(); {
		case mode.IsDir():
			if err := os.Mkdir(target, mode.Perm()); err != nil {
				return err
			}
			dirs = append(dirs, target)
			// Mkdir applies the umask; keep the source's mode exactly.
			return os.Chmod(target, mode.Perm())
		case mode.IsRegular():
			return copyFile(path, target)
		case mode&fs.ModeSymlink != 0:
			link, err := os.Readlink(path)
			if err != nil {
				return err
			}
			return os.Symlink(link, target)
		default:
			return nil
		}
	})
	if err != nil {
		return err
	}
	// Reversed, so that each directory is flushed after those below it.
	for _, dir := range slices.Backward(dirs) {
		if err := syncDir(dir); err != nil {
			return err
		}
	}
	return nil
}

// syncDir fsyncs a directory so that an entry created in it is durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("open directory %s: %w", dir, err)
	}
	defer d.Close()
	if err := fsync(d); err != nil {
		return fmt.Errorf("fsync directory %s: %w", dir, err)
	}
	return nil
}
