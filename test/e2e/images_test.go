package e2e

import (
	"archive/tar"
	"bytes"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"kurma.dev/kurma/internal/image/acibuild"
	"kurma.dev/kurma/pkg/appc"
)

// busyboxApplets are the commands the test images link to busybox.
var busyboxApplets = []string{"sh", "echo", "cat", "sleep", "ls", "ps", "true", "false", "hostname", "wc", "id", "test", "grep"}

// sources are the URIs of one busybox image served four ways.
type sources struct {
	docker, ociLayout, aci, http string
}

// serveBusybox builds a busybox image from Debian's busybox-static and
// serves it from an in-process registry, an OCI layout, an ACI file and a
// loopback HTTP server. Everything is removed at cleanup.
func serveBusybox(t *testing.T) sources {
	t.Helper()
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Fatalf("needs /bin/busybox (Debian busybox-static): %v", err)
	}
	dir := t.TempDir()
	var s sources

	// ACI, served from file:// and http://.
	aciPath := filepath.Join(dir, "busybox.aci")
	f, err := os.Create(aciPath)
	must(t, err)
	b, err := acibuild.NewACI(f, appc.ImageManifest{Name: "kurma.dev/e2e/busybox", App: &appc.App{
		Exec: []string{"/bin/sh"}, User: "0", Group: "0",
		Environment: []appc.EnvVar{{Name: "PATH", Value: "/bin"}},
	}})
	must(t, err)
	must(t, b.File("bin/busybox", 0o755, bb))
	for _, a := range busyboxApplets {
		must(t, b.Symlink("bin/"+a, "busybox"))
	}
	must(t, b.Dir("tmp", 0o1777))
	must(t, b.Close())
	must(t, f.Close())
	s.aci = "file://" + aciPath
	hs := httptest.NewServer(http.FileServer(http.Dir(dir)))
	t.Cleanup(hs.Close)
	s.http = hs.URL + "/busybox.aci"

	// OCI image: one layer with the same files.
	var layerTar bytes.Buffer
	tw := tar.NewWriter(&layerTar)
	must(t, tw.WriteHeader(&tar.Header{Name: "bin/", Mode: 0o755, Typeflag: tar.TypeDir}))
	must(t, tw.WriteHeader(&tar.Header{Name: "tmp/", Mode: 0o1777, Typeflag: tar.TypeDir}))
	must(t, tw.WriteHeader(&tar.Header{Name: "bin/busybox", Mode: 0o755, Size: int64(len(bb)), Typeflag: tar.TypeReg}))
	_, err = tw.Write(bb)
	must(t, err)
	for _, a := range busyboxApplets {
		must(t, tw.WriteHeader(&tar.Header{Name: "bin/" + a, Linkname: "busybox", Mode: 0o777, Typeflag: tar.TypeSymlink}))
	}
	must(t, tw.Close())
	raw := layerTar.Bytes()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(raw)), nil })
	must(t, err)
	img, err := mutate.AppendLayers(empty.Image, layer)
	must(t, err)
	cf, err := img.ConfigFile()
	must(t, err)
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Config = v1.Config{Cmd: []string{"/bin/sh"}, Env: []string{"PATH=/bin"}}
	img, err = mutate.ConfigFile(img, cf)
	must(t, err)

	lp, err := layout.Write(filepath.Join(dir, "oci"), empty.Index)
	must(t, err)
	must(t, lp.AppendImage(img))
	s.ociLayout = "file://" + filepath.Join(dir, "oci")

	reg := httptest.NewServer(registry.New(registry.Logger(nilLogger())))
	t.Cleanup(reg.Close)
	host := strings.TrimPrefix(reg.URL, "http://")
	ref, err := name.ParseReference(host+"/e2e/busybox:latest", name.Insecure)
	must(t, err)
	must(t, remote.Write(ref, img))
	s.docker = "docker://" + host + "/e2e/busybox:latest"
	return s
}

func nilLogger() *log.Logger { return log.New(io.Discard, "", 0) }
