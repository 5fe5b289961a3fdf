package main

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"runtime"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"kurma.dev/kurma/internal/image/acibuild"
	"kurma.dev/kurma/pkg/appc"
)

func ociLayout(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("oci-layout", flag.ContinueOnError)
	var bf buildFlags
	bf.register(fs)
	out := fs.String("o", "", "output directory (or file with --tarball)")
	fromACI := fs.String("from-aci", "", "convert this ACI")
	tagStr := fs.String("tag", "", "reference name (default kurma.dev/NAME:latest)")
	asTarball := fs.Bool("tarball", false, "write a docker-save tarball instead of a layout")
	if _, err := parseFlags(fs, args); err != nil {
		return err
	}
	if *out == "" {
		return errors.New("oci-layout: -o is required")
	}
	layerFile, err := os.CreateTemp("", "kurma-acbuild-layer-")
	if err != nil {
		return fmt.Errorf("oci-layout: %w", err)
	}
	defer os.Remove(layerFile.Name())
	defer layerFile.Close()
	var m appc.ImageManifest
	if *fromACI != "" {
		if m, err = aciToLayer(*fromACI, layerFile); err != nil {
			return fmt.Errorf("oci-layout: %w", err)
		}
	} else {
		if m, err = bf.manifest(); err != nil {
			return fmt.Errorf("oci-layout: %w", err)
		}
		bld := acibuild.NewLayer(layerFile)
		if err := bf.addAll(bld); err != nil {
			return fmt.Errorf("oci-layout: %w", err)
		}
		if err := bld.Close(); err != nil {
			return err
		}
	}
	if err := layerFile.Close(); err != nil {
		return fmt.Errorf("oci-layout: %w", err)
	}
	layer, err := tarball.LayerFromFile(layerFile.Name())
	if err != nil {
		return fmt.Errorf("oci-layout: layer: %w", err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return fmt.Errorf("oci-layout: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return fmt.Errorf("oci-layout: %w", err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Config = configFromApp(m)
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return fmt.Errorf("oci-layout: %w", err)
	}
	ts := *tagStr
	if ts == "" {
		ts = "kurma.dev/" + path.Base(m.Name) + ":latest"
	}
	tag, err := name.NewTag(ts)
	if err != nil {
		return fmt.Errorf("oci-layout: --tag: %w", err)
	}
	if *asTarball {
		if err := tarball.WriteToFile(*out, tag, img); err != nil {
			return fmt.Errorf("oci-layout: %w", err)
		}
	} else {
		p, err := layout.Write(*out, empty.Index)
		if err != nil {
			return fmt.Errorf("oci-layout: %w", err)
		}
		if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{
			"org.opencontainers.image.ref.name": tag.String(),
		})); err != nil {
			return fmt.Errorf("oci-layout: %w", err)
		}
	}
	d, err := img.Digest()
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(stdout, d)
	return err
}

func configFromApp(m appc.ImageManifest) v1.Config {
	c := v1.Config{Labels: map[string]string{}}
	for _, l := range m.Labels {
		c.Labels[l.Name] = l.Value
	}
	if m.App == nil {
		return c
	}
	a := m.App
	c.Entrypoint = a.Exec
	c.WorkingDir = a.WorkingDirectory
	if a.User != "" {
		c.User = a.User + ":" + a.Group
	}
	for _, e := range a.Environment {
		c.Env = append(c.Env, e.Name+"="+e.Value)
	}
	for _, p := range a.Ports {
		if c.ExposedPorts == nil {
			c.ExposedPorts = map[string]struct{}{}
		}
		c.ExposedPorts[fmt.Sprintf("%d/%s", p.Port, p.Protocol)] = struct{}{}
	}
	return c
}

// aciToLayer copies an ACI's rootfs/ entries (prefix stripped) into w and
// returns its manifest.
func aciToLayer(aci string, w io.Writer) (appc.ImageManifest, error) {
	var m appc.ImageManifest
	f, err := os.Open(aci)
	if err != nil {
		return m, err
	}
	defer f.Close()
	br := bufio.NewReader(f)
	var r io.Reader = br
	if mg, _ := br.Peek(2); len(mg) == 2 && mg[0] == 0x1f && mg[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return m, err
		}
		r = zr
	}
	tr := tar.NewReader(r)
	tw := tar.NewWriter(w)
	found := false
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return m, fmt.Errorf("read ACI: %w", err)
		}
		n := strings.TrimPrefix(h.Name, "./")
		if n == "manifest" {
			if err := json.NewDecoder(io.LimitReader(tr, 1<<20)).Decode(&m); err != nil {
				return m, fmt.Errorf("ACI manifest: %w", err)
			}
			found = true
			continue
		}
		rest, ok := strings.CutPrefix(n, "rootfs/")
		if !ok || rest == "" {
			continue
		}
		h.Name = rest
		if h.Typeflag == tar.TypeLink {
			h.Linkname = strings.TrimPrefix(strings.TrimPrefix(h.Linkname, "./"), "rootfs/")
		}
		if err := tw.WriteHeader(h); err != nil {
			return m, err
		}
		if _, err := io.Copy(tw, tr); err != nil {
			return m, err
		}
	}
	if !found {
		return m, errors.New("ACI has no manifest")
	}
	return m, tw.Close()
}
