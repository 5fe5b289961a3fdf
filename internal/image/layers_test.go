package image_test

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"golang.org/x/sys/unix"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"kurma.dev/kurma/internal/image"
	"kurma.dev/kurma/internal/image/acibuild"
	"kurma.dev/kurma/internal/testutil"
	"kurma.dev/kurma/pkg/kerrors"
)

// rawLayer builds a layer from raw tar headers.
func rawLayer(t testing.TB, hdrs ...tar.Header) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	b := acibuild.NewLayer(&buf)
	for _, h := range hdrs {
		if err := b.Raw(h, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	data := buf.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func TestWhiteoutLayers(t *testing.T) {
	testutil.RequireRoot(t)
	reg := startRegistry(t)
	lower := layer(t, map[string]string{"a/gone": "g", "a/kept": "k", "opq/old": "o"})
	upper := rawLayer(t,
		tar.Header{Name: "a/.wh.gone", Typeflag: tar.TypeReg, Mode: 0o644},
		tar.Header{Name: "opq/", Typeflag: tar.TypeDir, Mode: 0o755},
		tar.Header{Name: "opq/.wh..wh..opq", Typeflag: tar.TypeReg, Mode: 0o644},
	)
	push(t, reg+"/wh:1", ociImage(t, v1.Config{Cmd: []string{"/x"}}, lower, upper))
	s, _ := newStore(t, image.Options{})
	img, err := s.Pull(t.Context(), "docker://"+reg+"/wh:1", image.PullOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ls, err := s.Resolve(t.Context(), img.ID)
	if err != nil || len(ls) != 2 {
		t.Fatalf("Resolve = %v, %v", ls, err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(ls[0].Path, "a/gone"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
		t.Errorf("whiteout a/gone: mode %o rdev %d", st.Mode, st.Rdev)
	}
	buf := make([]byte, 4)
	if n, err := unix.Lgetxattr(filepath.Join(ls[0].Path, "opq"), "trusted.overlay.opaque", buf); err != nil || string(buf[:n]) != "y" {
		t.Errorf("opaque xattr %q, %v", buf[:n], err)
	}
	if _, err := os.Stat(filepath.Join(ls[1].Path, "a/gone")); err != nil {
		t.Errorf("lower layer changed: %v", err)
	}
}

func TestMaliciousLayerRefused(t *testing.T) {
	reg := startRegistry(t)
	outside := t.TempDir()
	tests := []struct {
		name string
		l    v1.Layer
	}{
		{"traversal", rawLayer(t, tar.Header{Name: "../../../../../../" + outside + "/pwn", Typeflag: tar.TypeReg, Mode: 0o644})},
		{"absolute", rawLayer(t, tar.Header{Name: outside + "/pwn", Typeflag: tar.TypeReg, Mode: 0o644})},
		{"symlink write-through", rawLayer(t,
			tar.Header{Name: "l", Typeflag: tar.TypeSymlink, Linkname: outside},
			tar.Header{Name: "l/pwn", Typeflag: tar.TypeReg, Mode: 0o644})},
		{"hardlink escape", rawLayer(t, tar.Header{Name: "h", Typeflag: tar.TypeLink, Linkname: "../../../../../../../etc/passwd"})},
		{"device", rawLayer(t, tar.Header{Name: "dev/kmem", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 2, Mode: 0o600})},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			good := layer(t, map[string]string{"ok": "ok"})
			ref := reg + "/" + testutil.UniqueName("kimg") + ":1"
			push(t, ref, ociImage(t, v1.Config{Cmd: []string{"/x"}}, good, tc.l))
			s, root := newStore(t, image.Options{})
			_, err := s.Pull(t.Context(), "docker://"+ref, image.PullOptions{})
			if !errors.Is(err, kerrors.Invalid) {
				t.Fatalf("Pull = %v, want Invalid", err)
			}
			if left := dirEntries(t, outside); len(left) != 0 {
				t.Fatalf("wrote outside: %v", left)
			}
			if left := dirEntries(t, filepath.Join(root, "tmp")); len(left) != 0 {
				t.Errorf("tmp leftovers %v", left)
			}
			if list, _ := s.List(t.Context()); len(list) != 0 {
				t.Errorf("refused image listed: %v", list)
			}
			// The good layer extracted before the bad one is collected.
			if left := dirEntries(t, filepath.Join(root, "entries")); len(left) != 0 {
				t.Errorf("entries left by a refused pull: %v", left)
			}
		})
	}
}
