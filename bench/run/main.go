// Command run benchmarks `kurma run --rm IMAGE true` against `podman run
// --rm` of the same image in the same run, and prints both medians and their
// ratio (goal: kurma ≤ 0.1× podman).
//
// It starts its own kurmad (temporary state directories and socket, the
// stager image and key of the bin dir), pulls bin/images/busybox.aci, and
// imports the same root filesystem into a private podman store
// (`podman import`, temporary --root/--runroot). podman and runc come from
// Debian, configured by podman-setup.sh (runc, cgroupfs, default_ulimits)
// through $CONTAINERS_CONF, so /etc/containers is never touched. Both run
// without a network (kurma --net none, podman --network none) so neither
// pays for networking.
// The runs alternate kurma/podman so that load on the shared machine hits
// both alike. Needs root.
//
//	go run ./bench/run [-n 30]    (KURMA_BIN_DIR: the bin dir, default ./bin)
package main

import (
	"archive/tar"
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"kurma.dev/kurma/bench/internal/benchutil"
)

func main() {
	n := flag.Int("n", 30, "runs of each")
	flag.Parse()
	if err := run(*n); err != nil {
		fmt.Fprintln(os.Stderr, "bench/run:", err)
		os.Exit(1)
	}
}

func run(n int) (retErr error) {
	if os.Geteuid() != 0 {
		return errors.New("needs root")
	}
	bin := os.Getenv("KURMA_BIN_DIR")
	if bin == "" {
		bin = "bin"
	}
	bin, err := filepath.Abs(bin)
	if err != nil {
		return err
	}
	aci := filepath.Join(bin, "images", "busybox.aci")
	for _, f := range []string{"kurmad", "kurma", "images/kurma-stager.aci", "keys/stager.pub", "images/busybox.aci"} {
		if _, err := os.Stat(filepath.Join(bin, f)); err != nil {
			return fmt.Errorf("%s missing in %s (make build): %w", f, bin, err)
		}
	}
	work, err := os.MkdirTemp("/var/tmp", "kapi-bench-")
	if err != nil {
		return err
	}
	defer func() {
		unmountUnder(work)
		if err := os.RemoveAll(work); err != nil && retErr == nil {
			retErr = err
		}
	}()

	// kurmad on private state.
	sock := filepath.Join(work, "kurma.sock")
	cfg := filepath.Join(work, "kurmad.yaml")
	conf := fmt.Sprintf("podsDir: %[1]s/pods\nimagesDir: %[1]s/images\nvolumesDir: %[1]s/volumes\nsocket: %[2]s\nstagerImage: file://%[3]s/images/kurma-stager.aci\ntrustedKeys: [%[3]s/keys/stager.pub]\n", work, sock, bin)
	if err := os.WriteFile(cfg, []byte(conf), 0o644); err != nil {
		return err
	}
	logf, err := os.Create(filepath.Join(work, "kurmad.log"))
	if err != nil {
		return err
	}
	defer logf.Close()
	kd := exec.Command(filepath.Join(bin, "kurmad"), "--config", cfg, "--log-level", "debug")
	kd.Stdout, kd.Stderr = logf, logf
	if err := kd.Start(); err != nil {
		return err
	}
	defer func() {
		_ = kd.Process.Signal(syscall.SIGTERM)
		_ = kd.Wait()
	}()
	kurma := func(args ...string) *exec.Cmd {
		return exec.Command(filepath.Join(bin, "kurma"), append([]string{"--socket", sock}, args...)...)
	}
	if err := waitFor(10*time.Second, func() error { return kurma("version").Run() }); err != nil {
		return fmt.Errorf("kurmad did not start: %w", err)
	}
	kImage := "file://" + aci
	if out, err := kurma("image", "pull", kImage).CombinedOutput(); err != nil {
		return fmt.Errorf("kurma image pull: %v\n%s", err, out)
	}

	// podman on a private store, same root filesystem.
	setup := filepath.Join(filepath.Dir(sourceDir()), "run", "podman-setup.sh")
	if _, err := os.Stat(setup); err != nil {
		setup = "bench/run/podman-setup.sh"
	}
	pconf := filepath.Join(work, "containers.conf")
	so, err := exec.Command(setup, pconf).CombinedOutput()
	if err != nil {
		return fmt.Errorf("podman setup: %v\n%s", err, so)
	}
	fmt.Print(lastLine(so))
	podman := func(args ...string) *exec.Cmd {
		c := exec.Command("podman", append([]string{"--root", filepath.Join(work, "podman-root"),
			"--runroot", filepath.Join(work, "podman-run"), "--storage-driver", "overlay"}, args...)...)
		c.Env = append(os.Environ(), "CONTAINERS_CONF="+pconf)
		return c
	}
	rootfsTar := filepath.Join(work, "rootfs.tar")
	if err := aciRootfsTar(aci, rootfsTar); err != nil {
		return err
	}
	const pImage = "localhost/kurma-bench/busybox:latest"
	if o, err := podman("import", rootfsTar, pImage).CombinedOutput(); err != nil {
		return fmt.Errorf("podman import: %v\n%s", err, o)
	}
	defer func() { _ = podman("rmi", "-a", "-f").Run() }()

	kRun := func() error {
		// --net none: like podman's --network none, now that kurmad attaches
		// pods to its default network.
		if o, err := kurma("run", "--rm", "--net", "none", kImage, "true").CombinedOutput(); err != nil {
			return fmt.Errorf("kurma run: %v\n%s", err, o)
		}
		return nil
	}
	pRun := func() error {
		if o, err := podman("run", "--rm", "--network", "none", pImage, "/bin/true").CombinedOutput(); err != nil {
			return fmt.Errorf("podman run: %v\n%s", err, o)
		}
		return nil
	}
	// Warm up both (first-run costs: stager extraction, podman's storage).
	for _, f := range []func() error{kRun, pRun, kRun, pRun} {
		if err := f(); err != nil {
			return err
		}
	}
	var kt, pt []time.Duration
	for i := 0; i < n; i++ {
		for _, c := range []struct {
			f func() error
			d *[]time.Duration
		}{{kRun, &kt}, {pRun, &pt}} {
			start := time.Now()
			if err := c.f(); err != nil {
				return err
			}
			*c.d = append(*c.d, time.Since(start))
		}
	}
	km, pm := benchutil.Median(kt), benchutil.Median(pt)
	fmt.Printf("run --rm IMAGE true, %d runs each (busybox, same rootfs; no network)\n", n)
	fmt.Printf("  kurma  median %8.1f ms   min %8.1f ms   max %8.1f ms\n", benchutil.Ms(km), benchutil.Ms(slices.Min(kt)), benchutil.Ms(slices.Max(kt)))
	fmt.Printf("  podman median %8.1f ms   min %8.1f ms   max %8.1f ms\n", benchutil.Ms(pm), benchutil.Ms(slices.Min(pt)), benchutil.Ms(slices.Max(pt)))
	fmt.Printf("  ratio kurma/podman = %.3f (goal <= 0.1)\n", float64(km)/float64(pm))
	if b, err := phases(filepath.Join(work, "kurmad.log"), n); err == nil {
		fmt.Print(b)
	}
	return nil
}

// phases summarises the daemon's "run timings" debug lines of the last n
// runs: the median time spent creating the pod, following its app to its
// exit code, and removing it.
func phases(logPath string, n int) (string, error) {
	data, err := os.ReadFile(logPath)
	if err != nil {
		return "", err
	}
	got := map[string][]time.Duration{}
	for _, l := range strings.Split(string(data), "\n") {
		if !strings.Contains(l, `msg="run timings"`) {
			continue
		}
		for _, f := range strings.Fields(l) {
			k, v, ok := strings.Cut(f, "=")
			if !ok || (k != "create" && k != "follow" && k != "remove") {
				continue
			}
			if d, err := time.ParseDuration(v); err == nil {
				got[k] = append(got[k], d)
			}
		}
	}
	var b strings.Builder
	b.WriteString("  kurmad phases (median):")
	for _, k := range []string{"create", "follow", "remove"} {
		v := got[k]
		if len(v) == 0 {
			return "", errors.New("no run timings in the daemon log")
		}
		if len(v) > n {
			v = v[len(v)-n:]
		}
		fmt.Fprintf(&b, " %s %.1f ms", k, benchutil.Ms(benchutil.Median(v)))
	}
	b.WriteString("\n")
	return b.String(), nil
}

func lastLine(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return lines[len(lines)-1] + "\n"
}

// sourceDir is this program's folder when run from the repository root
// with `go run ./bench/run`.
func sourceDir() string {
	wd, _ := os.Getwd()
	return filepath.Join(wd, "bench", "run")
}

func waitFor(within time.Duration, f func() error) error {
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	for {
		err := f()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// aciRootfsTar writes the rootfs/ entries of an ACI as a plain tarball
// (for `podman import`), so both runtimes run the very same files.
func aciRootfsTar(aci, out string) error {
	in, err := os.Open(aci)
	if err != nil {
		return err
	}
	defer in.Close()
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	defer f.Close()
	tr := tar.NewReader(bufio.NewReader(in))
	tw := tar.NewWriter(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("read %s: %w", aci, err)
		}
		name, ok := strings.CutPrefix(h.Name, "rootfs/")
		if !ok || name == "" {
			continue
		}
		h.Name = name
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if _, err := io.Copy(tw, tr); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return f.Close()
}

// unmountUnder lazily unmounts whatever podman or a failed run left below
// dir, deepest first.
func unmountUnder(dir string) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return
	}
	var ms []string
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			ms = append(ms, f[4])
		}
	}
	for i := len(ms) - 1; i >= 0; i-- {
		_ = syscall.Unmount(ms[i], syscall.MNT_DETACH)
	}
}
