package image_test

import (
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"kurma.dev/kurma/internal/image"
	"kurma.dev/kurma/internal/image/acibuild"
	"kurma.dev/kurma/pkg/appc"
	"kurma.dev/kurma/pkg/kerrors"
)

func TestPullACI(t *testing.T) {
	for _, gz := range []bool{false, true} {
		t.Run(fmt.Sprintf("gzip=%v", gz), func(t *testing.T) {
			s, root := newStore(t, image.Options{})
			src := t.TempDir()
			p, wantID := buildACI(t, src, aciSpec{name: "kurma.dev/hello", files: map[string]string{"etc/hello": "hi"}, exec: []string{"/bin/hello"}, gzip: gz})
			var progress []image.Progress
			img, err := s.Pull(t.Context(), "file://"+p, image.PullOptions{Progress: func(p image.Progress) { progress = append(progress, p) }})
			if err != nil {
				t.Fatal(err)
			}
			if img.ID != wantID || img.Name != "kurma.dev/hello" || !img.HasRootfs || img.Manifest.App == nil {
				t.Fatalf("image %+v, want ID %s", img, wantID)
			}
			if len(progress) < 2 || progress[len(progress)-1].Status != "done" {
				t.Errorf("progress %+v", progress)
			}
			for _, key := range []string{img.ID, "file://" + p, p, "kurma.dev/hello", img.ID[:20], img.ID[7:20]} {
				got, err := s.Get(t.Context(), key)
				if err != nil || got.ID != img.ID {
					t.Errorf("Get(%q) = %v, %v", key, got, err)
				}
			}
			layers, err := s.Resolve(t.Context(), img.ID)
			if err != nil || len(layers) != 1 {
				t.Fatalf("Resolve = %v, %v", layers, err)
			}
			if b, err := os.ReadFile(filepath.Join(layers[0].Path, "etc/hello")); err != nil || string(b) != "hi" {
				t.Errorf("rootfs file = %q, %v", b, err)
			}
			if filepath.Base(filepath.Dir(layers[0].Path)) != img.ID {
				t.Errorf("layer path %s not named by ID", layers[0].Path)
			}
			if _, err := os.Stat(filepath.Join(root, "entries", img.ID, "manifest")); err != nil {
				t.Error(err)
			}
			again, err := s.Pull(t.Context(), "file://"+p, image.PullOptions{})
			if err != nil || again.ID != img.ID {
				t.Errorf("second pull = %v, %v", again, err)
			}
			list, _ := s.List(t.Context())
			if len(list) != 1 {
				t.Errorf("List = %d images", len(list))
			}
			if left := dirEntries(t, filepath.Join(root, "tmp")); len(left) != 0 {
				t.Errorf("tmp leftovers %v", left)
			}
		})
	}
}

// TestPullSizeLimit: an image whose tar stream passes MaxLayerBytes is
// refused with Invalid and leaves nothing in the store; within the limit
// it is pulled.
func TestPullSizeLimit(t *testing.T) {
	src := t.TempDir()
	p, _ := buildACI(t, src, aciSpec{name: "kurma.dev/big", files: map[string]string{"big": strings.Repeat("x", 64<<10)}, exec: []string{"/big"}})
	for _, tc := range []struct {
		name    string
		max     int64
		wantErr bool
	}{{"over", 16 << 10, true}, {"within", 1 << 20, false}} {
		t.Run(tc.name, func(t *testing.T) {
			s, root := newStore(t, image.Options{MaxLayerBytes: tc.max})
			_, err := s.Pull(t.Context(), "file://"+p, image.PullOptions{})
			if !tc.wantErr {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, kerrors.Invalid) || !strings.Contains(err.Error(), "limit") {
				t.Fatalf("pull: %v, want Invalid naming the limit", err)
			}
			if left := dirEntries(t, filepath.Join(root, "entries")); len(left) != 0 {
				t.Errorf("entries left: %v", left)
			}
			if left := dirEntries(t, filepath.Join(root, "tmp")); len(left) != 0 {
				t.Errorf("tmp leftovers %v", left)
			}
		})
	}
}

func TestPullErrors(t *testing.T) {
	s, root := newStore(t, image.Options{})
	dir := t.TempDir()
	junk := filepath.Join(dir, "junk.tar")
	os.WriteFile(junk, []byte("this is not a tarball at all"), 0o644)
	tests := []struct {
		uri string
		cat error
	}{
		{"ftp://x/y", kerrors.Invalid},
		{"file://relative/path", kerrors.Invalid},
		{"docker://UPPER/Case:bad tag", kerrors.Invalid},
		{"file://" + filepath.Join(dir, "missing.aci"), kerrors.NotFound},
		{"file://" + junk, kerrors.Invalid},
		{"file://" + dir, kerrors.Invalid},
	}
	for _, tc := range tests {
		t.Run(tc.uri, func(t *testing.T) {
			_, err := s.Pull(t.Context(), tc.uri, image.PullOptions{})
			if !errors.Is(err, tc.cat) {
				t.Fatalf("Pull(%q) = %v, want %v", tc.uri, err, tc.cat)
			}
		})
	}
	if left := dirEntries(t, filepath.Join(root, "entries")); len(left) != 0 {
		t.Errorf("entries after failed pulls: %v", left)
	}
}

func TestACIDependencies(t *testing.T) {
	s, _ := newStore(t, image.Options{})
	src := t.TempDir()
	baseP, baseID := buildACI(t, src, aciSpec{name: "kurma.dev/base", files: map[string]string{"base": "b"}})
	childSpec := aciSpec{name: "kurma.dev/child", files: map[string]string{"child": "c"},
		deps: []appc.Dependency{{ImageName: "kurma.dev/base", ImageID: baseID}}}
	childP, _ := buildACI(t, src, childSpec)
	byNameP, _ := buildACI(t, src, aciSpec{name: "kurma.dev/byname", deps: []appc.Dependency{{ImageName: "kurma.dev/base"}}})

	if _, err := s.Pull(t.Context(), childP, image.PullOptions{}); !errors.Is(err, kerrors.NotFound) {
		t.Fatalf("child without base: %v, want NotFound", err)
	}
	if _, err := s.Pull(t.Context(), baseP, image.PullOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{childP, byNameP} {
		img, err := s.Pull(t.Context(), p, image.PullOptions{})
		if err != nil {
			t.Fatal(err)
		}
		layers, err := s.Resolve(t.Context(), img.ID)
		if err != nil {
			t.Fatal(err)
		}
		if len(layers) != 2 || layers[0].ID != img.ID || layers[1].ID != baseID {
			t.Errorf("%s: layer order %v", p, layerIDs(layers))
		}
	}
	if err := s.Remove(t.Context(), "kurma.dev/base"); !errors.Is(err, kerrors.Conflict) {
		t.Errorf("remove of a dependency: %v, want Conflict", err)
	}
}

func layerIDs(ls []image.Layer) []string {
	var out []string
	for _, l := range ls {
		out = append(out, l.ID[:16])
	}
	return out
}

func TestPullOCIFiles(t *testing.T) {
	l1 := layer(t, map[string]string{"bin/a": "a", "etc/os": "base"})
	l2 := layer(t, map[string]string{"etc/os": "top"})
	img := ociImage(t, v1.Config{Entrypoint: []string{"/bin/a"}, Cmd: []string{"-x"}, Env: []string{"A=1"}, User: "1000:1001",
		WorkingDir: "/w", ExposedPorts: map[string]struct{}{"80/tcp": {}}}, l1, l2)
	dir := t.TempDir()
	lay := filepath.Join(dir, "layout")
	p, err := layout.Write(lay, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": "kurma.dev/app:1.0"})); err != nil {
		t.Fatal(err)
	}
	tb := filepath.Join(dir, "save.tar")
	if err := tarball.WriteToFile(tb, name.MustParseReference("kurma.dev/app:2.0").(name.Tag), img); err != nil {
		t.Fatal(err)
	}
	// The same layout as an (OCI archive) tarball, gzipped.
	ociTar := filepath.Join(dir, "layout.tar.gz")
	f, err := os.Create(ociTar)
	if err != nil {
		t.Fatal(err)
	}
	zw := gzip.NewWriter(f)
	ab := acibuild.NewLayer(zw)
	if err := ab.Add(lay, "/"); err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(ab.Close(), zw.Close(), f.Close()); err != nil {
		t.Fatal(err)
	}
	tbz := filepath.Join(dir, "save.tar.gz")
	raw, err := os.ReadFile(tb)
	if err != nil {
		t.Fatal(err)
	}
	var zb bytes.Buffer
	zw2 := gzip.NewWriter(&zb)
	zw2.Write(raw)
	zw2.Close()
	if err := os.WriteFile(tbz, zb.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, uri, version string }{
		{"layout", "file://" + lay, "1.0"},
		{"docker-save gzip", "file://" + tbz, "2.0"},
		{"docker-save", "file://" + tb, "2.0"},
		{"oci-archive", "file://" + ociTar, "1.0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := newStore(t, image.Options{})
			got, err := s.Pull(t.Context(), tc.uri, image.PullOptions{})
			if err != nil {
				t.Fatal(err)
			}
			checkOCIApp(t, s, got, tc.version)
		})
	}
}

func checkOCIApp(t *testing.T, s *image.FSStore, got *image.Image, version string) {
	t.Helper()
	m := got.Manifest
	if got.HasRootfs || m.App == nil || !slices.Equal(m.App.Exec, []string{"/bin/a", "-x"}) || m.App.User != "1000" || m.App.Group != "1001" ||
		m.App.WorkingDirectory != "/w" || len(m.App.Ports) != 1 || m.App.Ports[0].Port != 80 || len(m.App.Environment) != 1 {
		t.Errorf("converted manifest %+v app %+v", m, m.App)
	}
	if v, _ := m.Label("version"); v != version {
		t.Errorf("version label %q, want %q", v, version)
	}
	layers, err := s.Resolve(t.Context(), got.ID)
	if err != nil || len(layers) != 2 {
		t.Fatalf("Resolve = %v, %v", layers, err)
	}
	if b, _ := os.ReadFile(filepath.Join(layers[0].Path, "etc/os")); string(b) != "top" {
		t.Errorf("top layer etc/os = %q", b)
	}
	if b, _ := os.ReadFile(filepath.Join(layers[1].Path, "bin/a")); string(b) != "a" {
		t.Errorf("bottom layer bin/a = %q", b)
	}
	if len(m.Dependencies) != 2 || m.Dependencies[0].ImageID != layers[0].ID {
		t.Errorf("dependencies %+v", m.Dependencies)
	}
}

func TestPullRegistry(t *testing.T) {
	reg := startRegistry(t)
	base := layer(t, map[string]string{"bin/a": "a", "etc/os": "base"})
	top := layer(t, map[string]string{"etc/os": "top"})
	other := layer(t, map[string]string{"srv/x": "x"})
	cfg := v1.Config{Entrypoint: []string{"/bin/a"}, Cmd: []string{"-x"}, Env: []string{"A=1"}, User: "1000:1001",
		WorkingDir: "/w", ExposedPorts: map[string]struct{}{"80/tcp": {}}}
	push(t, reg+"/app:1.0", ociImage(t, cfg, base, top))
	push(t, reg+"/other:latest", ociImage(t, v1.Config{Cmd: []string{"/srv/x"}}, base, other))
	push(t, reg+"/single:v", ociImage(t, v1.Config{Cmd: []string{"/srv/x"}}, other))

	t.Run("multi-layer", func(t *testing.T) {
		s, _ := newStore(t, image.Options{})
		var n int
		got, err := s.Pull(t.Context(), "docker://"+reg+"/app:1.0", image.PullOptions{Progress: func(image.Progress) { n++ }})
		if err != nil {
			t.Fatal(err)
		}
		checkOCIApp(t, s, got, "1.0")
		if n < 3 {
			t.Errorf("only %d progress reports", n)
		}
		if _, err := s.Get(t.Context(), "docker://"+reg+"/app:1.0"); err != nil {
			t.Error(err)
		}
	})
	t.Run("by digest", func(t *testing.T) {
		s, _ := newStore(t, image.Options{})
		d, _ := ociImage(t, v1.Config{Cmd: []string{"/srv/x"}}, other).Digest()
		if _, err := s.Pull(t.Context(), "docker://"+reg+"/single@"+d.String(), image.PullOptions{}); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("missing", func(t *testing.T) {
		s, _ := newStore(t, image.Options{})
		if _, err := s.Pull(t.Context(), "docker://"+reg+"/nope:1", image.PullOptions{}); !errors.Is(err, kerrors.NotFound) {
			t.Fatalf("missing image: %v, want NotFound", err)
		}
	})
	t.Run("shared layer dedup and concurrent pulls", func(t *testing.T) {
		s, root := newStore(t, image.Options{})
		var wg sync.WaitGroup
		errs := make(chan error, 20)
		for i := range 20 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				uri := []string{"docker://" + reg + "/app:1.0", "docker://" + reg + "/other:latest", "docker://" + reg + "/single:v"}[i%3]
				if _, err := s.Pull(t.Context(), uri, image.PullOptions{}); err != nil {
					errs <- err
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		// 3 app images + 3 distinct layers.
		if ents := dirEntries(t, filepath.Join(root, "entries")); len(ents) != 6 {
			t.Errorf("%d entries, want 6: %v", len(ents), ents)
		}
		if left := dirEntries(t, filepath.Join(root, "tmp")); len(left) != 0 {
			t.Errorf("tmp leftovers %v", left)
		}
		list, _ := s.List(t.Context())
		if len(list) != 3 {
			t.Errorf("List = %d", len(list))
		}
	})
}

func TestPullHTTP(t *testing.T) {
	src := t.TempDir()
	p, id := buildACI(t, src, aciSpec{name: "kurma.dev/web", files: map[string]string{"f": "1"}, gzip: true})
	mux := http.FileServer(http.Dir(src))
	for _, tc := range []struct {
		name string
		srv  *httptest.Server
	}{
		{"http", httptest.NewServer(mux)},
		{"https", httptest.NewTLSServer(mux)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Cleanup(tc.srv.Close)
			s, _ := newStore(t, image.Options{HTTPClient: tc.srv.Client()})
			img, err := s.Pull(t.Context(), tc.srv.URL+"/"+filepath.Base(p), image.PullOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if img.ID != id {
				t.Errorf("ID %s, want %s", img.ID, id)
			}
			if _, err := s.Pull(t.Context(), tc.srv.URL+"/missing.aci", image.PullOptions{}); !errors.Is(err, kerrors.NotFound) {
				t.Errorf("missing: %v", err)
			}
		})
	}
}

// Two pulls of the same ACI by different URIs at once: both succeed, one
// entry is stored, both references point at it.
func TestConcurrentSameACI(t *testing.T) {
	src := t.TempDir()
	p, id := buildACI(t, src, aciSpec{name: "kurma.dev/same", files: map[string]string{"a": "a", "b/c": "c"}})
	srv := httptest.NewServer(http.FileServer(http.Dir(src)))
	t.Cleanup(srv.Close)
	s, root := newStore(t, image.Options{})
	uris := []string{"file://" + p, srv.URL + "/" + filepath.Base(p), p}
	var wg sync.WaitGroup
	errs := make(chan error, 12)
	for i := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			img, err := s.Pull(t.Context(), uris[i%len(uris)], image.PullOptions{})
			if err == nil && img.ID != id {
				err = fmt.Errorf("ID %s, want %s", img.ID, id)
			}
			if err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if ents := dirEntries(t, filepath.Join(root, "entries")); len(ents) != 1 {
		t.Errorf("entries %v", ents)
	}
	img, err := s.Get(t.Context(), id)
	if err != nil || len(img.Refs) != 2 {
		t.Errorf("refs %v, %v", img.Refs, err)
	}
	if left := dirEntries(t, filepath.Join(root, "tmp")); len(left) != 0 {
		t.Errorf("tmp leftovers %v", left)
	}
}
