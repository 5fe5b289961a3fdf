package stager

import (
	"context"
	"errors"
	"fmt"
	"kurma.dev/kurma/pkg/appc"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"kurma.dev/kurma/pkg/kerrors"
	"kurma.dev/kurma/pkg/stagerspec"
)

// RunStager is the stager's main: it reads /manifest, builds every app's
// filesystem, starts the pod init, closes the readiness descriptor once
// the apps run, and stays up until ctx is cancelled (SIGTERM), when it
// stops the pod within the grace period and tears its mounts down. It
// returns an error if the pod init dies on its own.
func RunStager(ctx context.Context, log *slog.Logger) (retErr error) {
	closeInheritedOnExec()
	// As PID 1 of the pod's PID namespace (the daemon starts us so), init
	// runs in this process: its signals are set up first thing, before a
	// pre-started stager's go-ahead.
	var prep *initPrep
	if os.Getpid() == 1 {
		prep = prepareInit()
	}
	if fd := os.Getenv(stagerspec.PrestartEnv); fd != "" {
		goAhead, err := awaitGoAhead(ctx, fd)
		if err != nil || !goAhead {
			return err
		}
	}
	b, err := os.ReadFile(stagerspec.ManifestPath)
	if err != nil {
		return fmt.Errorf("read manifest: %w", err)
	}
	m, cfg, err := ParseManifest(b)
	if err != nil {
		return err
	}
	for _, d := range []string{AppsDir, LogsDir, RunDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("mkdir %s: %w", d, err)
		}
	}
	// built lists the apps whose mounts teardown removes; on failure it
	// runs after init is killed (defers run last first).
	var built []string
	defer func() {
		if retErr != nil {
			teardown(log, built)
		}
	}()
	// When we are PID 1 of the pod's PID namespace (the daemon started us
	// so), init runs inside this process once the apps' filesystems are
	// built: no second process start. Otherwise init is a re-execution of
	// this binary, started now so that its start-up overlaps building
	// the apps' filesystems. Its mount namespace is a copy of ours taken
	// now; what we mount under AppsDir afterwards reaches it because
	// AppsDir is a shared mount (init makes its copy private once it has
	// the start request, when everything is mounted).
	var pi *podInit
	if os.Getpid() != 1 {
		if err := shareMount(AppsDir); err != nil {
			return err
		}
		if pi, err = execInit(m.Pod); err != nil {
			return err
		}
		defer pi.ctl.Close()
		defer func() {
			if retErr != nil {
				pi.kill()
			}
		}()
	}
	plans := make([]AppPlan, 0, len(m.Pod.Apps))
	for _, ra := range m.Pod.Apps {
		def, err := appDefinition(m, ra)
		if err != nil {
			return err
		}
		built = append(built, ra.Name)
		union, err := buildRootfs(log, ra.Name, m.AppImageOrder[ra.Name], cfg.Union)
		if err != nil {
			return err
		}
		rootfs := AppRootfs(ra.Name)
		if err := prepareMounts(m, ra, def, rootfs); err != nil {
			return fmt.Errorf("app %q: %w", ra.Name, err)
		}
		p, err := planApp(m, ra, rootfs)
		if err != nil {
			return err
		}
		log.Info("app prepared", "app", ra.Name, "union", union, "exec", p.Exec[0])
		plans = append(plans, p)
	}

	if pi == nil {
		if pi, err = inProcessInit(ctx, log, prep); err != nil {
			return err
		}
		defer pi.ctl.Close()
		defer func() {
			if retErr != nil {
				pi.kill()
			}
		}()
	}
	ctl := pi.ctl
	if err := send(ctl, request{Op: opStart, Plan: plans, Hostname: podHostname(m.Pod, m.Name), LogMaxBytes: cfg.LogMaxBytes,
		Slave: podAnnotation(m.Pod, stagerspec.VolumePropagationAnnotation) == "rslave"}); err != nil {
		return fmt.Errorf("pod init: %w", err)
	}
	var resp response
	if _, err := recv(ctl, &resp); err != nil {
		return fmt.Errorf("pod init: %w", err)
	}
	if err := resp.err(); err != nil {
		return err // init's own error names the app
	}
	signalReady(log)
	log.Info("pod running", "apps", len(plans), "init", pi.pid)

	select {
	case <-pi.done:
		return fmt.Errorf("pod init exited: %v", pi.err)
	case <-ctx.Done():
	}
	grace := cfg.Grace()
	log.Info("stopping pod", "grace", grace)
	if err := send(ctl, request{Op: opShutdown, GraceNS: int64(grace)}); err != nil {
		log.Warn("shutdown request", "err", err)
	}
	select {
	case <-pi.done:
	case <-time.After(grace + 10*time.Second):
		pi.kill()
	}
	teardown(log, built)
	return nil
}

// podInit is the pod's init as the stager sees it: a control connection
// and the end of init (a process or, when the stager is PID 1, a goroutine).
type podInit struct {
	ctl  *net.UnixConn
	pid  int
	done chan struct{} // closed when init ended; err is then set
	err  error
	kill func() // ends init and waits for done
}

// execInit starts init as a re-execution of this binary in new PID, IPC,
// UTS and mount namespaces.
func execInit(m appc.PodManifest) (*podInit, error) {
	// Pdeathsig belongs to the thread that starts init: keep it.
	runtime.LockOSThread()
	ctl, child, err := socketpair()
	if err != nil {
		return nil, err
	}
	self, err := os.Executable()
	if err != nil {
		self = "/stager" // where the stager image puts us
	}
	cmd := exec.Command(self, "init")
	cmd.Args[0] = "init"
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	cmd.ExtraFiles = []*os.File{child}
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: initCloneFlags(m),
		Pdeathsig:  syscall.SIGKILL,
	}
	if err := cmd.Start(); err != nil {
		child.Close()
		ctl.Close()
		return nil, fmt.Errorf("start pod init: %w", err)
	}
	child.Close()
	pi := &podInit{ctl: ctl, pid: cmd.Process.Pid, done: make(chan struct{})}
	go func() { pi.err = cmd.Wait(); close(pi.done) }()
	pi.kill = func() {
		_ = cmd.Process.Kill()
		<-pi.done
	}
	return pi, nil
}

// inProcessInit runs init in this process, which is PID 1 of the pod's
// PID namespace (made by the daemon, with the pod's IPC and UTS
// namespaces): init's mounts (the pod's /proc in every app) then live in
// the stager's own mount namespace, which is private already, and
// teardown removes them with the apps' filesystems.
func inProcessInit(ctx context.Context, log *slog.Logger, prep *initPrep) (*podInit, error) {
	ctl, child, err := socketpair()
	if err != nil {
		return nil, err
	}
	cc, err := fileConn(child)
	child.Close()
	if err != nil {
		ctl.Close()
		return nil, fmt.Errorf("init control socket: %w", err)
	}
	pi := &podInit{ctl: ctl, pid: 1, done: make(chan struct{})}
	go func() {
		defer cc.Close()
		pi.err = serveInit(context.WithoutCancel(ctx), log.With("role", "init"), cc, prep)
		close(pi.done)
	}()
	pi.kill = func() {
		// Closing the connection makes init shut the pod down, with no
		// grace, and return.
		_ = cc.Close()
		select {
		case <-pi.done:
		case <-time.After(time.Second):
			// Our exit ends the rest: we are the namespace's init.
		}
	}
	return pi, nil
}

// shareMount makes dir a mount point of its own with shared propagation.
func shareMount(dir string) error {
	if err := unix.Mount(dir, dir, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s: %w", dir, err)
	}
	if err := unix.Mount("", dir, "", unix.MS_SHARED, ""); err != nil {
		return fmt.Errorf("make %s shared: %w", dir, err)
	}
	return nil
}

// signalReady closes the readiness descriptor if we were given one.
func signalReady(log *slog.Logger) {
	if _, err := unix.FcntlInt(stagerspec.ReadyFD, unix.F_GETFD, 0); err != nil {
		log.Warn("no readiness descriptor", "fd", stagerspec.ReadyFD)
		return
	}
	if err := unix.Close(stagerspec.ReadyFD); err != nil {
		log.Warn("close readiness descriptor", "err", err)
	}
}

// closeInheritedOnExec keeps the descriptors the daemon passed (the
// readiness fd above all) out of init and the apps.
func closeInheritedOnExec() {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		for fd := 3; fd < 64; fd++ {
			unix.CloseOnExec(fd)
		}
		return
	}
	for _, e := range ents {
		if fd, err := strconv.Atoi(e.Name()); err == nil && fd > 2 {
			unix.CloseOnExec(fd)
		}
	}
}

// teardown unmounts the apps' filesystems, then AppsDir's own mount.
func teardown(log *slog.Logger, apps []string) {
	for _, a := range apps {
		if err := teardownRootfs(a); err != nil && !errors.Is(err, kerrors.NotFound) {
			log.Warn("teardown", "app", a, "err", err)
		}
	}
	err := unix.Unmount(AppsDir, 0)
	if errors.Is(err, unix.EBUSY) {
		err = unix.Unmount(AppsDir, unix.MNT_DETACH)
	}
	if err != nil && !errors.Is(err, unix.EINVAL) {
		log.Warn("teardown", "dir", AppsDir, "err", err)
	}
}

// awaitGoAhead is the wait of a pre-started stager (stagerspec.PrestartEnv
// names the descriptor): it warms up what every start needs, then waits
// for the daemon's byte, which says the pod's files are in place. false
// means the daemon let this stager go (EOF) or stopped it meanwhile.
func awaitGoAhead(ctx context.Context, fdName string) (bool, error) {
	_ = os.Unsetenv(stagerspec.PrestartEnv)
	fd, err := strconv.Atoi(fdName)
	if err != nil || fd < 3 {
		return false, fmt.Errorf("%s=%q: not a descriptor", stagerspec.PrestartEnv, fdName)
	}
	f := os.NewFile(uintptr(fd), "go-ahead")
	defer f.Close()
	warmUp()
	got := make(chan bool, 1)
	go func() {
		var b [1]byte
		n, _ := f.Read(b[:])
		got <- n == 1
	}()
	select {
	case ok := <-got:
		return ok, nil
	case <-ctx.Done():
		return false, nil
	}
}

// warmUp decodes a small manifest, so that the JSON decoder has built its
// tables for the manifest's types before the pod's manifest arrives.
func warmUp() {
	_, _, _ = ParseManifest([]byte(`{"kurmaVersion":"0","name":"w","pod":{"acKind":"PodManifest","acVersion":"0.8.11",` +
		`"apps":[{"name":"a","image":{"id":"sha512-0"},"app":{"exec":["/a"],"user":"0","group":"0","environment":[{"name":"A","value":"b"}]},` +
		`"mounts":[{"volume":"v","path":"/v"}],"annotations":[{"name":"a","value":"b"}]}],"volumes":[{"name":"v","kind":"empty"}]},` +
		`"images":{"sha512-0":{"acKind":"ImageManifest","acVersion":"0.8.11","name":"w","app":{"exec":["/a"],"user":"0","group":"0"}}},` +
		`"appImageOrder":{"a":["sha512-0"]}}`))
}
