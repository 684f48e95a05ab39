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
	return copyOpened(in, src, dst, func(perm fs.FileMode) (*os.File, error) {
		return os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, perm)
	})
}

// copyOpened copies in, opened from src, to the file create makes (dst),
// as copyFile does.
func copyOpened(in *os.File, src, dst string, create func(fs.FileMode) (*os.File, error)) error {
	fi, err := in.Stat()
	if err != nil {
		return fmt.Errorf("copy %s: %w", src, err)
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("copy %s: not a regular file (%s)", src, fi.Mode().Type())
	}
	out, err := create(fi.Mode().Perm())
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
//
// The volume's user may change src while it is copied, for example swap a
// directory for a symbolic link to a directory of the host, between the
// moment the walk lists it and the moment it reads or writes below it.
// Every access therefore goes through an [os.Root] of src and one of dst:
// no path is resolved outside them, whatever a component has become, so
// the copy neither reads a host file into the copy nor writes through a
// link it copied.
func copyTree(src, dst string) error {
	fi, err := os.Lstat(src)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("copy %s: not a directory (%s)", src, fi.Mode().Type())
	}
	if err := os.Mkdir(dst, fi.Mode().Perm()); err != nil {
		return err
	}
	from, err := os.OpenRoot(src)
	if err != nil {
		return err
	}
	defer from.Close()
	to, err := os.OpenRoot(dst)
	if err != nil {
		return err
	}
	defer to.Close()
	dirs := []string{"."}
	err = fs.WalkDir(from.FS(), ".", func(rel string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		mode := info.Mode()
		switch {
		case rel == ".":
			return chmodIn(to, rel, mode.Perm())
		case mode.IsDir():
			if err := to.Mkdir(rel, mode.Perm()); err != nil {
				return err
			}
			dirs = append(dirs, rel)
			return chmodIn(to, rel, mode.Perm())
		case mode.IsRegular():
			in, err := from.OpenFile(rel, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
			if err != nil {
				return fmt.Errorf("copy %s: %w", filepath.Join(src, rel), err)
			}
			defer in.Close()
			return copyOpened(in, filepath.Join(src, rel), filepath.Join(dst, rel), func(perm fs.FileMode) (*os.File, error) {
				return to.OpenFile(rel, os.O_CREATE|os.O_EXCL|os.O_WRONLY|syscall.O_NOFOLLOW, perm)
			})
		case mode&fs.ModeSymlink != 0:
			link, err := from.Readlink(rel)
			if err != nil {
				return err
			}
			return to.Symlink(link, rel)
		default:
			return nil
		}
	})
	if err != nil {
		return err
	}
	// Reversed, so that each directory is flushed after those below it.
	for _, dir := range slices.Backward(dirs) {
		if err := syncDirIn(to, dir); err != nil {
			return fmt.Errorf("%s: %w", filepath.Join(dst, dir), err)
		}
	}
	return nil
}

// chmodIn sets the mode of the directory rel of root exactly (Mkdir
// applies the umask), through its open descriptor: Root.Chmod would follow
// a link that replaced it meanwhile.
func chmodIn(root *os.Root, rel string, perm fs.FileMode) error {
	d, err := openDirIn(root, rel)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Chmod(perm)
}

// syncDirIn fsyncs the directory rel of root.
func syncDirIn(root *os.Root, rel string) error {
	d, err := openDirIn(root, rel)
	if err != nil {
		return fmt.Errorf("open directory: %w", err)
	}
	defer d.Close()
	if err := fsync(d); err != nil {
		return fmt.Errorf("fsync directory: %w", err)
	}
	return nil
}

// openDirIn opens the directory rel of root, not following a link there.
func openDirIn(root *os.Root, rel string) (*os.File, error) {
	return root.OpenFile(rel, os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW, 0)
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
