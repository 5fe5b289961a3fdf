package ocibuild

import (
	"archive/tar"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

func testSpec(t *testing.T) Spec {
	t.Helper()
	src := filepath.Join(t.TempDir(), "prog")
	if err := os.WriteFile(src, []byte("#!static binary\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// A source file's own mtime and mode must not reach the image.
	if err := os.Chtimes(src, time.Now(), time.Now()); err != nil {
		t.Fatal(err)
	}
	return Spec{
		Files: []File{
			{Path: "/usr/local/bin/prog", Mode: 0o755, Source: src},
			{Path: "etc/kurma/README", Data: []byte("hello\n")},
		},
		Entrypoint: []string{"/usr/local/bin/prog"},
		Labels:     map[string]string{"a": "b"},
		Arch:       "amd64",
	}
}

func TestSameInputsSameDigest(t *testing.T) {
	spec := testSpec(t)
	a, err := Build(spec)
	if err != nil {
		t.Fatal(err)
	}
	// Same files in another order, the source touched again.
	spec.Files[0], spec.Files[1] = spec.Files[1], spec.Files[0]
	if err := os.Chtimes(spec.Files[1].Source, time.Now().Add(time.Hour), time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	b, err := Build(spec)
	if err != nil {
		t.Fatal(err)
	}
	da, _ := a.Digest()
	db, _ := b.Digest()
	if da != db {
		t.Fatalf("digests differ: %v %v", da, db)
	}
	// Written as a tarball and a layout twice, the files are the same too.
	dir := t.TempDir()
	for _, n := range []string{"1", "2"} {
		if err := WriteTarball(filepath.Join(dir, n+".tar"), "kurma.dev/test:v1", a); err != nil {
			t.Fatal(err)
		}
		if err := WriteLayout(filepath.Join(dir, n), "kurma.dev/test:v1", a); err != nil {
			t.Fatal(err)
		}
	}
	t1, _ := os.ReadFile(filepath.Join(dir, "1.tar"))
	t2, _ := os.ReadFile(filepath.Join(dir, "2.tar"))
	if string(t1) != string(t2) {
		t.Fatal("two tarballs of one image differ")
	}
	back, err := tarball.ImageFromPath(filepath.Join(dir, "1.tar"), nil)
	if err != nil {
		t.Fatal(err)
	}
	// A docker-save tarball keeps the config and layers, not the manifest.
	ca, _ := a.ConfigName()
	if c, _ := back.ConfigName(); c != ca {
		t.Fatalf("tarball reads back with config %v, want %v", c, ca)
	}
	idx, err := layout.ImageIndexFromPath(filepath.Join(dir, "2"))
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 1 || im.Manifests[0].Digest != da ||
		im.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != "kurma.dev/test:v1" {
		t.Fatalf("layout index: %+v", im.Manifests)
	}

	// A changed mode is a changed image.
	spec.Files[1].Mode = 0o700
	c, err := Build(spec)
	if err != nil {
		t.Fatal(err)
	}
	if dc, _ := c.Digest(); dc == da {
		t.Fatal("mode change kept the digest")
	}
}

func TestLayerEntries(t *testing.T) {
	spec := testSpec(t)
	img, err := Build(spec)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.OS != "linux" || cf.Architecture != "amd64" || !cf.Created.Time.Equal(Epoch) || cf.Config.Entrypoint[0] != "/usr/local/bin/prog" {
		t.Fatalf("config: %+v", cf)
	}
	ls, err := img.Layers()
	if err != nil || len(ls) != 1 {
		t.Fatalf("layers %d, %v", len(ls), err)
	}
	rc, err := ls[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	var got []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if !h.ModTime.Equal(Epoch) || h.Uid != 0 || h.Gid != 0 {
			t.Errorf("%s: mtime %v uid %d gid %d", h.Name, h.ModTime, h.Uid, h.Gid)
		}
		got = append(got, h.Name+" "+os.FileMode(h.Mode).String())
	}
	want := []string{"etc/ -rwxr-xr-x", "etc/kurma/ -rwxr-xr-x", "etc/kurma/README -rw-r--r--",
		"usr/ -rwxr-xr-x", "usr/local/ -rwxr-xr-x", "usr/local/bin/ -rwxr-xr-x", "usr/local/bin/prog -rwxr-xr-x"}
	if len(got) != len(want) {
		t.Fatalf("entries %q, want %q", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("entries %q, want %q", got, want)
		}
	}
}

func TestBadInput(t *testing.T) {
	for name, files := range map[string][]File{
		"duplicate":      {{Path: "/a", Data: nil}, {Path: "a"}},
		"file and dir":   {{Path: "/a"}, {Path: "/a/b"}},
		"empty path":     {{Path: "/"}},
		"not a perm":     {{Path: "/a", Mode: os.ModeSymlink}},
		"missing source": {{Path: "/a", Source: "/nonexistent/kurma-ocibuild"}},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := Build(Spec{Files: files, Arch: "amd64"}); err == nil {
				t.Fatal("no error")
			}
		})
	}
	if _, err := Build(Spec{}); err == nil {
		t.Fatal("no arch: no error")
	}
}
