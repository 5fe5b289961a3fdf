package tarx_test

import (
	"archive/tar"
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"kurma.dev/kurma/internal/image/tarx"
	"kurma.dev/kurma/pkg/kerrors"
)

// FuzzExtract feeds fuzzer-built tarballs to Extract and checks that nothing
// appears or changes outside the target, that a failure is a
// kerrors.Invalid error, and that whatever was extracted can be removed
// again with os.RemoveAll (what the image store does with a rejected layer).
//
// The fuzz input is a compact script (see tarFromScript), not raw tar bytes,
// for two reasons. Byte-level mutation of a tar header almost always breaks
// its checksum, so raw inputs rarely got past tar.Reader into Extract.
// Worse, every new-coverage input is minimized, and Go's minimizer tries
// O(n²) sub-slices of it: with tarballs of 1.5 KB or more and an exec that
// touches the file system (~5 ms), each minimization ran into the 60 s
// -fuzzminimizetime limit, reporting no execs meanwhile, so fuzzing looked
// stalled after a dozen execs. A script of a few dozen bytes minimizes in
// well under a second and always yields a well-formed tarball.
func FuzzExtract(f *testing.F) {
	seeds := []struct {
		script string
		aci    bool
	}{
		{"0a/b=x", false},
		{"0../x=x", false},
		{"2l=..\n0l/x=x", false},
		{"2l=/\n0l/x=x", false},
		{"1h=../outside", false},
		{"2l=..\n1h=l/outside", false},
		{"5d/\n0d/.wh.x", false},
		{"5d/\n0d/f=x\n5d/.wh..wh..opq", false},
		{"m0\n5d\n0d/f=x", false},
		{"m4755\n0a=x\n1b=a\n2a=b\n0a=y", false},
		{"6p\n2s=p\n5s/", false},
		{"xSCHILY.xattr.trusted.overlay.opaque=y\n5d", false},
		{"xSCHILY.xattr.user.k=v\n0f=x", false},
		{"3c\n4b", false},
		{"0a=x\nS\n0b=y", false},
		{"5.\n0./x=x", false},
		{"0manifest={}\n5rootfs/\n0rootfs/a/b=x\n2rootfs/l=../..\n0rootfs/l/x=x\n1rootfs/h=rootfs/a/b", true},
	}
	for _, s := range seeds {
		f.Add([]byte(s.script), s.aci)
	}
	// One base directory per fuzzing process, reused by every exec: a fresh
	// t.TempDir per exec doubles the file system work for nothing.
	base := f.TempDir()
	outside := filepath.Join(base, "outside")
	if err := os.WriteFile(outside, []byte("o"), 0o644); err != nil {
		f.Fatal(err)
	}
	target := filepath.Join(base, "target")
	f.Fuzz(func(t *testing.T, script []byte, aci bool) {
		if len(script) > maxScript {
			return // see maxScript
		}
		data := tarFromScript(script)
		_ = os.RemoveAll(target) // left over only if an earlier exec failed
		if err := os.Mkdir(target, 0o755); err != nil {
			t.Fatal(err)
		}
		// Extraction must never hang: dump the stacks and crash (so the
		// input is saved) when it takes far too long.
		watchdog := time.AfterFunc(10*time.Second, func() {
			buf := make([]byte, 1<<20)
			n := runtime.Stack(buf, true)
			_ = os.WriteFile(filepath.Join(os.TempDir(), "kfz-tarx-hang.txt"), buf[:n], 0o644)
			panic("tarx.Extract hung")
		})
		opts := tarx.Options{Whiteouts: true}
		if aci {
			opts.Prefix = "rootfs"
		}
		res, err := tarx.Extract(t.Context(), bytes.NewReader(data), target, opts)
		watchdog.Stop()
		if err != nil && !errors.Is(err, kerrors.Invalid) {
			t.Errorf("error %v is not Invalid", err)
		}
		if err == nil && res.Size != int64(len(data)) {
			t.Errorf("Size %d, input %d bytes", res.Size, len(data))
		}
		// Look outside before removing the target: a hard link from inside
		// to the outside file only shows while both exist.
		ents, err := os.ReadDir(base)
		if err != nil {
			t.Fatal(err)
		}
		if len(ents) != 2 {
			t.Fatalf("extraction wrote outside the target: %v", ents)
		}
		if b, err := os.ReadFile(outside); err != nil || string(b) != "o" {
			t.Fatalf("outside file changed: %q %v", b, err)
		}
		fi, err := os.Lstat(outside)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != 0o644 || fi.Sys().(*syscall.Stat_t).Nlink != 1 {
			t.Fatalf("outside file mode %v, links %d", fi.Mode(), fi.Sys().(*syscall.Stat_t).Nlink)
		}
		if os.Geteuid() != 0 {
			// Without root, a directory entry of mode 0 (kept by Extract)
			// blocks RemoveAll; a rootless caller must chmod first.
			makeWritable(target)
		}
		if err := os.RemoveAll(target); err != nil {
			t.Fatalf("extracted tree cannot be removed: %v", err)
		}
	})
}

// makeWritable gives the owner full access to every directory under dir
// (symbolic links are not followed).
func makeWritable(dir string) {
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			_ = os.Chmod(p, 0o700)
		}
		return nil
	})
}

// maxScript bounds the fuzz input. A dozen entries fit, which is all the
// path games Extract must survive need, and minimizing an input costs up to
// ~n²/2 execs, so larger inputs would bring the long stalls back. Returning
// early gives them no new coverage, so they are never minimized or kept.
const maxScript = 256

// tarFromScript builds a tarball from a script of one entry per line,
//
//	<typeflag><name>[=<arg>]
//
// where typeflag is the tar type byte ('0' file, '1' hard link, '2' symlink,
// '3' char device, '4' block device, '5' directory, '6' FIFO; any other byte
// is passed through, except 'S', which inserts an old-GNU sparse header
// claiming a 1 TiB file) and arg is a file's body or a link's target. Two
// pseudo-types modify the next entry: "m<octal mode>" and "x<key>=<value>"
// (a PAX record, e.g. SCHILY.xattr.*). An entry tar.Writer refuses ends the
// tarball there, unterminated, which Extract must also cope with.
func tarFromScript(script []byte) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	mode := int64(-1)
	var pax map[string]string
	for _, line := range bytes.Split(script, []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		typ, rest := line[0], line[1:]
		name, arg, _ := bytes.Cut(rest, []byte("="))
		switch typ {
		case 'm':
			m, err := strconv.ParseInt(string(rest), 8, 64)
			if err == nil {
				mode = m
			}
			continue
		case tar.TypeGNUSparse:
			// tar.Writer cannot write sparse entries: splice in the
			// header of sparse_test.go (a 1 TiB hole named "big").
			if tw.Flush() != nil {
				return buf.Bytes()
			}
			buf.Write(gnuSparse()[:512])
			continue
		case 'x':
			if pax == nil {
				pax = map[string]string{}
			}
			pax[string(name)] = string(arg)
			continue
		}
		hdr := &tar.Header{Typeflag: typ, Name: string(name), Mode: mode, PAXRecords: pax,
			ModTime: time.Unix(1700000000, 0), Uid: 1000, Gid: 1000}
		if mode < 0 {
			hdr.Mode = 0o644
			if typ == tar.TypeDir {
				hdr.Mode = 0o755
			}
		}
		var body []byte
		switch typ {
		case tar.TypeReg, tar.TypeRegA:
			body = arg
			hdr.Size = int64(len(arg))
		case tar.TypeLink, tar.TypeSymlink:
			hdr.Linkname = string(arg)
		}
		mode, pax = -1, nil
		if err := tw.WriteHeader(hdr); err != nil {
			return buf.Bytes()
		}
		if _, err := tw.Write(body); err != nil {
			return buf.Bytes()
		}
	}
	if err := tw.Close(); err != nil {
		return buf.Bytes()
	}
	return buf.Bytes()
}

// TestTarFromScript keeps the fuzz input language honest: a script must
// turn into the entries it describes.
func TestTarFromScript(t *testing.T) {
	data := tarFromScript([]byte("m700\n5d\n0d/f=body\n2l=d/f\nxSCHILY.xattr.user.k=v\n1h=d/f\n"))
	tr := tar.NewReader(bytes.NewReader(data))
	want := []struct {
		typ        byte
		name, link string
		mode, size int64
		pax        string
	}{
		{tar.TypeDir, "d", "", 0o700, 0, ""},
		{tar.TypeReg, "d/f", "", 0o644, 4, ""},
		{tar.TypeSymlink, "l", "d/f", 0o644, 0, ""},
		{tar.TypeLink, "h", "d/f", 0o644, 0, "v"},
	}
	for i, w := range want {
		hdr, err := tr.Next()
		if err != nil {
			t.Fatalf("entry %d: %v", i, err)
		}
		if hdr.Typeflag != w.typ || hdr.Name != w.name || hdr.Linkname != w.link || hdr.Mode != w.mode ||
			hdr.Size != w.size || hdr.PAXRecords["SCHILY.xattr.user.k"] != w.pax {
			t.Errorf("entry %d: %+v, want %+v", i, hdr, w)
		}
	}
	if _, err := tr.Next(); err == nil {
		t.Error("extra entry")
	}
	sparse := tarFromScript([]byte("0a=x\nS\n0b=y"))
	_, err := tarx.Extract(t.Context(), bytes.NewReader(sparse), t.TempDir(), tarx.Options{})
	if !errors.Is(err, kerrors.Invalid) || !strings.Contains(err.Error(), "sparse") {
		t.Errorf("script with a sparse entry: %v, want Invalid (sparse)", err)
	}
}
