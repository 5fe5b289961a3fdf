// Command podstart measures the pod manager: the median time of a pod's
// create (until the stager is ready), stop and remove with the real image
// store and default stager, the part of create spent in kurmad itself (all
// start steps but the wait for the stager's readiness), and, as the peer,
// a bare namespaced process start of the same app (`unshare -mnui chroot
// ROOT /bin/true`) measured in the same run. Needs root and `make build`.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"kurma.dev/kurma/internal/image"
	"kurma.dev/kurma/internal/image/trust"
	"kurma.dev/kurma/internal/pod"
	"kurma.dev/kurma/internal/pod/stageinit"

	"kurma.dev/kurma/bench/internal/benchutil"
)

const runs = 20

func main() {
	if len(os.Args) > 1 && os.Args[1] == stageinit.Arg {
		os.Exit(stageinit.Main(os.Args[2:]))
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "podstart:", err)
		os.Exit(1)
	}
}

// stepSink collects the pod manager's debug step timings.
type stepSink struct {
	mu     sync.Mutex
	daemon time.Duration
	steps  map[string][]time.Duration
}

func (s *stepSink) Enabled(context.Context, slog.Level) bool { return true }
func (s *stepSink) WithAttrs([]slog.Attr) slog.Handler       { return s }
func (s *stepSink) WithGroup(string) slog.Handler            { return s }
func (s *stepSink) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "pod start step" {
		return nil
	}
	var step string
	var took time.Duration
	r.Attrs(func(a slog.Attr) bool {
		switch a.Key {
		case "step":
			step = a.Value.String()
		case "took":
			took = a.Value.Duration()
		}
		return true
	})
	s.mu.Lock()
	if step != "ready" {
		s.daemon += took
	}
	s.steps[step] = append(s.steps[step], took)
	s.mu.Unlock()
	return nil
}

func (s *stepSink) take() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	d := s.daemon
	s.daemon = 0
	return d
}

func sh(name string, args ...string) error {
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, out)
	}
	return nil
}

func run() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("needs root")
	}
	bin := os.Getenv("KURMA_BIN_DIR")
	if bin == "" {
		bin = "bin"
	}
	bin, _ = filepath.Abs(bin)
	tmp, err := os.MkdirTemp("", "kpod-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	acb := filepath.Join(bin, "kurma-acbuild")
	stager := filepath.Join(bin, "kurma-stager")
	if err := sh(acb, "keygen", "-o", filepath.Join(tmp, "k")); err != nil {
		return err
	}
	aci := filepath.Join(tmp, "stager.aci")
	args := []string{"build", "-o", aci, "--name", "kurma.dev/stager", "--exec", "/stager", "--add", stager + ":/stager"}
	for _, c := range []string{"status", "run", "logs", "attach"} {
		args = append(args, "--add", stager+":/opt/stager/"+c)
	}
	if err := sh(acb, args...); err != nil {
		return err
	}
	if err := sh(acb, "sign", "--key", filepath.Join(tmp, "k.key"), aci); err != nil {
		return err
	}
	bb := filepath.Join(bin, "images", "busybox.aci")
	if _, err := os.Stat(bb); err != nil {
		return fmt.Errorf("%s missing: run make build", bb)
	}
	kr, err := trust.LoadKeyring(filepath.Join(tmp, "k.pub"))
	if err != nil {
		return err
	}
	ctx := context.Background()
	store, err := image.Open(ctx, filepath.Join(tmp, "images"), image.Options{Keyring: kr})
	if err != nil {
		return err
	}
	sink := &stepSink{steps: map[string][]time.Duration{}}
	rt, err := pod.New(ctx, pod.Options{
		PodsDir: filepath.Join(tmp, "pods"), VolumesDir: filepath.Join(tmp, "volumes"),
		Images: store, StagerImage: "file://" + aci, CgroupRoot: "kpod-bench",
		Logger: slog.New(sink),
	})
	if err != nil {
		return err
	}
	defer rt.Close(ctx)
	defer func() {
		for _, d := range []string{"pids", "memory", "cpu", "cpuacct", "cpuset", "devices", "freezer", "blkio", "systemd", "unified", ""} {
			_ = os.Remove(filepath.Join("/sys/fs/cgroup", d, "kpod-bench"))
		}
	}()
	img, err := store.Pull(ctx, "file://"+bb, image.PullOptions{})
	if err != nil {
		return err
	}
	var creates, stops, removes, daemon []time.Duration
	for i := 0; i <= runs; i++ {
		t0 := time.Now()
		p, err := rt.Create(ctx, pod.Spec{Apps: []pod.AppSpec{{Image: img.ID, Exec: []string{"/bin/true"}}}})
		if err != nil {
			return err
		}
		t1 := time.Now()
		d := sink.take()
		if err := rt.Stop(ctx, p.UUID, 10*time.Second); err != nil {
			return err
		}
		t2 := time.Now()
		if err := rt.Remove(ctx, p.UUID, true); err != nil {
			return err
		}
		if i == 0 {
			continue // warm-up
		}
		creates, stops, removes, daemon = append(creates, t1.Sub(t0)), append(stops, t2.Sub(t1)), append(removes, time.Since(t2)), append(daemon, d)
	}
	layers, err := store.Resolve(ctx, img.ID)
	if err != nil {
		return err
	}
	var peer []time.Duration
	for i := 0; i <= runs; i++ {
		t0 := time.Now()
		if err := sh("unshare", "--mount", "--net", "--uts", "--ipc", "chroot", layers[0].Path, "/bin/true"); err != nil {
			return err
		}
		if i > 0 {
			peer = append(peer, time.Since(t0))
		}
	}
	total := benchutil.Median(creates) + benchutil.Median(stops) + benchutil.Median(removes)
	fmt.Printf("pod manager, %d runs (medians):\n", runs)
	fmt.Printf("  create (until stager ready)   %v\n", benchutil.Median(creates))
	fmt.Printf("    of which in kurmad          %v\n", benchutil.Median(daemon))
	for _, st := range pod.StepNames() {
		fmt.Printf("      step %-20s %v\n", st, benchutil.Median(sink.steps[st]))
	}
	fmt.Printf("  stop                          %v\n", benchutil.Median(stops))
	fmt.Printf("  remove                        %v\n", benchutil.Median(removes))
	fmt.Printf("  create+stop+remove            %v\n", total)
	fmt.Printf("peer: unshare -mnui chroot ROOT /bin/true   %v\n", benchutil.Median(peer))
	fmt.Printf("ratio kurmad part of create / peer: %.2f\n", float64(benchutil.Median(daemon))/float64(benchutil.Median(peer)))
	fmt.Printf("ratio full cycle / peer:            %.2f\n", float64(total)/float64(benchutil.Median(peer)))
	return nil
}
