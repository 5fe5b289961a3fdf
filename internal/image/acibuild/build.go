package acibuild

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"crypto/sha512"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"kurma.dev/kurma/pkg/appc"
	"kurma.dev/kurma/pkg/kerrors"
)

// Epoch is the modification time of every entry written.
var epoch = time.Unix(946684800, 0).UTC() // 2000-01-01

// Builder writes a tar stream of a root filesystem, under "rootfs/" for an
// ACI or at the top for a plain layer.
type Builder struct {
	tw     *tar.Writer
	prefix string
	dirs   map[string]bool
}

// NewACI starts an ACI on w: the manifest first, then "rootfs/".
func NewACI(w io.Writer, m appc.ImageManifest) (*Builder, error) {
	if m.ACKind == "" {
		m.ACKind = appc.KindImageManifest
	}
	if m.ACVersion == "" {
		m.ACVersion = appc.ACVersion
	}
	if err := m.Validate(); err != nil {
		return nil, fmt.Errorf("%w: manifest: %w", kerrors.Invalid, err)
	}
	data, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encode manifest: %w", err)
	}
	b := &Builder{tw: tar.NewWriter(w), prefix: "rootfs/", dirs: map[string]bool{}}
	if err := b.tw.WriteHeader(&tar.Header{Name: "manifest", Mode: 0o644, Size: int64(len(data)), ModTime: epoch, Typeflag: tar.TypeReg, Format: tar.FormatPAX}); err != nil {
		return nil, fmt.Errorf("write manifest: %w", err)
	}
	if _, err := b.tw.Write(data); err != nil {
		return nil, fmt.Errorf("write manifest: %w", err)
	}
	if err := b.tw.WriteHeader(&tar.Header{Name: "rootfs/", Mode: 0o755, ModTime: epoch, Typeflag: tar.TypeDir, Format: tar.FormatPAX}); err != nil {
		return nil, fmt.Errorf("write rootfs: %w", err)
	}
	return b, nil
}

// NewLayer starts a plain layer tarball (entries at the top) on w.
func NewLayer(w io.Writer) *Builder {
	return &Builder{tw: tar.NewWriter(w), dirs: map[string]bool{}}
}

func hasDotDot(p string) bool {
	for _, c := range strings.Split(p, "/") {
		if c == ".." {
			return true
		}
	}
	return false
}

func cleanDst(dst string) (string, error) {
	d := path.Clean("/" + dst)[1:]
	if d == "" || hasDotDot(dst) {
		return "", kerrors.New(kerrors.Invalid, "bad destination %q", dst)
	}
	return d, nil
}

// mkdirs writes the missing parent directories of dst.
func (b *Builder) mkdirs(dst string) error {
	dir := path.Dir(dst)
	if dir == "." || b.dirs[dir] {
		return nil
	}
	if err := b.mkdirs(dir); err != nil {
		return err
	}
	return b.Dir(dir, 0o755)
}

// Dir writes a directory entry.
func (b *Builder) Dir(dst string, mode fs.FileMode) error {
	d, err := cleanDst(dst)
	if err != nil {
		return err
	}
	if b.dirs[d] {
		return nil
	}
	if err := b.mkdirs(d); err != nil {
		return err
	}
	b.dirs[d] = true
	return b.header(&tar.Header{Name: b.prefix + d + "/", Mode: int64(mode.Perm()), Typeflag: tar.TypeDir})
}

func (b *Builder) header(h *tar.Header) error {
	h.ModTime = epoch
	h.Format = tar.FormatPAX
	if err := b.tw.WriteHeader(h); err != nil {
		return fmt.Errorf("write %s: %w", h.Name, err)
	}
	return nil
}

// File writes a regular file with the given content.
func (b *Builder) File(dst string, mode fs.FileMode, data []byte) error {
	d, err := cleanDst(dst)
	if err != nil {
		return err
	}
	if err := b.mkdirs(d); err != nil {
		return err
	}
	if err := b.header(&tar.Header{Name: b.prefix + d, Mode: int64(mode.Perm()), Size: int64(len(data)), Typeflag: tar.TypeReg}); err != nil {
		return err
	}
	_, err = b.tw.Write(data)
	return err
}

// Symlink writes a symbolic link.
func (b *Builder) Symlink(dst, target string) error {
	d, err := cleanDst(dst)
	if err != nil {
		return err
	}
	if err := b.mkdirs(d); err != nil {
		return err
	}
	return b.header(&tar.Header{Name: b.prefix + d, Linkname: target, Mode: 0o777, Typeflag: tar.TypeSymlink})
}

// Raw writes a header as given (name relative to the root filesystem) and
// its content; tests use it for unusual entries.
func (b *Builder) Raw(h tar.Header, data []byte) error {
	h.Name = b.prefix + h.Name
	if h.Typeflag == tar.TypeLink && h.Linkname != "" {
		h.Linkname = b.prefix + h.Linkname
	}
	h.Size = int64(len(data))
	if err := b.header(&h); err != nil {
		return err
	}
	_, err := b.tw.Write(data)
	return err
}

// Add copies a host file, symlink or directory tree (sorted) to dst.
func (b *Builder) Add(src, dst string) error {
	fi, err := os.Lstat(src)
	if err != nil {
		return fmt.Errorf("add %s: %w", src, err)
	}
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		t, err := os.Readlink(src)
		if err != nil {
			return fmt.Errorf("add %s: %w", src, err)
		}
		return b.Symlink(dst, t)
	case fi.IsDir():
		if hasDotDot(dst) {
			return kerrors.New(kerrors.Invalid, "bad destination %q", dst)
		}
		// A directory added at "/" fills the root itself.
		if path.Clean("/"+dst) != "/" {
			if err := b.Dir(dst, fi.Mode()); err != nil {
				return err
			}
		}
		ents, err := os.ReadDir(src)
		if err != nil {
			return fmt.Errorf("add %s: %w", src, err)
		}
		sort.Slice(ents, func(i, j int) bool { return ents[i].Name() < ents[j].Name() })
		for _, e := range ents {
			if err := b.Add(filepath.Join(src, e.Name()), path.Join(dst, e.Name())); err != nil {
				return err
			}
		}
		return nil
	case fi.Mode().IsRegular():
		d, err := cleanDst(dst)
		if err != nil {
			return err
		}
		if err := b.mkdirs(d); err != nil {
			return err
		}
		f, err := os.Open(src)
		if err != nil {
			return fmt.Errorf("add %s: %w", src, err)
		}
		defer f.Close()
		if err := b.header(&tar.Header{Name: b.prefix + d, Mode: int64(fi.Mode().Perm()), Size: fi.Size(), Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		if _, err := io.CopyN(b.tw, f, fi.Size()); err != nil {
			return fmt.Errorf("add %s: %w", src, err)
		}
		return nil
	}
	return kerrors.New(kerrors.Invalid, "add %s: unsupported file type %s", src, fi.Mode().Type())
}

// Close ends the tar stream (not the underlying writer).
func (b *Builder) Close() error {
	if err := b.tw.Close(); err != nil {
		return fmt.Errorf("finish tar: %w", err)
	}
	return nil
}

// ImageID returns the appc image ID of an ACI read from r (plain or gzip):
// "sha512-" + hex sha512 of the uncompressed tar.
func ImageID(r io.Reader) (string, error) {
	br := bufio.NewReader(r)
	var src io.Reader = br
	if m, _ := br.Peek(2); len(m) == 2 && m[0] == 0x1f && m[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return "", fmt.Errorf("%w: gzip: %w", kerrors.Invalid, err)
		}
		defer zr.Close()
		src = zr
	}
	h := sha512.New()
	if _, err := io.Copy(h, src); err != nil {
		return "", fmt.Errorf("hash image: %w", err)
	}
	return "sha512-" + hex.EncodeToString(h.Sum(nil)), nil
}

// ImageIDFile is ImageID of a file.
func ImageIDFile(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", fmt.Errorf("open image: %w", err)
	}
	defer f.Close()
	return ImageID(f)
}
