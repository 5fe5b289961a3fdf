package tarx

import (
	"archive/tar"
	"context"
	"crypto/sha512"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"kurma.dev/kurma/pkg/kerrors"
)

// Options tune an extraction.
type Options struct {
	// AllowDevices permits character and block device entries (layers of
	// trusted images). FIFOs are always allowed.
	AllowDevices bool
	// Whiteouts converts OCI whiteout entries into overlayfs form (see the
	// package documentation). When false, ".wh." names are plain files.
	Whiteouts bool
	// Prefix, when set (e.g. "rootfs"), extracts only entries below it, with
	// the prefix stripped; every other entry is handed to Other (or skipped
	// when Other is nil). An ACI is extracted this way.
	Prefix string
	// Other receives entries outside Prefix (e.g. an ACI's "manifest").
	Other func(hdr *tar.Header, r io.Reader) error
	// Progress, when set, is told the number of input bytes consumed so far.
	Progress func(n int64)
	// MaxBytes bounds the (uncompressed) stream: a larger one, or an entry
	// claiming more, is refused (kerrors.Invalid) as soon as that shows.
	// Zero means DefaultMaxBytes; negative means no bound.
	MaxBytes int64
}

// DefaultMaxBytes is the largest tar stream Extract takes by default: far
// beyond any real image layer, it stops a decompression bomb from filling
// the disk.
const DefaultMaxBytes int64 = 64 << 30

// Result describes an extracted stream.
type Result struct {
	// Digest is "sha512-<hex>" of the whole (uncompressed) input stream,
	// including what follows the last entry: an appc image ID.
	Digest  string
	Size    int64
	Entries int
}

const (
	// maxNameLen is Linux's PATH_MAX: no longer name can be created.
	maxNameLen     = 4096
	opaqueXattr    = "trusted.overlay.opaque"
	whiteoutPrefix = ".wh."
	opaqueMarker   = ".wh..wh..opq"
)

// Extract reads the tar stream r and writes its entries below dir, which
// must exist. Nothing is ever written outside dir; the first bad entry stops
// the extraction with an error (category kerrors.Invalid) naming it, and the
// caller is expected to remove dir.
func Extract(ctx context.Context, r io.Reader, dir string, opts Options) (Result, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return Result{}, fmt.Errorf("open extraction root: %w", err)
	}
	defer root.Close()

	h := sha512.New()
	limit := opts.MaxBytes
	if limit == 0 {
		limit = DefaultMaxBytes
	}
	cr := &countingReader{r: io.TeeReader(r, h), progress: opts.Progress, limit: limit}
	x := &extractor{root: root, opts: opts, isRoot: os.Geteuid() == 0, known: map[string]bool{}}
	tr := tar.NewReader(cr)
	res := Result{}
	for {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return res, kerrors.New(kerrors.Invalid, "read tar: %v", err)
		}
		res.Entries++
		if limit > 0 && hdr.Size > limit-cr.n {
			return res, kerrors.New(kerrors.Invalid, "tar entry %q claims %d bytes: more than the %d-byte limit of a layer", hdr.Name, hdr.Size, limit)
		}
		if err := x.entry(ctx, hdr, tr); err != nil {
			return res, err
		}
	}
	// Hash what follows the end-of-archive marker too: an image ID covers
	// the whole stream.
	if _, err := io.Copy(io.Discard, cr); err != nil {
		return res, fmt.Errorf("read tar trailer: %w", err)
	}
	x.finishDirs()
	res.Digest = digestOf(h)
	res.Size = cr.n
	return res, nil
}

func digestOf(h hash.Hash) string { return "sha512-" + hex.EncodeToString(h.Sum(nil)) }

type countingReader struct {
	r        io.Reader
	n        int64
	progress func(int64)
	limit    int64 // >0: more input than this is an error
}

func (c *countingReader) Read(p []byte) (int, error) {
	// Reading at most one byte past the limit tells a stream of exactly
	// limit bytes from a longer one.
	if c.limit > 0 && int64(len(p)) > c.limit-c.n+1 {
		p = p[:c.limit-c.n+1]
	}
	n, err := c.r.Read(p)
	c.n += int64(n)
	if c.limit > 0 && c.n > c.limit {
		return n, kerrors.New(kerrors.Invalid, "tar stream longer than the %d-byte limit of a layer", c.limit)
	}
	if c.progress != nil && n > 0 {
		c.progress(c.n)
	}
	return n, err
}

type dirTime struct {
	name  string
	mtime time.Time
}

type extractor struct {
	root   *os.Root
	opts   Options
	isRoot bool
	dirs   []dirTime
	// known holds directories known to exist as real directories (not
	// symlinks), to skip MkdirAll; it is cleared whenever an entry is
	// removed or replaced.
	known map[string]bool
}

func (x *extractor) mkdirAll(dir string) error {
	if dir == "." || x.known[dir] {
		return nil
	}
	if err := x.root.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if fi, err := x.root.Lstat(dir); err == nil && fi.IsDir() {
		x.known[dir] = true
	}
	return nil
}

// CleanName validates a tar entry name and returns it relative to the
// target ("." for the target itself). Absolute names and names with a ".."
// component are refused.
func CleanName(name string) (string, error) {
	if name == "" {
		return "", kerrors.New(kerrors.Invalid, "tar entry with an empty name")
	}
	if strings.ContainsRune(name, 0) {
		return "", kerrors.New(kerrors.Invalid, "tar entry %q: name contains NUL", name)
	}
	if len(name) > maxNameLen {
		return "", kerrors.New(kerrors.Invalid, "tar entry %.64q...: name longer than %d bytes", name, maxNameLen)
	}
	if strings.HasPrefix(name, "/") {
		return "", kerrors.New(kerrors.Invalid, "tar entry %q: absolute path refused", name)
	}
	for _, c := range strings.Split(name, "/") {
		if c == ".." {
			return "", kerrors.New(kerrors.Invalid, "tar entry %q: path traversal (..) refused", name)
		}
	}
	return path.Clean(name), nil
}

// stripPrefix maps an entry name to its name below Prefix; ok is false for
// entries outside it.
func (x *extractor) stripPrefix(name string) (string, bool) {
	if x.opts.Prefix == "" {
		return name, true
	}
	p := strings.Trim(x.opts.Prefix, "/")
	n := strings.TrimPrefix(name, "./")
	if n == p || n == p+"/" {
		return ".", true
	}
	if strings.HasPrefix(n, p+"/") {
		return n[len(p)+1:], true
	}
	return "", false
}

func (x *extractor) entry(ctx context.Context, hdr *tar.Header, r io.Reader) error {
	name, inside := x.stripPrefix(hdr.Name)
	if !inside {
		if x.opts.Other != nil {
			return x.opts.Other(hdr, r)
		}
		return nil
	}
	name, err := CleanName(name)
	if err != nil {
		return err
	}
	if err := x.write(ctx, name, hdr, r); err != nil {
		return wrapEntry(hdr.Name, err)
	}
	return nil
}

// wrapEntry names the entry and puts errors caused by the tarball's content
// into kerrors.Invalid; plain I/O failures of the host keep their own cause.
func wrapEntry(name string, err error) error {
	if errors.Is(err, kerrors.Invalid) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EIO) || errors.Is(err, syscall.EDQUOT) {
		return fmt.Errorf("tar entry %q: %w", name, err)
	}
	return fmt.Errorf("%w: tar entry %q: %w", kerrors.Invalid, name, err)
}

func (x *extractor) write(ctx context.Context, name string, hdr *tar.Header, r io.Reader) error {
	if name == "." {
		if hdr.Typeflag == tar.TypeDir {
			x.dirs = append(x.dirs, dirTime{".", hdr.ModTime})
			return x.root.Chmod(".", fs.FileMode(hdr.Mode)&fs.ModePerm|modeBits(hdr.Mode))
		}
		return kerrors.New(kerrors.Invalid, "tar entry %q: replaces the target directory", hdr.Name)
	}
	dir, base := path.Split(name)
	dir = strings.TrimSuffix(dir, "/")
	if dir == "" {
		dir = "."
	}
	if x.opts.Whiteouts && strings.HasPrefix(base, whiteoutPrefix) {
		return x.whiteout(dir, base)
	}
	if err := x.mkdirAll(dir); err != nil {
		return err
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		fi, err := x.root.Lstat(name)
		switch {
		case err == nil && fi.IsDir():
		case err == nil:
			if err := x.root.Remove(name); err != nil {
				return err
			}
			fallthrough
		default:
			if err := x.root.Mkdir(name, 0o700); err != nil {
				return err
			}
		}
		x.dirs = append(x.dirs, dirTime{name, hdr.ModTime})
	case tar.TypeReg, tar.TypeRegA:
		if isSparse(hdr) {
			return kerrors.New(kerrors.Invalid, "sparse files are not supported")
		}
		return x.regular(ctx, name, hdr, r)
	case tar.TypeGNUSparse:
		// A sparse map can claim a huge logical size from a few input
		// bytes, which would be written out as zeros.
		return kerrors.New(kerrors.Invalid, "sparse files are not supported")
	case tar.TypeSymlink:
		if hdr.Linkname == "" {
			return kerrors.New(kerrors.Invalid, "symlink with an empty target")
		}
		if err := x.removeExisting(name); err != nil {
			return err
		}
		if err := x.root.Symlink(hdr.Linkname, name); err != nil {
			return err
		}
	case tar.TypeLink:
		target, ok := x.stripPrefix(hdr.Linkname)
		if !ok {
			return kerrors.New(kerrors.Invalid, "hard link to %q outside the extracted tree", hdr.Linkname)
		}
		target, err := CleanName(target)
		if err != nil {
			return fmt.Errorf("hard link target: %w", err)
		}
		fi, err := x.root.Lstat(target)
		if err != nil {
			return kerrors.New(kerrors.Invalid, "hard link to %q: %v", hdr.Linkname, err)
		}
		if fi.IsDir() {
			return kerrors.New(kerrors.Invalid, "hard link to directory %q", hdr.Linkname)
		}
		if target == name {
			return nil
		}
		if err := x.removeExisting(name); err != nil {
			return err
		}
		return x.root.Link(target, name)
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		if hdr.Typeflag != tar.TypeFifo && !x.opts.AllowDevices {
			return kerrors.New(kerrors.Invalid, "device node refused")
		}
		if err := x.removeExisting(name); err != nil {
			return err
		}
		mode := uint32(hdr.Mode) & 0o7777
		switch hdr.Typeflag {
		case tar.TypeChar:
			mode |= unix.S_IFCHR
		case tar.TypeBlock:
			mode |= unix.S_IFBLK
		default:
			mode |= unix.S_IFIFO
		}
		dev := int(unix.Mkdev(uint32(hdr.Devmajor), uint32(hdr.Devminor)))
		if err := x.mknod(dir, base, mode, dev); err != nil {
			return err
		}
	case tar.TypeXGlobalHeader, tar.TypeXHeader, tar.TypeGNULongName, tar.TypeGNULongLink:
		return nil
	default:
		return kerrors.New(kerrors.Invalid, "unsupported tar entry type %q", hdr.Typeflag)
	}
	return x.attrs(name, hdr)
}

func isSparse(hdr *tar.Header) bool {
	for k := range hdr.PAXRecords {
		if strings.HasPrefix(k, "GNU.sparse.") {
			return true
		}
	}
	return false
}

func modeBits(m int64) fs.FileMode {
	var fm fs.FileMode
	if m&0o4000 != 0 {
		fm |= fs.ModeSetuid
	}
	if m&0o2000 != 0 {
		fm |= fs.ModeSetgid
	}
	if m&0o1000 != 0 {
		fm |= fs.ModeSticky
	}
	return fm
}

func (x *extractor) removeExisting(name string) error {
	clear(x.known)
	fi, err := x.root.Lstat(name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.IsDir() {
		return x.root.RemoveAll(name)
	}
	return x.root.Remove(name)
}

// regular writes a regular file. It is created with O_EXCL, so an existing
// entry of that name (a symlink from earlier in the tarball included) is
// removed first and never written through.
func (x *extractor) regular(ctx context.Context, name string, hdr *tar.Header, r io.Reader) error {
	const flags = os.O_WRONLY | os.O_CREATE | os.O_EXCL
	f, err := x.root.OpenFile(name, flags, 0o600)
	if errors.Is(err, fs.ErrExist) {
		if err := x.removeExisting(name); err != nil {
			return err
		}
		f, err = x.root.OpenFile(name, flags, 0o600)
	}
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := io.Copy(f, &ctxReader{ctx: ctx, r: r}); err != nil {
		return err
	}
	fd := int(f.Fd())
	x.setXattrs(fd, hdr)
	if x.isRoot {
		if err := f.Chown(hdr.Uid, hdr.Gid); err != nil {
			return err
		}
	}
	if err := f.Chmod(fs.FileMode(hdr.Mode)&fs.ModePerm | modeBits(hdr.Mode)); err != nil {
		return err
	}
	tv := unix.NsecToTimeval(hdr.ModTime.UnixNano())
	if err := unix.Futimes(fd, []unix.Timeval{tv, tv}); err != nil {
		return fmt.Errorf("set times: %w", err)
	}
	return f.Close()
}

type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c *ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// attrs applies ownership, mode and times to an entry other than a regular
// file's content (regular files get theirs through their open descriptor).
func (x *extractor) attrs(name string, hdr *tar.Header) error {
	switch hdr.Typeflag {
	case tar.TypeLink:
		return nil
	case tar.TypeSymlink:
		if x.isRoot {
			if err := x.root.Lchown(name, hdr.Uid, hdr.Gid); err != nil {
				return err
			}
		}
		return x.symlinkTimes(name, hdr.ModTime)
	case tar.TypeDir:
		if f, err := x.root.Open(name); err == nil {
			x.setXattrs(int(f.Fd()), hdr)
			f.Close()
		}
	}
	if x.isRoot {
		if err := x.root.Lchown(name, hdr.Uid, hdr.Gid); err != nil {
			return err
		}
	}
	if err := x.root.Chmod(name, fs.FileMode(hdr.Mode)&fs.ModePerm|modeBits(hdr.Mode)); err != nil {
		return err
	}
	if hdr.Typeflag == tar.TypeDir {
		return nil // times are set in finishDirs, after the children
	}
	return x.root.Chtimes(name, hdr.ModTime, hdr.ModTime)
}

// setXattrs applies the entry's PAX xattrs, best effort. overlayfs
// attributes are never taken from a tarball: only whiteout conversion sets
// them.
func (x *extractor) setXattrs(fd int, hdr *tar.Header) {
	for k, v := range hdr.PAXRecords {
		attr, ok := strings.CutPrefix(k, "SCHILY.xattr.")
		if !ok || strings.HasPrefix(attr, "trusted.overlay.") {
			continue
		}
		if strings.HasPrefix(attr, "trusted.") && !x.isRoot {
			continue
		}
		_ = unix.Fsetxattr(fd, attr, []byte(v), 0)
	}
}

func (x *extractor) symlinkTimes(name string, mtime time.Time) error {
	dir, base := path.Split(name)
	if dir == "" {
		dir = "."
	}
	d, err := x.root.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	ts := unix.NsecToTimespec(mtime.UnixNano())
	return unix.UtimesNanoAt(int(d.Fd()), base, []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW)
}

// mknod creates a node in dir (opened through the root, so it cannot be
// outside it); base has no slash.
func (x *extractor) mknod(dir, base string, mode uint32, dev int) error {
	d, err := x.root.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := unix.Mknodat(int(d.Fd()), base, mode, dev); err != nil {
		return fmt.Errorf("mknod %s: %w", path.Join(dir, base), err)
	}
	return nil
}

func (x *extractor) whiteout(dir, base string) error {
	if err := x.root.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if base == opaqueMarker {
		d, err := x.root.Open(dir)
		if err != nil {
			return err
		}
		defer d.Close()
		if err := unix.Fsetxattr(int(d.Fd()), opaqueXattr, []byte("y"), 0); err != nil {
			return fmt.Errorf("mark %s opaque: %w", dir, err)
		}
		return nil
	}
	target := base[len(whiteoutPrefix):]
	if target == "" || target == "." || target == ".." {
		return kerrors.New(kerrors.Invalid, "bad whiteout name %q", base)
	}
	if err := x.removeExisting(path.Join(dir, target)); err != nil {
		return err
	}
	return x.mknod(dir, target, unix.S_IFCHR, 0)
}

// finishDirs sets directory times last, deepest first, since creating
// children changes them.
func (x *extractor) finishDirs() {
	for i := len(x.dirs) - 1; i >= 0; i-- {
		d := x.dirs[i]
		_ = x.root.Chtimes(d.name, d.mtime, d.mtime)
	}
}
