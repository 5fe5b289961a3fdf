package tarx_test

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"sort"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"kurma.dev/kurma/internal/image/tarx"
	"kurma.dev/kurma/internal/testutil"
	"kurma.dev/kurma/pkg/kerrors"
)

type ent struct {
	name, link string
	typ        byte
	mode       int64
	body       string
	major      int64
}

func mkTar(t testing.TB, ents []ent) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range ents {
		mode := e.mode
		if mode == 0 {
			mode = 0o644
		}
		h := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: e.typ, Mode: mode, Size: int64(len(e.body)),
			ModTime: time.Unix(1700000000, 0), Devmajor: e.major}
		if e.typ != tar.TypeReg {
			h.Size = 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Size > 0 {
			if _, err := tw.Write([]byte(e.body)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// listTree returns every path under dir with its mode and size, to compare
// a sentinel directory before and after.
func listTree(t testing.TB, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		out = append(out, p+" "+fi.Mode().String()+" "+string(rune('0'+fi.Size()%10)))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(out)
	return out
}

func TestExtractRefusesMalicious(t *testing.T) {
	tests := []struct {
		name string
		ents []ent
	}{
		{"traversal", []ent{{name: "../sentinel/pwn", typ: tar.TypeReg, body: "x"}}},
		{"inner traversal", []ent{{name: "a/../../sentinel/pwn", typ: tar.TypeReg, body: "x"}}},
		{"absolute", []ent{{name: "/SENTINEL/pwn", typ: tar.TypeReg, body: "x"}}},
		{"symlink escape then write-through", []ent{
			{name: "l", typ: tar.TypeSymlink, link: "SENTINEL"},
			{name: "l/pwn", typ: tar.TypeReg, body: "x"}}},
		{"relative symlink escape then write-through", []ent{
			{name: "d/", typ: tar.TypeDir, mode: 0o755},
			{name: "d/l", typ: tar.TypeSymlink, link: "../../sentinel"},
			{name: "d/l/pwn", typ: tar.TypeReg, body: "x"}}},
		{"symlink escape then mkdir", []ent{
			{name: "l", typ: tar.TypeSymlink, link: "SENTINEL"},
			{name: "l/newdir/", typ: tar.TypeDir, mode: 0o755}}},
		{"hardlink escape", []ent{{name: "h", typ: tar.TypeLink, link: "../sentinel/secret"}}},
		{"hardlink absolute", []ent{{name: "h", typ: tar.TypeLink, link: "SENTINEL/secret"}}},
		{"hardlink through symlink", []ent{
			{name: "l", typ: tar.TypeSymlink, link: "SENTINEL"},
			{name: "h", typ: tar.TypeLink, link: "l/secret"}}},
		{"device node", []ent{{name: "dev/sda", typ: tar.TypeBlock, major: 8}}},
		{"char device", []ent{{name: "mem", typ: tar.TypeChar, major: 1}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			base := t.TempDir()
			sentinel := filepath.Join(base, "sentinel")
			if err := os.Mkdir(sentinel, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(sentinel, "secret"), []byte("s"), 0o644); err != nil {
				t.Fatal(err)
			}
			target := filepath.Join(base, "target")
			if err := os.Mkdir(target, 0o755); err != nil {
				t.Fatal(err)
			}
			ents := make([]ent, len(tc.ents))
			for i, e := range tc.ents {
				e.name = replaceSentinel(e.name, sentinel)
				e.link = replaceSentinel(e.link, sentinel)
				ents[i] = e
			}
			before := listTree(t, sentinel)
			_, err := tarx.Extract(t.Context(), bytes.NewReader(mkTar(t, ents)), target, tarx.Options{})
			if err == nil {
				t.Fatal("malicious tarball accepted")
			}
			if !errors.Is(err, kerrors.Invalid) {
				t.Errorf("error %v is not Invalid", err)
			}
			if after := listTree(t, sentinel); !equal(before, after) {
				t.Errorf("sentinel changed:\nbefore %v\nafter  %v", before, after)
			}
			if fi, err := os.Stat(filepath.Join(sentinel, "secret")); err != nil || fi.Sys().(*syscall.Stat_t).Nlink != 1 {
				t.Errorf("sentinel secret was linked: %v", err)
			}
		})
	}
}

func replaceSentinel(s, sentinel string) string {
	if len(s) >= 8 && s[:8] == "SENTINEL" {
		return sentinel + s[8:]
	}
	if len(s) >= 9 && s[:9] == "/SENTINEL" {
		return sentinel + s[9:]
	}
	return s
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestExtractKeepsContent(t *testing.T) {
	target := t.TempDir()
	data := mkTar(t, []ent{
		{name: "bin/", typ: tar.TypeDir, mode: 0o755},
		{name: "bin/tool", typ: tar.TypeReg, mode: 0o4755, body: "#!/bin/sh\n"},
		{name: "etc/conf", typ: tar.TypeReg, mode: 0o600, body: "a=b"},
		{name: "etc/link", typ: tar.TypeSymlink, link: "/etc/conf"},
		{name: "etc/hard", typ: tar.TypeLink, link: "etc/conf"},
		{name: "etc/conf2", typ: tar.TypeSymlink, link: "conf"},
		{name: "etc/conf2", typ: tar.TypeReg, body: "replaced"},
		{name: "run/fifo", typ: tar.TypeFifo, mode: 0o600},
		{name: "./lib/x", typ: tar.TypeReg, body: "x"},
	})
	res, err := tarx.Extract(t.Context(), bytes.NewReader(data), target, tarx.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Entries != 9 || res.Size != int64(len(data)) || len(res.Digest) != len("sha512-")+128 {
		t.Errorf("result %+v", res)
	}
	checks := []struct {
		path string
		mode os.FileMode
	}{
		{"bin/tool", 0o755 | os.ModeSetuid},
		{"etc/conf", 0o600},
		{"etc/link", os.ModeSymlink | 0o777},
		{"run/fifo", os.ModeNamedPipe | 0o600},
		{"lib/x", 0o644},
		{"etc/conf2", 0o644},
	}
	for _, c := range checks {
		fi, err := os.Lstat(filepath.Join(target, c.path))
		if err != nil {
			t.Errorf("%s: %v", c.path, err)
			continue
		}
		if fi.Mode() != c.mode {
			t.Errorf("%s: mode %v, want %v", c.path, fi.Mode(), c.mode)
		}
		if c.mode.IsRegular() && !fi.ModTime().Equal(time.Unix(1700000000, 0)) {
			t.Errorf("%s: mtime %v", c.path, fi.ModTime())
		}
	}
	if b, _ := os.ReadFile(filepath.Join(target, "etc/conf2")); string(b) != "replaced" {
		t.Errorf("conf2 = %q", b)
	}
	a, _ := os.Stat(filepath.Join(target, "etc/conf"))
	b, _ := os.Stat(filepath.Join(target, "etc/hard"))
	if !os.SameFile(a, b) {
		t.Error("hard link not kept")
	}
}

func TestExtractDevicesAllowed(t *testing.T) {
	testutil.RequireRoot(t)
	target := t.TempDir()
	data := mkTar(t, []ent{{name: "dev/null", typ: tar.TypeChar, major: 1, mode: 0o666}})
	if _, err := tarx.Extract(t.Context(), bytes.NewReader(data), target, tarx.Options{AllowDevices: true}); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Lstat(filepath.Join(target, "dev/null"))
	if err != nil || fi.Mode()&os.ModeCharDevice == 0 {
		t.Fatalf("dev/null: %v %v", fi, err)
	}
}

func TestExtractWhiteouts(t *testing.T) {
	testutil.RequireRoot(t)
	target := t.TempDir()
	data := mkTar(t, []ent{
		{name: "a/.wh.gone", typ: tar.TypeReg},
		{name: "opq/.wh..wh..opq", typ: tar.TypeReg},
		{name: "opq/new", typ: tar.TypeReg, body: "n"},
	})
	if _, err := tarx.Extract(t.Context(), bytes.NewReader(data), target, tarx.Options{Whiteouts: true}); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(target, "a/gone"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
		t.Errorf("a/gone: mode %o rdev %d, want char 0:0", st.Mode, st.Rdev)
	}
	buf := make([]byte, 8)
	n, err := unix.Lgetxattr(filepath.Join(target, "opq"), "trusted.overlay.opaque", buf)
	if err != nil || string(buf[:n]) != "y" {
		t.Errorf("opq xattr = %q, %v", buf[:n], err)
	}
	if _, err := os.Lstat(filepath.Join(target, "opq/.wh..wh..opq")); !os.IsNotExist(err) {
		t.Errorf("opaque marker extracted as a file: %v", err)
	}
}

func TestExtractPrefix(t *testing.T) {
	target := t.TempDir()
	var other []string
	data := mkTar(t, []ent{
		{name: "manifest", typ: tar.TypeReg, body: "{}"},
		{name: "rootfs/", typ: tar.TypeDir, mode: 0o755},
		{name: "rootfs/f", typ: tar.TypeReg, body: "f"},
		{name: "rootfs/h", typ: tar.TypeLink, link: "rootfs/f"},
		{name: "extra", typ: tar.TypeReg, body: "e"},
	})
	_, err := tarx.Extract(t.Context(), bytes.NewReader(data), target, tarx.Options{
		Prefix: "rootfs",
		Other:  func(h *tar.Header, _ io.Reader) error { other = append(other, h.Name); return nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(other) != 2 || other[0] != "manifest" || other[1] != "extra" {
		t.Errorf("other = %v", other)
	}
	if _, err := os.Stat(filepath.Join(target, "h")); err != nil {
		t.Error(err)
	}
	if _, err := os.Stat(filepath.Join(target, "manifest")); !os.IsNotExist(err) {
		t.Error("manifest extracted into rootfs")
	}
}

// TestExtractSizeLimit: a stream longer than MaxBytes, or an entry claiming
// more than is left of it, is refused with Invalid; a stream of exactly
// MaxBytes is taken.
func TestExtractSizeLimit(t *testing.T) {
	body := string(bytes.Repeat([]byte("x"), 4096))
	small := mkTar(t, []ent{{name: "f", typ: tar.TypeReg, body: body}})
	// A header claiming 1 TiB followed by a few bytes: refused before
	// anything is read or written.
	var huge bytes.Buffer
	tw := tar.NewWriter(&huge)
	if err := tw.WriteHeader(&tar.Header{Name: "bomb", Typeflag: tar.TypeReg, Mode: 0o644, Size: 1 << 40}); err != nil {
		t.Fatal(err)
	}
	_, _ = tw.Write([]byte("abc"))
	_ = tw.Flush() // fails (short entry); the header is out already
	for _, tc := range []struct {
		name    string
		in      []byte
		max     int64
		wantErr bool
	}{
		{"within", small, int64(len(small)), false},
		{"unbounded", small, -1, false},
		{"default", small, 0, false},
		{"stream too long", small, int64(len(small)) - 1, true},
		{"entry claims too much", small, 2048, true},
		{"claimed terabyte", huge.Bytes(), 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			_, err := tarx.Extract(t.Context(), bytes.NewReader(tc.in), dir, tarx.Options{MaxBytes: tc.max})
			if tc.wantErr {
				if !errors.Is(err, kerrors.Invalid) {
					t.Fatalf("err %v, want Invalid", err)
				}
				if tc.name == "claimed terabyte" {
					if ents, _ := os.ReadDir(dir); len(ents) != 0 {
						t.Errorf("wrote %d entries", len(ents))
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if b, err := os.ReadFile(filepath.Join(dir, "f")); err != nil || string(b) != body {
				t.Errorf("content: %v (%d bytes)", err, len(b))
			}
		})
	}
}
