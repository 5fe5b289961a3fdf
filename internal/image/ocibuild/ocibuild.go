package ocibuild

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Epoch is the time every entry, the config and the history carry.
var Epoch = time.Unix(0, 0).UTC()

// File is one regular file of a layer.
type File struct {
	// Path inside the image, absolute or relative to /; parents are
	// added as directories (0755, root-owned).
	Path string
	// Mode is the permission bits (0 means 0644).
	Mode fs.FileMode
	// Source is a host file to copy; Data is used when Source is empty.
	Source string
	Data   []byte
}

// Spec is an image: its files (one layer) and its runtime config.
type Spec struct {
	Files      []File
	Entrypoint []string
	Cmd        []string
	Env        []string
	User       string
	Labels     map[string]string
	// Arch is the GOARCH of the binaries (required); OS is linux.
	Arch string
}

// Build returns the image of spec. Two calls with the same files (bytes,
// paths, modes) and config return images of the same digest.
func Build(spec Spec) (v1.Image, error) {
	if spec.Arch == "" {
		return nil, errors.New("ocibuild: no architecture")
	}
	layer, err := Layer(spec.Files)
	if err != nil {
		return nil, err
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return nil, fmt.Errorf("ocibuild: %w", err)
	}
	img = mutate.MediaType(img, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("ocibuild: %w", err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", spec.Arch
	cf.Created = v1.Time{Time: Epoch}
	cf.Config = v1.Config{Entrypoint: spec.Entrypoint, Cmd: spec.Cmd, Env: spec.Env, User: spec.User, Labels: spec.Labels}
	for i := range cf.History {
		cf.History[i].Created = v1.Time{Time: Epoch}
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("ocibuild: %w", err)
	}
	return img, nil
}

// Layer returns a gzip layer holding files and their parent directories,
// sorted by path, with fixed times and root ownership.
func Layer(files []File) (v1.Layer, error) {
	b, err := layerTar(files)
	if err != nil {
		return nil, err
	}
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(b)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("ocibuild: layer: %w", err)
	}
	return l, nil
}

// layerTar writes the uncompressed tar of files.
func layerTar(files []File) ([]byte, error) {
	byPath := map[string]File{}
	dirs := map[string]bool{}
	for _, f := range files {
		p := strings.TrimPrefix(path.Clean("/"+f.Path), "/")
		if p == "" || p == "." {
			return nil, fmt.Errorf("ocibuild: file %q: empty path", f.Path)
		}
		if _, dup := byPath[p]; dup {
			return nil, fmt.Errorf("ocibuild: %s given twice", p)
		}
		if f.Mode&^fs.ModePerm != 0 {
			return nil, fmt.Errorf("ocibuild: %s: mode %v: want permission bits only", p, f.Mode)
		}
		byPath[p] = f
		for d := path.Dir(p); d != "."; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	names := make([]string, 0, len(byPath)+len(dirs))
	for d := range dirs {
		if _, clash := byPath[d]; clash {
			return nil, fmt.Errorf("ocibuild: %s is both a file and a directory", d)
		}
		names = append(names, d)
	}
	for p := range byPath {
		names = append(names, p)
	}
	sort.Strings(names)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, n := range names {
		hdr := &tar.Header{Name: n, ModTime: Epoch, Uname: "root", Gname: "root", Format: tar.FormatPAX}
		if dirs[n] {
			hdr.Typeflag, hdr.Name, hdr.Mode = tar.TypeDir, n+"/", 0o755
			if err := tw.WriteHeader(hdr); err != nil {
				return nil, err
			}
			continue
		}
		f := byPath[n]
		data := f.Data
		if f.Source != "" {
			var err error
			if data, err = os.ReadFile(f.Source); err != nil {
				return nil, fmt.Errorf("ocibuild: %s: %w", n, err)
			}
		}
		mode := f.Mode
		if mode == 0 {
			mode = 0o644
		}
		hdr.Typeflag, hdr.Mode, hdr.Size = tar.TypeReg, int64(mode), int64(len(data))
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// WriteLayout writes img as the only image of an OCI image layout at dir
// (replacing what was there), named ref (the org.opencontainers.image.ref.name
// annotation; containerd's import uses it as the image name).
func WriteLayout(dir, ref string, img v1.Image) error {
	tag, err := name.NewTag(ref)
	if err != nil {
		return fmt.Errorf("ocibuild: %w", err)
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("ocibuild: %w", err)
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return fmt.Errorf("ocibuild: %w", err)
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": tag.String(),
		"io.containerd.image.name":          tag.String(),
	})); err != nil {
		return fmt.Errorf("ocibuild: %w", err)
	}
	return nil
}

// WriteTarball writes img as a `docker save`-style tarball tagged ref
// (what `ctr images import` and `docker load` read).
func WriteTarball(file, ref string, img v1.Image) error {
	tag, err := name.NewTag(ref)
	if err != nil {
		return fmt.Errorf("ocibuild: %w", err)
	}
	tmp := file + ".tmp"
	if err := tarball.WriteToFile(tmp, tag, img); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("ocibuild: %w", err)
	}
	if err := os.Rename(tmp, file); err != nil {
		return fmt.Errorf("ocibuild: %w", err)
	}
	return nil
}
