package stager

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// opaqueXattr marks a directory that hides the contents of lower layers.
const opaqueXattr = "trusted.overlay.opaque"

// CopyLayer copies one extracted layer onto dst, applying the overlay-form
// whiteouts the image store writes: a character device 0:0 deletes the
// same path from what lies below, and a directory with
// trusted.overlay.opaque="y" replaces the directory below instead of merging
// with it. Ownership, modes, symlinks and device nodes are kept.
func CopyLayer(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return fmt.Errorf("lstat %s: %w", p, err)
		}
		mode := st.Mode & unix.S_IFMT
		if rel != "." && isWhiteout(&st) {
			if err := os.RemoveAll(target); err != nil {
				return fmt.Errorf("whiteout %s: %w", rel, err)
			}
			return nil
		}
		if rel != "." {
			// Whatever lies below of another type is replaced.
			if ex, err := os.Lstat(target); err == nil && (!ex.IsDir() || mode != unix.S_IFDIR) {
				if err := os.RemoveAll(target); err != nil {
					return err
				}
			}
		}
		switch mode {
		case unix.S_IFDIR:
			if rel != "." && isOpaque(p) {
				if err := os.RemoveAll(target); err != nil {
					return err
				}
			}
			if err := os.Mkdir(target, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
				return err
			}
		case unix.S_IFREG:
			if err := copyFile(p, target); err != nil {
				return err
			}
		case unix.S_IFLNK:
			link, err := os.Readlink(p)
			if err != nil {
				return err
			}
			if err := os.Symlink(link, target); err != nil {
				return err
			}
		case unix.S_IFCHR, unix.S_IFBLK, unix.S_IFIFO:
			if err := unix.Mknod(target, st.Mode, int(st.Rdev)); err != nil {
				return fmt.Errorf("mknod %s: %w", rel, err)
			}
		default:
			return nil // sockets and the like are not copied
		}
		if err := unix.Lchown(target, int(st.Uid), int(st.Gid)); err != nil {
			return fmt.Errorf("chown %s: %w", rel, err)
		}
		if mode != unix.S_IFLNK {
			if err := unix.Chmod(target, st.Mode&0o7777); err != nil {
				return fmt.Errorf("chmod %s: %w", rel, err)
			}
		}
		return nil
	})
}

func isWhiteout(st *unix.Stat_t) bool {
	return st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0
}

func isOpaque(dir string) bool {
	buf := make([]byte, 8)
	n, err := unix.Lgetxattr(dir, opaqueXattr, buf)
	return err == nil && n == 1 && buf[0] == 'y'
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return fmt.Errorf("copy %s: %w", src, err)
	}
	return out.Close()
}
