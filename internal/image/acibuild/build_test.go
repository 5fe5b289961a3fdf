package acibuild_test

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"kurma.dev/kurma/internal/image/acibuild"
	"kurma.dev/kurma/pkg/appc"
	"kurma.dev/kurma/pkg/kerrors"
)

func names(t *testing.T, data []byte) []string {
	t.Helper()
	var out []string
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, h.Name)
	}
}

func TestBuildACI(t *testing.T) {
	src := t.TempDir()
	os.MkdirAll(filepath.Join(src, "b", "c"), 0o755)
	os.WriteFile(filepath.Join(src, "b", "c", "f"), []byte("f"), 0o644)
	os.WriteFile(filepath.Join(src, "a"), []byte("a"), 0o644)
	build := func() []byte {
		var buf bytes.Buffer
		b, err := acibuild.NewACI(&buf, appc.ImageManifest{Name: "kurma.dev/t"})
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Add(src, "/"); err != nil {
			t.Fatal(err)
		}
		if err := b.File("etc/x/y", 0o600, []byte("y")); err != nil {
			t.Fatal(err)
		}
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
		return buf.Bytes()
	}
	one, two := build(), build()
	id1, _ := acibuild.ImageID(bytes.NewReader(one))
	id2, _ := acibuild.ImageID(bytes.NewReader(two))
	if id1 != id2 || !appc.ValidImageID(id1) {
		t.Errorf("IDs %s, %s", id1, id2)
	}
	want := []string{"manifest", "rootfs/", "rootfs/a", "rootfs/b/", "rootfs/b/c/", "rootfs/b/c/f", "rootfs/etc/", "rootfs/etc/x/", "rootfs/etc/x/y"}
	got := names(t, one)
	if len(got) != len(want) {
		t.Fatalf("entries %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("entry %d = %q, want %q", i, got[i], want[i])
		}
	}
}

func TestBuildRefuses(t *testing.T) {
	var buf bytes.Buffer
	if _, err := acibuild.NewACI(&buf, appc.ImageManifest{}); !errors.Is(err, kerrors.Invalid) {
		t.Errorf("manifest without name: %v", err)
	}
	b := acibuild.NewLayer(&buf)
	for _, dst := range []string{"../x", "a/../../x", "/"} {
		if err := b.File(dst, 0o644, nil); !errors.Is(err, kerrors.Invalid) {
			t.Errorf("File(%q) = %v", dst, err)
		}
	}
}
