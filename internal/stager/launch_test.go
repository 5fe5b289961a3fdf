package stager_test

// A minimal stand-in for the daemon's launcher: it prepares a stager root
// the way the stager spec describes (/layers/<id> read-only binds,
// /volumes/<name>, /dev, /proc, /sys read-only, a private mount namespace
// and a new network namespace), chroots and execs /stager with the
// readiness pipe on fd 4. The mount work happens in a re-exec of the test
// binary that already lives in the new namespaces (TestMain below).

import (
	"bytes"
	"crypto/sha512"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"kurma.dev/kurma/internal/testutil"
	"kurma.dev/kurma/pkg/appc"
	"kurma.dev/kurma/pkg/stagerspec"
)

const launcherEnv = "KSTG_LAUNCHER_SPEC"

type launchSpec struct {
	Root string `json:"root"`
	// RootLower, when set, is mounted at Root as an overlay (as the daemon
	// does with the stager image), upper and work dirs beside Root.
	RootLower string            `json:"rootLower,omitempty"`
	Layers    map[string]string `json:"layers"`  // id -> host dir
	Volumes   map[string]string `json:"volumes"` // name -> host dir
}

func TestMain(m *testing.M) {
	if spec := os.Getenv(launcherEnv); spec != "" {
		if err := launcherMain(spec); err != nil {
			fmt.Fprintln(os.Stderr, "launcher:", err)
			os.Exit(99)
		}
	}
	os.Exit(m.Run())
}

// launcherMain runs in fresh mount and network namespaces.
func launcherMain(specJSON string) error {
	var s launchSpec
	if err := json.Unmarshal([]byte(specJSON), &s); err != nil {
		return err
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make private: %w", err)
	}
	if s.RootLower != "" {
		opts := fmt.Sprintf("lowerdir=%s,upperdir=%s.upper,workdir=%s.work", s.RootLower, s.Root, s.Root)
		if err := unix.Mount("overlay", s.Root, "overlay", 0, opts); err != nil {
			return fmt.Errorf("mount root overlay: %w", err)
		}
	}
	bind := func(src, dst string, flags uintptr, ro bool) error {
		if err := unix.Mount(src, dst, "", unix.MS_BIND|flags, ""); err != nil {
			return fmt.Errorf("bind %s: %w", src, err)
		}
		if ro {
			if err := unix.Mount("", dst, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
				return fmt.Errorf("remount ro %s: %w", dst, err)
			}
		}
		return nil
	}
	for id, src := range s.Layers {
		if err := bind(src, filepath.Join(s.Root, "layers", id), 0, true); err != nil {
			return err
		}
	}
	for name, src := range s.Volumes {
		if err := bind(src, filepath.Join(s.Root, "volumes", name), 0, false); err != nil {
			return err
		}
	}
	if err := bind("/dev", filepath.Join(s.Root, "dev"), unix.MS_REC, false); err != nil {
		return err
	}
	if err := unix.Mount("proc", filepath.Join(s.Root, "proc"), "proc", 0, ""); err != nil {
		return fmt.Errorf("mount proc: %w", err)
	}
	if err := bind("/sys", filepath.Join(s.Root, "sys"), 0, true); err != nil {
		return err
	}
	if err := unix.Chroot(s.Root); err != nil {
		return fmt.Errorf("chroot: %w", err)
	}
	if err := os.Chdir("/"); err != nil {
		return err
	}
	env := []string{"PATH=/bin"}
	return unix.Exec("/stager", []string{"/stager"}, env)
}

// syncBuffer collects the stager's log output.
type syncBuffer struct {
	mu sync.Mutex // guards b
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func imageID(name string) string {
	sum := sha512.Sum512([]byte(name))
	return "sha512-" + hex.EncodeToString(sum[:])
}

// testLayers builds two layers on the host: a busybox base and a top layer
// with overlay-form whiteouts over it. It returns their IDs, top-most first.
func testLayers(t *testing.T, base string) (map[string]string, []string) {
	t.Helper()
	bb, err := exec.LookPath("busybox")
	if err != nil {
		t.Skip("busybox (Debian busybox-static) not installed")
	}
	lower := filepath.Join(base, "layer-base")
	upper := filepath.Join(base, "layer-top")
	for _, d := range []string{"bin", "etc", "opq", "home/kuser", "tmp"} {
		mustMkdir(t, filepath.Join(lower, d))
	}
	b, err := os.ReadFile(bb)
	if err != nil {
		t.Fatal(err)
	}
	mustWrite(t, filepath.Join(lower, "bin/busybox"), string(b), 0o755)
	for _, c := range []string{"sh", "cat", "sleep", "ps", "echo", "id", "hostname", "ls", "tty", "test", "pwd", "true",
		"mount", "ln", "mkdir", "grep", "head", "wc", "dd"} {
		if err := os.Symlink("busybox", filepath.Join(lower, "bin", c)); err != nil {
			t.Fatal(err)
		}
	}
	mustWrite(t, filepath.Join(lower, "etc/passwd"),
		"root:x:0:0:root:/root:/bin/sh\nkuser:x:1234:1234::/home/kuser:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n", 0o644)
	mustWrite(t, filepath.Join(lower, "etc/group"), "root:x:0:\nkgroup:x:4321:\nnogroup:x:65534:\n", 0o644)
	mustWrite(t, filepath.Join(lower, "etc/removed"), "gone", 0o644)
	mustWrite(t, filepath.Join(lower, "opq/old"), "hidden", 0o644)
	mustWrite(t, filepath.Join(lower, "owned"), "x", 0o644)
	if err := os.Chown(filepath.Join(lower, "owned"), 2222, 3333); err != nil {
		t.Fatal(err)
	}
	mustMkdir(t, filepath.Join(upper, "etc"))
	mustMkdir(t, filepath.Join(upper, "opq"))
	if err := unix.Mknod(filepath.Join(upper, "etc/removed"), unix.S_IFCHR|0o600, 0); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setxattr(filepath.Join(upper, "opq"), "trusted.overlay.opaque", []byte("y"), 0); err != nil {
		t.Fatal(err)
	}
	mustWrite(t, filepath.Join(upper, "opq/new"), "new", 0o644)
	mustWrite(t, filepath.Join(upper, "top.txt"), "top", 0o644)
	top, bottom := imageID("kstg-top"), imageID("kstg-base")
	return map[string]string{top: upper, bottom: lower}, []string{top, bottom}
}

func mustMkdir(t *testing.T, p string) {
	t.Helper()
	if err := os.MkdirAll(p, 0o755); err != nil {
		t.Fatal(err)
	}
}

func mustWrite(t *testing.T, p, s string, mode os.FileMode) {
	t.Helper()
	mustMkdir(t, filepath.Dir(p))
	if err := os.WriteFile(p, []byte(s), mode); err != nil {
		t.Fatal(err)
	}
}

// pod is a launched stager.
type pod struct {
	t     *testing.T
	name  string
	base  string // host dir holding root, layers and volumes
	root  string
	cmd   *exec.Cmd
	ready *os.File
	out   *syncBuffer
	done  chan error
	pid1  bool // the stager is PID 1 of the pod (podOpts.pid1)
}

type podApp struct {
	name string
	exec []string
	// mounts of the "shared" volume
	mountShared string
	tty         bool
	isolators   []appc.Isolator
	annotations []appc.Annotation
}

// podOpts configures newPod.
type podOpts struct {
	config string // stagerConfig JSON
	// overlayRoot makes the stager root an overlay mount, as the daemon's
	// is; otherwise it is a plain directory.
	overlayRoot bool
	// pid1 starts the stager as PID 1 of new PID, IPC and UTS namespaces,
	// as kurmad does: it is then the pod's init itself.
	pid1 bool
	// annotations of the pod manifest
	annotations []appc.Annotation
}

// newPod builds a stager root for apps and launches the stager on it.
func newPod(t *testing.T, o podOpts, apps ...podApp) *pod {
	t.Helper()
	testutil.RequireRoot(t)
	if testing.Short() {
		t.Skip("launches real pods")
	}
	name := testutil.UniqueName("kstg")
	base := filepath.Join(t.TempDir(), name)
	root := filepath.Join(base, "root")
	mountAt := root
	if o.overlayRoot {
		// Everything goes into the lower dir; root is the mount point.
		root = filepath.Join(base, "root.lower")
		for _, d := range []string{mountAt, mountAt + ".upper", mountAt + ".work"} {
			mustMkdir(t, d)
		}
	}
	layers, order := testLayers(t, base)
	shared := filepath.Join(base, "vol-shared")
	mustMkdir(t, shared)
	for _, d := range []string{"dev", "proc", "sys", "opt/stager", "volumes/shared"} {
		mustMkdir(t, filepath.Join(root, d))
	}
	for id := range layers {
		mustMkdir(t, filepath.Join(root, "layers", id))
	}
	bin := testutil.Bin(t, "kurma-stager")
	b, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	mustWrite(t, filepath.Join(root, "stager"), string(b), 0o755)
	for _, c := range []string{"status", "logs", "run", "attach"} {
		if err := os.Link(filepath.Join(root, "stager"), filepath.Join(root, "opt/stager", c)); err != nil {
			t.Fatal(err)
		}
	}
	m := stagerspec.Manifest{
		KurmaVersion: "test",
		Name:         name,
		Pod: appc.PodManifest{
			ACKind: appc.KindPodManifest, ACVersion: appc.ACVersion,
			Volumes:     []appc.Volume{{Name: "shared", Kind: "empty"}},
			Annotations: o.annotations,
		},
		Images: map[string]appc.ImageManifest{
			order[0]: {ACKind: appc.KindImageManifest, ACVersion: appc.ACVersion, Name: "kstg/top",
				App: &appc.App{Exec: []string{"/bin/true"}, User: "0", Group: "0"}},
			order[1]: {ACKind: appc.KindImageManifest, ACVersion: appc.ACVersion, Name: "kstg/base"},
		},
		AppImageOrder: map[string][]string{},
		StagerConfig:  json.RawMessage(o.config),
	}
	for _, a := range apps {
		ra := appc.RuntimeApp{Name: a.name, Image: appc.RuntimeImage{ID: order[0]},
			App: &appc.App{Exec: a.exec, User: "0", Group: "0", Isolators: a.isolators}}
		if a.tty {
			ra.Annotations = []appc.Annotation{{Name: "kurma.dev/tty", Value: "true"}}
		}
		ra.Annotations = append(ra.Annotations, a.annotations...)
		if a.mountShared != "" {
			ra.Mounts = []appc.Mount{{Volume: "shared", Path: a.mountShared}}
		}
		m.Pod.Apps = append(m.Pod.Apps, ra)
		m.AppImageOrder[a.name] = order
	}
	mb, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	mustWrite(t, filepath.Join(root, "manifest"), string(mb), 0o644)

	ls := launchSpec{Root: root, Layers: layers, Volumes: map[string]string{"shared": shared}}
	if o.overlayRoot {
		ls.Root, ls.RootLower = mountAt, root
		root = mountAt
	}
	spec, _ := json.Marshal(ls)
	readyR, readyW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &pod{t: t, name: name, base: base, root: root, ready: readyR, out: &syncBuffer{}, done: make(chan error, 1)}
	p.cmd = exec.Command(os.Args[0], "-test.run=^$")
	p.cmd.Env = append(os.Environ(), launcherEnv+"="+string(spec))
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	p.cmd.ExtraFiles = []*os.File{nil, readyW}
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWNET}
	if o.pid1 {
		p.pid1 = true
		p.cmd.SysProcAttr.Cloneflags |= syscall.CLONE_NEWPID | syscall.CLONE_NEWIPC | syscall.CLONE_NEWUTS
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	readyW.Close()
	go func() { p.done <- p.cmd.Wait() }()
	t.Cleanup(func() {
		readyR.Close()
		p.stop(5 * time.Second)
		if t.Failed() {
			t.Logf("stager output:\n%s", p.out.String())
		}
	})
	return p
}

// waitReady waits for fd 4 to be closed and reports whether the stager is
// still alive then.
func (p *pod) waitReady(d time.Duration) bool {
	p.t.Helper()
	_ = p.ready.SetReadDeadline(time.Now().Add(d))
	if _, err := io.Copy(io.Discard, p.ready); err != nil {
		p.t.Fatalf("readiness: %v\n%s", err, p.out.String())
	}
	select {
	case err := <-p.done:
		p.done <- err
		return false
	case <-time.After(100 * time.Millisecond):
		return true
	}
}

// stop sends SIGTERM (once) and waits up to d for the stager to exit,
// killing it after that. It returns the wait error.
func (p *pod) stop(d time.Duration) error {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.done:
		p.done <- err
		return err
	case <-time.After(d):
		_ = p.cmd.Process.Kill()
		err := <-p.done
		p.done <- err
		return err
	}
}

type callResult struct {
	stdout, stderr string
	code           int
}

// callin runs /opt/stager/<name> the way the daemon does: in the stager's
// mount and network namespaces and root, in our own PID namespace.
func (p *pod) callin(stdin io.Reader, settings *os.File, env []string, name string, args ...string) callResult {
	p.t.Helper()
	cmd := p.callinCmd(name, args...)
	cmd.Stdin = stdin
	cmd.Env = append(cmd.Env, env...)
	if settings != nil {
		cmd.ExtraFiles = []*os.File{settings}
	}
	var so, se bytes.Buffer
	cmd.Stdout, cmd.Stderr = &so, &se
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		p.t.Fatalf("callin %s: %v", name, err)
	}
	return callResult{so.String(), se.String(), code}
}

func (p *pod) callinCmd(name string, args ...string) *exec.Cmd {
	a := []string{"-t", strconv.Itoa(p.cmd.Process.Pid), "-m", "-n", "-r", "-w", "/opt/stager/" + name}
	cmd := exec.Command("nsenter", append(a, args...)...)
	cmd.Env = []string{"PATH=/bin"}
	return cmd
}

// runIn runs a command in app through the run call-in.
func (p *pod) runIn(app string, s stagerspec.RunSettings, stdin string) callResult {
	p.t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		p.t.Fatal(err)
	}
	defer r.Close()
	b, _ := json.Marshal(s)
	go func() { _, _ = w.Write(b); w.Close() }()
	return p.callin(strings.NewReader(stdin), r, nil, "run", app)
}

func (p *pod) status() stagerspec.Status {
	p.t.Helper()
	res := p.callin(nil, nil, nil, "status")
	if res.code != 0 {
		p.t.Fatalf("status: exit %d: %s", res.code, res.stderr)
	}
	var st stagerspec.Status
	if err := json.Unmarshal([]byte(res.stdout), &st); err != nil {
		p.t.Fatalf("status output %q: %v", res.stdout, err)
	}
	return st
}

// podProcesses returns the host PIDs of every process in the pod's PID
// namespace (that of the stager's child, init).
func (p *pod) podProcesses() (string, []int) {
	p.t.Helper()
	if p.pid1 {
		// The stager is the pod's init: its PID namespace is the pod's.
		ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", p.cmd.Process.Pid))
		if err != nil {
			p.t.Fatal(err)
		}
		return ns, pidsInNS(ns)
	}
	var kids []string
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", p.cmd.Process.Pid))
	for _, task := range tasks {
		b, _ := os.ReadFile(task)
		kids = append(kids, strings.Fields(string(b))...)
	}
	var ns string
	for _, f := range kids {
		l, err := os.Readlink("/proc/" + f + "/ns/pid")
		if err == nil {
			ns = l
		}
	}
	if ns == "" {
		p.t.Fatal("pod init not found")
	}
	return ns, pidsInNS(ns)
}

func pidsInNS(ns string) []int {
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if l, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", pid)); err == nil && l == ns {
			out = append(out, pid)
		}
	}
	return out
}

// eventually retries f until it returns nil or d passes.
func eventually(t *testing.T, d time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
