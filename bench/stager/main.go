// Command stager measures the default stager (cmd/kurma-stager):
//
//   - pod start, from launching the stager to its readiness (fd 4 closed),
//     with the overlay union against the copy fallback as the peer, for one
//     app on a busybox layer under a layer of 2,000 small files;
//   - teardown, from SIGTERM to the stager's exit (the app dies on TERM);
//   - the run call-in (nsenter into the stager, /opt/stager/run APP true)
//     against a plain fork/exec of `busybox true` on the host as the peer.
//
// It prints p50/p99 and the ratios. Flags: -n pods, -runs call-ins,
// -copy=false skips the (slow) copy union, -v copies the stagers' logs to
// stderr. Like the stager tests it launches the
// stager itself: a re-exec of this program in new mount and network
// namespaces binds the layers, /dev, /proc and /sys into a stager root
// under a temporary directory, chroots and execs /stager. Everything is
// named kstg... and removed at exit. Needs root, busybox and nsenter.
package main

import (
	"bytes"
	"crypto/sha512"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"kurma.dev/kurma/pkg/appc"
	"kurma.dev/kurma/pkg/stagerspec"

	"kurma.dev/kurma/bench/internal/benchutil"
)

const launchEnv = "KSTG_BENCH_LAUNCH"

// verbose copies the stagers' logs to stderr (flag -v).
var verbose bool

// withCopy measures the copy union too (flag -copy).
var withCopy bool

type launchSpec struct {
	Root   string            `json:"root"`
	Layers map[string]string `json:"layers"`
}

// samples are measured durations.
type samples = benchutil.Samples

func main() {
	if s := os.Getenv(launchEnv); s != "" {
		err := launch(s)
		fmt.Fprintln(os.Stderr, "launcher:", err)
		os.Exit(99)
	}
	n := flag.Int("n", 8, "pods per union mode")
	runs := flag.Int("runs", 40, "run call-ins")
	flag.BoolVar(&verbose, "v", false, "copy the stagers' logs to stderr")
	flag.BoolVar(&withCopy, "copy", true, "also measure the copy union (slow)")
	flag.Parse()
	if err := run(*n, *runs); err != nil {
		fmt.Fprintln(os.Stderr, "bench/stager:", err)
		os.Exit(1)
	}
}

// launch runs in the new namespaces and becomes the stager.
func launch(specJSON string) error {
	var s launchSpec
	if err := json.Unmarshal([]byte(specJSON), &s); err != nil {
		return err
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return err
	}
	for id, src := range s.Layers {
		dst := filepath.Join(s.Root, "layers", id)
		if err := unix.Mount(src, dst, "", unix.MS_BIND, ""); err != nil {
			return err
		}
		if err := unix.Mount("", dst, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
			return err
		}
	}
	if err := unix.Mount("/dev", filepath.Join(s.Root, "dev"), "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return err
	}
	if err := unix.Mount("proc", filepath.Join(s.Root, "proc"), "proc", 0, ""); err != nil {
		return err
	}
	if err := unix.Mount("/sys", filepath.Join(s.Root, "sys"), "", unix.MS_BIND, ""); err != nil {
		return err
	}
	if err := unix.Chroot(s.Root); err != nil {
		return err
	}
	if err := os.Chdir("/"); err != nil {
		return err
	}
	return unix.Exec("/stager", []string{"/stager"}, []string{"PATH=/bin"})
}

func imageID(name string) string {
	sum := sha512.Sum512([]byte(name))
	return "sha512-" + hex.EncodeToString(sum[:])
}

type env struct {
	dir    string
	layers map[string]string
	order  []string
	stager []byte
}

func setup() (*env, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("needs root")
	}
	bb, err := exec.LookPath("busybox")
	if err != nil {
		return nil, fmt.Errorf("busybox (busybox-static) needed: %w", err)
	}
	stager, err := os.ReadFile(filepath.Join(benchutil.BinDir(), "kurma-stager"))
	if err != nil {
		return nil, fmt.Errorf("run make build first: %w", err)
	}
	dir, err := os.MkdirTemp("", "kstg-bench-")
	if err != nil {
		return nil, err
	}
	e := &env{dir: dir, stager: stager}
	base, fat := filepath.Join(dir, "layer-base"), filepath.Join(dir, "layer-fat")
	if err := os.MkdirAll(filepath.Join(base, "bin"), 0o755); err != nil {
		return e, err
	}
	b, err := os.ReadFile(bb)
	if err != nil {
		return e, err
	}
	if err := os.WriteFile(filepath.Join(base, "bin/busybox"), b, 0o755); err != nil {
		return e, err
	}
	for _, c := range []string{"sh", "sleep", "true"} {
		if err := os.Symlink("busybox", filepath.Join(base, "bin", c)); err != nil {
			return e, err
		}
	}
	for i := range 2000 {
		p := filepath.Join(fat, "data", strconv.Itoa(i%20), strconv.Itoa(i))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return e, err
		}
		if err := os.WriteFile(p, bytes.Repeat([]byte{'x'}, 512), 0o644); err != nil {
			return e, err
		}
	}
	e.order = []string{imageID("kstg-fat"), imageID("kstg-base")}
	e.layers = map[string]string{e.order[0]: fat, e.order[1]: base}
	return e, nil
}

type pod struct {
	cmd  *exec.Cmd
	done chan struct{}
}

// start builds a stager root and launches the stager, returning once it is
// ready, and how long that took.
func (e *env) start(i int, union string) (*pod, time.Duration, error) {
	root := filepath.Join(e.dir, fmt.Sprintf("kstg%s%d", union, i))
	for _, d := range []string{"dev", "proc", "sys", "opt/stager"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return nil, 0, err
		}
	}
	for _, id := range e.order {
		if err := os.MkdirAll(filepath.Join(root, "layers", id), 0o755); err != nil {
			return nil, 0, err
		}
	}
	if err := os.WriteFile(filepath.Join(root, "stager"), e.stager, 0o755); err != nil {
		return nil, 0, err
	}
	for _, c := range []string{"status", "logs", "run", "attach"} {
		if err := os.Link(filepath.Join(root, "stager"), filepath.Join(root, "opt/stager", c)); err != nil {
			return nil, 0, err
		}
	}
	cfg, _ := json.Marshal(map[string]string{"union": union, "gracePeriod": "2s"})
	m := stagerspec.Manifest{
		Name: "kstg-bench",
		Pod: appc.PodManifest{ACKind: appc.KindPodManifest, ACVersion: appc.ACVersion,
			Apps: []appc.RuntimeApp{{Name: "app", Image: appc.RuntimeImage{ID: e.order[0]},
				App: &appc.App{Exec: []string{"/bin/sleep", "1000"}, User: "0", Group: "0"}}}},
		Images: map[string]appc.ImageManifest{
			e.order[0]: {ACKind: appc.KindImageManifest, Name: "kstg/fat"},
			e.order[1]: {ACKind: appc.KindImageManifest, Name: "kstg/base"},
		},
		AppImageOrder: map[string][]string{"app": e.order},
		StagerConfig:  cfg,
	}
	mb, _ := json.Marshal(m)
	if err := os.WriteFile(filepath.Join(root, "manifest"), mb, 0o644); err != nil {
		return nil, 0, err
	}
	spec, _ := json.Marshal(launchSpec{Root: root, Layers: e.layers})
	r, w, err := os.Pipe()
	if err != nil {
		return nil, 0, err
	}
	defer r.Close()
	self, _ := os.Executable()
	p := &pod{cmd: exec.Command(self), done: make(chan struct{})}
	p.cmd.Env = append(os.Environ(), launchEnv+"="+string(spec))
	var out bytes.Buffer
	p.cmd.Stderr = &out
	if verbose {
		p.cmd.Stderr = io.MultiWriter(&out, os.Stderr)
	}
	p.cmd.ExtraFiles = []*os.File{nil, w}
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWNET}
	begin := time.Now()
	if err := p.cmd.Start(); err != nil {
		w.Close()
		return nil, 0, err
	}
	w.Close()
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	_, _ = io.Copy(io.Discard, r)
	took := time.Since(begin)
	select {
	case <-p.done:
		return nil, 0, fmt.Errorf("stager exited: %s", out.String())
	case <-time.After(20 * time.Millisecond):
	}
	return p, took, nil
}

// stop sends SIGTERM and returns how long the stager took to stop the
// pod, tear its mounts down and exit.
func (p *pod) stop() time.Duration {
	begin := time.Now()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	return time.Since(begin)
}

func run(n, runs int) error {
	e, err := setup()
	if e != nil {
		defer os.RemoveAll(e.dir)
	}
	if err != nil {
		return err
	}
	starts, stops := map[string]samples{}, map[string]samples{}
	var keep *pod
	for i := range n {
		unions := []string{"overlay", "copy"}
		if !withCopy {
			unions = unions[:1]
		}
		for _, union := range unions {
			p, d, err := e.start(i, union)
			if err != nil {
				return err
			}
			starts[union] = append(starts[union], d)
			if keep == nil && union == "overlay" {
				keep = p
				continue
			}
			stops[union] = append(stops[union], p.stop())
		}
	}
	defer keep.stop()

	settings, _ := json.Marshal(stagerspec.RunSettings{Exec: []string{"true"}, User: "0", Group: "0"})
	var callin, plain, status samples
	for range runs {
		sr, sw, err := os.Pipe()
		if err != nil {
			return err
		}
		_, _ = sw.Write(settings)
		sw.Close()
		c := exec.Command("nsenter", "-t", strconv.Itoa(keep.cmd.Process.Pid), "-m", "-n", "-r", "-w", "/opt/stager/run", "app")
		c.ExtraFiles = []*os.File{sr}
		begin := time.Now()
		out, err := c.CombinedOutput()
		callin = append(callin, time.Since(begin))
		sr.Close()
		if err != nil {
			return fmt.Errorf("run call-in: %v: %s", err, out)
		}
		begin = time.Now()
		if out, err := exec.Command("nsenter", "-t", strconv.Itoa(keep.cmd.Process.Pid), "-m", "-n", "-r", "-w", "/opt/stager/status").CombinedOutput(); err != nil {
			return fmt.Errorf("status call-in: %v: %s", err, out)
		}
		status = append(status, time.Since(begin))
		begin = time.Now()
		if err := exec.Command("busybox", "true").Run(); err != nil {
			return err
		}
		plain = append(plain, time.Since(begin))
	}
	ov, cp := starts["overlay"], starts["copy"]
	fmt.Printf("pod start to readiness (%d pods each, 1 app, 2 layers, 2000 files)\n", n)
	fmt.Printf("  overlay   p50 %-10v p99 %v\n", ov.Pct(.5), ov.Pct(.99))
	fmt.Printf("  copy      p50 %-10v p99 %v\n", cp.Pct(.5), cp.Pct(.99))
	if withCopy {
		fmt.Printf("  ratio overlay/copy p50 %.2f\n", float64(ov.Pct(.5))/float64(cp.Pct(.5)))
	}
	fmt.Printf("teardown, SIGTERM to stager exit (app: sleep, dies on TERM)\n")
	fmt.Printf("  overlay   p50 %-10v p99 %v\n", stops["overlay"].Pct(.5), stops["overlay"].Pct(.99))
	fmt.Printf("  copy      p50 %-10v p99 %v\n", stops["copy"].Pct(.5), stops["copy"].Pct(.99))
	fmt.Printf("run call-in `true` (%d runs) vs plain fork/exec of busybox true\n", runs)
	fmt.Printf("  call-in   p50 %-10v p99 %v\n", callin.Pct(.5), callin.Pct(.99))
	fmt.Printf("  status    p50 %-10v p99 %v  (call-in without a new process)\n", status.Pct(.5), status.Pct(.99))
	fmt.Printf("  plain     p50 %-10v p99 %v\n", plain.Pct(.5), plain.Pct(.99))
	fmt.Printf("  ratio call-in/plain p50 %.2f\n", float64(callin.Pct(.5))/float64(plain.Pct(.5)))
	return nil
}
