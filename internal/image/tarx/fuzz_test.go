package tarx_test

import (
	"archive/tar"
	"bytes"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"kurma.dev/kurma/internal/image/tarx"
)

// FuzzExtract feeds arbitrary tarballs to Extract and checks that nothing
// appears outside the target, whatever happens inside it.
func FuzzExtract(f *testing.F) {
	f.Add(mkTar(f, []ent{{name: "a/b", typ: tar.TypeReg, body: "x"}}), false)
	f.Add(mkTar(f, []ent{{name: "../x", typ: tar.TypeReg, body: "x"}}), false)
	f.Add(mkTar(f, []ent{{name: "l", typ: tar.TypeSymlink, link: ".."}, {name: "l/x", typ: tar.TypeReg, body: "x"}}), false)
	f.Add(mkTar(f, []ent{{name: "l", typ: tar.TypeSymlink, link: "/"}, {name: "l/x", typ: tar.TypeReg, body: "x"}}), false)
	f.Add(mkTar(f, []ent{{name: "h", typ: tar.TypeLink, link: "../outside"}}), false)
	f.Add(mkTar(f, []ent{{name: "d/", typ: tar.TypeDir}, {name: "d/.wh.x", typ: tar.TypeReg}}), false)
	f.Add([]byte("not a tar"), false)
	f.Add(mkTar(f, []ent{{name: "manifest", typ: tar.TypeReg, body: "{}"}, {name: "rootfs/", typ: tar.TypeDir}, {name: "rootfs/a/b", typ: tar.TypeReg, body: "x"},
		{name: "rootfs/l", typ: tar.TypeSymlink, link: "../.."}, {name: "rootfs/l/x", typ: tar.TypeReg, body: "x"}, {name: "rootfs/h", typ: tar.TypeLink, link: "rootfs/a/b"}}), true)
	f.Fuzz(func(t *testing.T, data []byte, aci bool) {
		base := t.TempDir()
		if err := os.WriteFile(filepath.Join(base, "outside"), []byte("o"), 0o644); err != nil {
			t.Fatal(err)
		}
		target := filepath.Join(base, "target")
		if err := os.Mkdir(target, 0o755); err != nil {
			t.Fatal(err)
		}
		// Extraction must never hang: dump the stacks and crash (so the
		// input is saved) when it takes far too long.
		watchdog := time.AfterFunc(10*time.Second, func() {
			buf := make([]byte, 1<<20)
			n := runtime.Stack(buf, true)
			_ = os.WriteFile(filepath.Join(os.TempDir(), "kimg-fuzz-hang.txt"), buf[:n], 0o644)
			panic("tarx.Extract hung")
		})
		opts := tarx.Options{Whiteouts: true}
		if aci {
			opts.Prefix = "rootfs"
		}
		_, _ = tarx.Extract(t.Context(), bytes.NewReader(data), target, opts)
		watchdog.Stop()
		ents, err := os.ReadDir(base)
		if err != nil {
			t.Fatal(err)
		}
		if len(ents) != 2 {
			t.Fatalf("extraction wrote outside the target: %v", ents)
		}
		if b, err := os.ReadFile(filepath.Join(base, "outside")); err != nil || string(b) != "o" {
			t.Fatalf("outside file changed: %q %v", b, err)
		}
		fi, _ := os.Stat(filepath.Join(base, "outside"))
		if fi.Mode().Perm() != 0o644 {
			t.Fatalf("outside mode changed: %v", fi.Mode())
		}
	})
}
