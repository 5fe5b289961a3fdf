package image_test

import (
	"bytes"
	"compress/gzip"
	"crypto/ed25519"
	"io"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"kurma.dev/kurma/internal/image"
	"kurma.dev/kurma/internal/image/acibuild"
	"kurma.dev/kurma/internal/image/trust"
	"kurma.dev/kurma/pkg/appc"
)

func newStore(t testing.TB, opts image.Options) (*image.FSStore, string) {
	t.Helper()
	dir := t.TempDir()
	s, err := image.Open(t.Context(), dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, dir
}

type aciSpec struct {
	name  string
	files map[string]string
	deps  []appc.Dependency
	exec  []string
	gzip  bool
}

// buildACI writes an ACI into dir and returns its path and ID.
func buildACI(t testing.TB, dir string, spec aciSpec) (string, string) {
	t.Helper()
	m := appc.ImageManifest{Name: spec.name, Dependencies: spec.deps}
	if spec.exec != nil {
		m.App = &appc.App{Exec: spec.exec, User: "0", Group: "0"}
	}
	var raw bytes.Buffer
	b, err := acibuild.NewACI(&raw, m)
	if err != nil {
		t.Fatal(err)
	}
	writeFiles(t, b, spec.files)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	id, err := acibuild.ImageID(bytes.NewReader(raw.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	data := raw.Bytes()
	if spec.gzip {
		var z bytes.Buffer
		zw := gzip.NewWriter(&z)
		zw.Write(data)
		zw.Close()
		data = z.Bytes()
	}
	p := filepath.Join(dir, strings.ReplaceAll(spec.name, "/", "_")+".aci")
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return p, id
}

func writeFiles(t testing.TB, b *acibuild.Builder, files map[string]string) {
	t.Helper()
	for _, k := range sortedKeys(files) {
		if err := b.File(k, 0o644, []byte(files[k])); err != nil {
			t.Fatal(err)
		}
	}
}

func sortedKeys(m map[string]string) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	for i := range ks {
		for j := i + 1; j < len(ks); j++ {
			if ks[j] < ks[i] {
				ks[i], ks[j] = ks[j], ks[i]
			}
		}
	}
	return ks
}

// layer builds an OCI layer from files.
func layer(t testing.TB, files map[string]string) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	b := acibuild.NewLayer(&buf)
	writeFiles(t, b, files)
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

// ociImage builds an image from layers (bottom first) with a config.
func ociImage(t testing.TB, cfg v1.Config, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config = cfg
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// startRegistry runs an in-process registry on loopback.
func startRegistry(t testing.TB) string {
	t.Helper()
	srv := httptest.NewServer(registry.New(registry.Logger(discardLogger())))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

func push(t testing.TB, ref string, img v1.Image) {
	t.Helper()
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img); err != nil {
		t.Fatal(err)
	}
}

func keypair(t testing.TB) (ed25519.PrivateKey, *trust.Keyring) {
	t.Helper()
	privB, pubB, err := trust.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	priv, err := trust.ParsePrivateKey(privB)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := trust.ParsePublicKey(pubB)
	if err != nil {
		t.Fatal(err)
	}
	return priv, trust.NewKeyring(pub)
}

// storeFiles lists everything under the store's tmp/ and entries/.
func dirEntries(t testing.TB, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}
