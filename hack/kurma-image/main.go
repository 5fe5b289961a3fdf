package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"

	"kurma.dev/kurma/internal/image/ocibuild"
)

// Programs is what the image holds, each at /usr/local/bin/<name>. The
// agent installs kurma-k8s from next to itself onto the node.
var Programs = []string{"kurma-agent", "kurma-k8s-watcher", "kurma-controller", "kurma-k8s"}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "kurma-image:", err)
		os.Exit(1)
	}
}

func run() error {
	bins := flag.String("bin", "", "folder holding the static binaries "+fmt.Sprint(Programs))
	ref := flag.String("tag", "kurma.dev/kurma:latest", "image name and tag")
	layoutDir := flag.String("layout", "", "write an OCI image layout into this folder (replaced)")
	tarFile := flag.String("tarball", "", "write a docker-save tarball to this file")
	arch := flag.String("arch", runtime.GOARCH, "GOARCH the binaries were built for")
	nft := flag.String("nft", "", "the host's nft program, added at /usr/sbin/nft with the shared libraries ldd lists (the agent's nftables library runs it)")
	flag.Parse()
	if *bins == "" || (*layoutDir == "" && *tarFile == "") {
		return errors.New("want --bin and at least one of --layout, --tarball")
	}
	spec := ocibuild.Spec{Arch: *arch, Env: []string{"PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, Labels: map[string]string{
		"org.opencontainers.image.title":  "kurma",
		"org.opencontainers.image.source": "https://kurma.dev",
	}}
	for _, p := range Programs {
		spec.Files = append(spec.Files, ocibuild.File{Path: "/usr/local/bin/" + p, Mode: 0o755, Source: filepath.Join(*bins, p)})
	}
	if *nft != "" {
		files, err := withLibraries(*nft, "/usr/sbin/nft")
		if err != nil {
			return err
		}
		spec.Files = append(spec.Files, files...)
	}
	img, err := ocibuild.Build(spec)
	if err != nil {
		return err
	}
	if *layoutDir != "" {
		if err := ocibuild.WriteLayout(*layoutDir, *ref, img); err != nil {
			return err
		}
	}
	if *tarFile != "" {
		if err := ocibuild.WriteTarball(*tarFile, *ref, img); err != nil {
			return err
		}
	}
	d, err := img.Digest()
	if err != nil {
		return err
	}
	layers, err := img.Layers()
	if err != nil {
		return err
	}
	var packed, unpacked int64
	for _, l := range layers {
		s, err := l.Size()
		if err != nil {
			return err
		}
		packed += s
		rc, err := l.Uncompressed()
		if err != nil {
			return err
		}
		n, err := countBytes(rc)
		if err != nil {
			return err
		}
		unpacked += n
	}
	fmt.Printf("%s %s compressed %.1f MiB, unpacked %.1f MiB\n", *ref, d, float64(packed)/(1<<20), float64(unpacked)/(1<<20))
	return nil
}
