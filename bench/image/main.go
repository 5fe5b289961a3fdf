// Command image measures the image store on a small multi-layer image (3
// layers, ~1.5 MiB uncompressed, ~200 files) served by go-containerregistry's
// in-process registry on loopback:
//
//   - cold pull: a fresh store pulls docker://127.0.0.1:PORT/bench:1 (fetch,
//     decompress, safe extraction, sha512 IDs, index write);
//   - peer: the same image fetched by go-containerregistry into an OCI
//     layout (fetch and write blobs, no extraction), in the same run;
//   - warm Resolve: the layer list of the stored image (the `kurma run` hot
//     path), and warm Pull of an already-stored reference.
//
// Prints medians; no root needed, nothing leaves loopback.
package main

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"kurma.dev/kurma/internal/image"

	"kurma.dev/kurma/bench/internal/benchutil"
)

func main() {
	runs := flag.Int("runs", 7, "cold pulls to time")
	resolves := flag.Int("resolves", 20000, "Resolve calls to time")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile here")
	flag.Parse()
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err == nil && pprof.StartCPUProfile(f) == nil {
			defer pprof.StopCPUProfile()
		}
	}
	if err := run(context.Background(), *runs, *resolves); err != nil {
		fmt.Fprintln(os.Stderr, "bench/image:", err)
		pprof.StopCPUProfile()
		os.Exit(1)
	}
}

func mkLayer(files, size int, seed string) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	data := make([]byte, size)
	for i := range files {
		_, _ = rand.Read(data[:size/2]) // half random, half zeros: compressible
		h := &tar.Header{Name: fmt.Sprintf("%s/d%d/f%d", seed, i%8, i), Mode: 0o644, Size: int64(size), Typeflag: tar.TypeReg, ModTime: time.Unix(0, 0)}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	b := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
}

func run(ctx context.Context, runs, resolves int) error {
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	var layers []v1.Layer
	for i, spec := range []struct{ files, size int }{{100, 8 << 10}, {80, 4 << 10}, {20, 16 << 10}} {
		l, err := mkLayer(spec.files, spec.size, fmt.Sprintf("l%d", i))
		if err != nil {
			return err
		}
		layers = append(layers, l)
	}
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		return err
	}
	img, err = mutate.Config(img, v1.Config{Entrypoint: []string{"/bin/app"}, Env: []string{"A=1"}})
	if err != nil {
		return err
	}
	ref, err := name.ParseReference(host + "/bench:1")
	if err != nil {
		return err
	}
	if err := remote.Write(ref, img); err != nil {
		return err
	}
	uri := "docker://" + host + "/bench:1"

	work, err := os.MkdirTemp("", "kimg-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)

	var cold, peer, naive []time.Duration
	var store *image.FSStore
	var id string
	for i := range runs {
		dir := fmt.Sprintf("%s/store%d", work, i)
		start := time.Now()
		s, err := image.Open(ctx, dir, image.Options{})
		if err != nil {
			return err
		}
		got, err := s.Pull(ctx, uri, image.PullOptions{})
		if err != nil {
			return err
		}
		cold = append(cold, time.Since(start))
		store, id = s, got.ID

		start = time.Now()
		rimg, err := remote.Image(ref, remote.WithContext(ctx))
		if err != nil {
			return err
		}
		p, err := layout.Write(fmt.Sprintf("%s/layout%d", work, i), empty.Index)
		if err != nil {
			return err
		}
		if err := p.AppendImage(rimg); err != nil {
			return err
		}
		peer = append(peer, time.Since(start))

		start = time.Now()
		if err := naiveExtract(ctx, ref, fmt.Sprintf("%s/naive%d", work, i)); err != nil {
			return err
		}
		naive = append(naive, time.Since(start))
	}

	if _, err := store.Resolve(ctx, id); err != nil {
		return err
	}
	start := time.Now()
	for range resolves {
		if _, err := store.Resolve(ctx, id); err != nil {
			return err
		}
	}
	resolve := time.Since(start) / time.Duration(resolves)
	start = time.Now()
	const warmPulls = 2000
	for range warmPulls {
		if _, err := store.Pull(ctx, uri, image.PullOptions{}); err != nil {
			return err
		}
	}
	warm := time.Since(start) / warmPulls

	fmt.Printf("image: 3-layer image, 200 files, %d cold runs\n", runs)
	fmt.Printf("  cold pull (fetch+extract+index)   median %8.2f ms\n", ms(benchutil.Median(cold)))
	fmt.Printf("  peer: ggcr fetch to OCI layout    median %8.2f ms\n", ms(benchutil.Median(peer)))
	fmt.Printf("  ratio cold pull / peer            %8.2fx\n", float64(benchutil.Median(cold))/float64(benchutil.Median(peer)))
	fmt.Printf("  peer: ggcr fetch + naive untar    median %8.2f ms\n", ms(benchutil.Median(naive)))
	fmt.Printf("  ratio cold pull / naive untar     %8.2fx\n", float64(benchutil.Median(cold))/float64(benchutil.Median(naive)))
	fmt.Printf("  warm Resolve                      %8.2f µs/op\n", float64(resolve.Nanoseconds())/1e3)
	fmt.Printf("  warm Pull (stored reference)      %8.2f µs/op\n", float64(warm.Nanoseconds())/1e3)
	return nil
}

// naiveExtract is the unsafe baseline: fetch with ggcr and write every
// layer's files with plain os calls (no root confinement, no IDs, no index).
func naiveExtract(ctx context.Context, ref name.Reference, dir string) error {
	img, err := remote.Image(ref, remote.WithContext(ctx))
	if err != nil {
		return err
	}
	ls, err := img.Layers()
	if err != nil {
		return err
	}
	for i, l := range ls {
		rc, err := l.Uncompressed()
		if err != nil {
			return err
		}
		tr := tar.NewReader(rc)
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				return err
			}
			p := filepath.Join(dir, strconv.Itoa(i), h.Name)
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				return err
			}
			f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, os.FileMode(h.Mode))
			if err != nil {
				return err
			}
			if _, err := io.Copy(f, tr); err != nil {
				f.Close()
				return err
			}
			f.Close()
			_ = os.Chtimes(p, h.ModTime, h.ModTime)
		}
		rc.Close()
	}
	return nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1e3 }
