package stager

import (
	"context"
	"errors"
	"fmt"
	"io/fs"

	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"reflect"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"kurma.dev/kurma/pkg/kerrors"
	"kurma.dev/kurma/pkg/stagerspec"
)

// initServer is PID 1 of the pod's PID namespace. It starts the apps, reaps
// every process of the namespace, and serves the call-ins.
type initServer struct {
	log *slog.Logger

	mu sync.Mutex // guards apps, waiters, stopping
	// apps by name, in pod order (order).
	apps    map[string]*appProc
	order   []string
	waiters map[int]func(syscall.WaitStatus)
	// stopping is set once shutdown began; no new processes start.
	stopping bool

	stateMu sync.Mutex // serialises writes of StatePath; guards lastState
	// lastState is what StatePath holds.
	lastState stagerspec.Status

	// logMax is the rotation size of app logs (set before apps start).
	logMax int64
	// reaped gets a token after the reaper collected children, so that
	// shutdown waits for exits instead of polling.
	reaped chan struct{}

	// spawner starts apps and call-in processes with their privileges.
	spawner *spawner
}

// appProc is one running (or exited) app.
type appProc struct {
	plan   AppPlan
	pid    int
	stdinW *os.File // init keeps the app's stdin open for attach
	done   chan struct{}

	// Guarded by initServer.mu.
	exited bool
	code   int
	reason string

	outMu sync.Mutex // guards outs, errs, closed
	outs  []*os.File // attached clients' stdout streams
	errs  []*os.File // attached clients' stderr streams
	// closed counts the app's output streams that reached EOF (of 2);
	// logged is closed when both have, so everything the app wrote is in
	// its log.
	closed int
	logged chan struct{}
}

// logDrainWait bounds how long an app's exit waits for its output to reach
// the log: a child the app left behind may hold the pipes open.
const logDrainWait = 500 * time.Millisecond

// RunInit is the body of `kurma-stager init`. The stager starts it with
// new PID, IPC, UTS and mount namespaces and the control socket on fd 3.
func RunInit(ctx context.Context, log *slog.Logger) error {
	ctl, err := fileConn(os.NewFile(3, "ctl"))
	if err != nil {
		return fmt.Errorf("control socket: %w", err)
	}
	defer ctl.Close()
	// As PID 1 we would be killed by nobody's signals, but Go exits on
	// SIGTERM unless told otherwise: handle and drop them (the stager
	// asks for shutdown over ctl). Handled, not ignored, so that children
	// get default dispositions.
	return serveInit(ctx, log, ctl, prepareInit(syscall.SIGTERM, syscall.SIGINT))
}

// pid1Signals are the signals whose Go default (exit) would end a PID 1
// that did not ask for them: handled and dropped, so that an app cannot
// end its pod by sending them to PID 1 (the kernel delivers to a
// namespace's init only the signals it handles).
var pid1Signals = []os.Signal{syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2,
	syscall.SIGPIPE, syscall.SIGALRM, syscall.SIGVTALRM, syscall.SIGPROF, syscall.SIGXCPU,
	syscall.SIGXFSZ, syscall.SIGTTIN, syscall.SIGTTOU, syscall.SIGSTKFLT, syscall.SIGPWR, syscall.SIGIO}

// initPrep is what a pod init sets up before it knows its pod.
type initPrep struct {
	sigchld <-chan os.Signal // SIGCHLD, for the reaper
	spawner *spawner
}

// prepareInit sets up the signals of a pod init (it handles and discards
// pid1Signals and extra) and the spawner's thread for apps of default
// privileges. Each handled signal costs the Go runtime a hand-off to its
// signal-mask thread and back, and a spawner thread costs a thread start
// and some thirty prctl calls: a pre-started stager does all this before
// its go-ahead, off the pod start's path.
func prepareInit(extra ...os.Signal) *initPrep {
	drop := make(chan os.Signal, 4)
	signal.Notify(drop, append(extra, pid1Signals...)...)
	go func() {
		for range drop {
		}
	}()
	sigchld := make(chan os.Signal, 1)
	signal.Notify(sigchld, syscall.SIGCHLD)
	sp := &spawner{}
	// A failure here is met again, and reported, when an app starts.
	_, _ = sp.thread(Privileges{Caps: DefaultCaps})
	return &initPrep{sigchld: sigchld, spawner: sp}
}

// serveInit is the pod init on its control connection: in its own process
// (RunInit), or inside the stager when the stager is itself PID 1 of the
// pod's PID namespace (RunStager). prep comes from prepareInit.
func serveInit(ctx context.Context, log *slog.Logger, ctl *net.UnixConn, prep *initPrep) error {
	// Not dumpable: /proc/1 of the pod (our root, cwd, descriptors, memory)
	// stays closed to the apps, who share our PID namespace but not our
	// capabilities (caps.go).
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("set non-dumpable: %w", err)
	}
	s := &initServer{log: log, apps: map[string]*appProc{}, waiters: map[int]func(syscall.WaitStatus){}, reaped: make(chan struct{}, 1)}
	s.spawner = prep.spawner
	go s.reap(prep.sigchld)

	var start request
	if _, err := recv(ctl, &start); err != nil {
		return fmt.Errorf("read start: %w", err)
	}
	s.logMax = start.LogMaxBytes
	if err := s.setup(start); err != nil {
		_ = send(ctl, errResponse(err))
		return err
	}
	ln, err := listen()
	if err != nil {
		_ = send(ctl, errResponse(err))
		return err
	}
	defer ln.Close()
	if err := s.startApps(start.Plan); err != nil {
		_ = send(ctl, errResponse(err))
		s.shutdown(ctx, 0)
		return err
	}
	go s.serve(ctx, ln)
	if err := send(ctl, response{Status: s.status()}); err != nil {
		s.shutdown(ctx, 0)
		return err
	}
	// After the readiness answer: status is served from memory meanwhile.
	s.writeState()

	// Wait for the stager's shutdown request; a vanished stager counts as
	// one with the default grace.
	grace := DefaultGrace
	var req request
	if _, err := recv(ctl, &req); err == nil && req.Op == opShutdown {
		grace = time.Duration(req.GraceNS)
	}
	s.shutdown(ctx, grace)
	s.writeState()
	_ = send(ctl, response{Status: s.status()})
	return nil
}

func (s *initServer) setup(start request) error {
	if start.Op != opStart {
		return kerrors.New(kerrors.Invalid, "expected %q, got %q", opStart, start.Op)
	}
	if start.Hostname != "" {
		h := start.Hostname
		if len(h) > 64 {
			h = h[:64]
		}
		if err := unix.Sethostname([]byte(h)); err != nil {
			return fmt.Errorf("sethostname: %w", err)
		}
	}
	// Our mount namespace is a copy of the stager's; keep what we mount
	// here (the pod's /proc) from propagating back.
	prop := uintptr(unix.MS_PRIVATE)
	if start.Slave {
		prop = unix.MS_SLAVE // still nothing flows back
	}
	_ = unix.Mount("", "/", "", unix.MS_REC|prop, "")
	for _, p := range start.Plan {
		_ = unix.Mount("", p.Rootfs, "", unix.MS_REC|prop, "")
		target := filepath.Join(p.Rootfs, "proc")
		if err := unix.Mount("proc", target, "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
			return fmt.Errorf("app %q: mount proc: %w", p.Name, err)
		}
		if !p.ProcSysRW {
			if err := readOnlyProcSys(p.Rootfs); err != nil {
				return fmt.Errorf("app %q: %w", p.Name, err)
			}
		}
	}
	return nil
}

func listen() (*net.UnixListener, error) {
	if err := os.MkdirAll(RunDir, 0o700); err != nil {
		return nil, err
	}
	_ = os.Remove(SocketPath)
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: SocketPath, Net: "unixpacket"})
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", SocketPath, err)
	}
	return ln, nil
}

// reap collects every child of PID 1 and hands exit statuses to waiters.
func (s *initServer) reap(sig <-chan os.Signal) {
	for range sig {
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
			s.mu.Lock()
			fn := s.waiters[pid]
			delete(s.waiters, pid)
			s.mu.Unlock()
			if fn != nil {
				fn(ws)
			}
		}
		select {
		case s.reaped <- struct{}{}:
		default:
		}
	}
}

// spawn starts a process as p describes with files as its stdio, and
// registers onExit before the reaper can see it exit.
func (s *initServer) spawn(p AppPlan, files []*os.File, tty bool, onExit func(syscall.WaitStatus)) (int, error) {
	fds := make([]uintptr, len(files))
	for i, f := range files {
		fds[i] = f.Fd()
	}
	attr := &syscall.ProcAttr{
		Dir:   p.Dir,
		Env:   p.Env,
		Files: fds,
		Sys: &syscall.SysProcAttr{
			Chroot:     p.Rootfs,
			Cloneflags: syscall.CLONE_NEWNS,
			Setsid:     true,
			Setctty:    tty,
			Credential: &syscall.Credential{Uid: p.ID.UID, Gid: p.ID.GID, Groups: p.ID.Groups},
		},
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopping {
		return 0, kerrors.New(kerrors.Unavailable, "pod is stopping")
	}
	pid, err := s.spawner.forkExec(p.Exec[0], p.Exec, attr, p.Priv)
	if err != nil {
		// The kernel reports a missing working directory as a missing
		// executable: say which it was.
		if errors.Is(err, syscall.ENOENT) && p.Dir != "" {
			if _, serr := os.Stat(filepath.Join(p.Rootfs, p.Dir)); errors.Is(serr, fs.ErrNotExist) {
				return 0, &ExecError{Code: ExitCannotExec, Err: fmt.Errorf("app %q: working directory %q: %w", p.Name, p.Dir, err)}
			}
		}
		code := ExitCannotExec
		if errors.Is(err, syscall.ENOENT) {
			code = ExitNotFound
		}
		return 0, &ExecError{Code: code, Err: fmt.Errorf("app %q: exec %q: %w", p.Name, p.Exec[0], err)}
	}
	s.waiters[pid] = onExit
	return pid, nil
}

func (s *initServer) startApps(plans []AppPlan) error {
	for _, p := range plans {
		if err := s.startApp(p); err != nil {
			return err
		}
	}
	return nil
}

func (s *initServer) startApp(p AppPlan) (retErr error) {
	logf, err := openAppLog(LogPath(p.Name), s.logMax)
	if err != nil {
		return fmt.Errorf("app %q log: %w", p.Name, err)
	}
	var toClose, onFail []*os.File
	defer func() {
		closeAll(toClose)
		if retErr != nil {
			closeAll(onFail)
			logf.Close()
		}
	}()
	var child []*os.File
	var stdinW, outR, errR *os.File
	if p.TTY {
		master, slave, err := openPTY(PTYPath(p.Name))
		if err != nil {
			return fmt.Errorf("app %q: allocate tty: %w", p.Name, err)
		}
		toClose = append(toClose, slave)
		onFail = append(onFail, master)
		if p.Rows > 0 && p.Cols > 0 {
			if rc, err := master.SyscallConn(); err == nil {
				_ = rc.Control(func(fd uintptr) {
					_ = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Row: p.Rows, Col: p.Cols})
				})
			}
		}
		child = []*os.File{slave, slave, slave}
		stdinW, outR = master, master
	} else {
		for range 3 {
			r, w, err := os.Pipe()
			if err != nil {
				return err
			}
			if len(child) == 0 {
				toClose, onFail = append(toClose, r), append(onFail, w)
				child, stdinW = append(child, r), w
			} else {
				toClose, onFail = append(toClose, w), append(onFail, r)
				child = append(child, w)
				if outR == nil {
					outR = r
				} else {
					errR = r
				}
			}
		}
	}
	a := &appProc{plan: p, stdinW: stdinW, done: make(chan struct{}), logged: make(chan struct{})}
	pid, err := s.spawn(p, child, p.TTY, func(ws syscall.WaitStatus) { s.appExited(a, ws) })
	if err != nil {
		return err
	}
	s.mu.Lock()
	a.pid = pid
	s.apps[p.Name] = a
	s.order = append(s.order, p.Name)
	s.mu.Unlock()
	if p.Stdin != nil && stdinW != nil && !p.TTY {
		feedStdin(s, a, p.Stdin)
	}
	if errR == nil {
		a.closed = 1 // a terminal is a single stream
	} else {
		go a.pump(errR, logf, true)
	}
	go a.pump(outR, logf, false)
	s.log.Info("app started", "app", p.Name, "pid", pid, "tty", p.TTY)
	return nil
}

// pump copies one output stream of an app to its log and attached clients.
func (a *appProc) pump(r *os.File, logf *appLog, stderr bool) {
	defer r.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			_, _ = logf.Write(buf[:n])
			a.fanOut(buf[:n], stderr)
		}
		if err != nil {
			break
		}
	}
	a.outMu.Lock()
	defer a.outMu.Unlock()
	a.closed++
	if stderr {
		closeAll(a.errs)
		a.errs = nil
	} else {
		closeAll(a.outs)
		a.outs = nil
	}
	if a.closed == 2 {
		logf.Close()
		close(a.logged)
	}
}

// fanOut writes to every attached client; a client that cannot take the
// data within a second is dropped rather than stalling the app's log.
func (a *appProc) fanOut(b []byte, stderr bool) {
	a.outMu.Lock()
	defer a.outMu.Unlock()
	list := &a.outs
	if stderr {
		list = &a.errs
	}
	kept := (*list)[:0]
	for _, w := range *list {
		_ = w.SetWriteDeadline(time.Now().Add(time.Second))
		if _, err := w.Write(b); err != nil {
			w.Close()
			continue
		}
		kept = append(kept, w)
	}
	*list = kept
}

// appExited records an app's exit once its output is in its log (or after
// logDrainWait), so that whoever sees the app exited in the status finds
// its whole output in the log. It runs on the reaper's goroutine, which
// keeps exits recorded in the order they happened and before a shutdown
// writes the final state; the wait is normally the few microseconds the
// pumps need to reach EOF.
func (s *initServer) appExited(a *appProc, ws syscall.WaitStatus) {
	select {
	case <-a.logged:
	case <-time.After(logDrainWait):
	}
	code, reason := exitOf(ws)
	s.mu.Lock()
	a.exited, a.code, a.reason = true, code, reason
	s.mu.Unlock()
	s.log.Info("app exited", "app", a.plan.Name, "code", code, "reason", reason)
	// State first: shutdown returns once every done is closed, and the
	// stager may exit right after.
	s.writeState()
	close(a.done)
}

// exitOf turns a wait status into an exit code (128+signal when killed)
// and a reason.
func exitOf(ws syscall.WaitStatus) (int, string) {
	if ws.Signaled() {
		return 128 + int(ws.Signal()), "killed"
	}
	return ws.ExitStatus(), "exited"
}

func (s *initServer) status() stagerspec.Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := stagerspec.Status{}
	for _, name := range s.order {
		a := s.apps[name]
		if a.exited {
			code := a.code
			st[name] = stagerspec.AppStatus{Exited: true, ExitCode: &code, ExitReason: a.reason}
		} else {
			st[name] = stagerspec.AppStatus{PID: a.pid}
		}
	}
	return st
}

// shutdown sends TERM to every process of the pod, KILL to what is left
// after grace, and returns once all are gone (or after a last 5 s).
func (s *initServer) shutdown(ctx context.Context, grace time.Duration) {
	s.mu.Lock()
	s.stopping = true
	s.mu.Unlock()
	// Gone from the process table is not yet recorded: the reaper records
	// an exit once the app's output reached its log.
	defer s.waitExitsRecorded(logDrainWait + time.Second)
	if err := unix.Kill(-1, unix.SIGTERM); err != nil {
		return // ESRCH: nothing runs
	}
	if s.waitAllGone(ctx, grace) {
		return
	}
	s.log.Info("grace period over, killing", "grace", grace)
	_ = unix.Kill(-1, unix.SIGKILL)
	s.waitAllGone(context.WithoutCancel(ctx), 5*time.Second)
}

// waitExitsRecorded waits, at most d, until every started app's exit is
// recorded.
func (s *initServer) waitExitsRecorded(d time.Duration) {
	s.mu.Lock()
	var dones []chan struct{}
	for _, a := range s.apps {
		dones = append(dones, a.done)
	}
	s.mu.Unlock()
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for _, done := range dones {
		select {
		case <-done:
		case <-deadline.C:
			return
		}
	}
}

// waitAllGone returns true once no other process is left in the
// namespace, false when d passes or ctx ends first. It checks again each
// time the reaper collected a child: every process of the pod's PID
// namespace is init's child (or reparented to it), so none can vanish
// without a reap.
func (s *initServer) waitAllGone(ctx context.Context, d time.Duration) bool {
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for {
		if err := unix.Kill(-1, 0); errors.Is(err, unix.ESRCH) {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-deadline.C:
			return false
		case <-s.reaped:
		}
	}
}

func (s *initServer) serve(ctx context.Context, ln *net.UnixListener) {
	for {
		c, err := ln.AcceptUnix()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			s.log.Warn("accept", "err", err)
			time.Sleep(50 * time.Millisecond)
			continue
		}
		go s.handle(c)
	}
}

func (s *initServer) handle(c *net.UnixConn) {
	defer c.Close()
	var req request
	files, err := recv(c, &req)
	if err != nil {
		_ = send(c, errResponse(err))
		return
	}
	defer closeAll(files)
	switch req.Op {
	case opStatus:
		_ = send(c, response{Status: s.status()})
	case opRun:
		s.handleRun(c, req, files)
	case opAttach:
		s.handleAttach(c, req)
	default:
		_ = send(c, errResponse(kerrors.New(kerrors.Invalid, "unknown operation %q", req.Op)))
	}
}

func (s *initServer) app(name string) (*appProc, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	a, ok := s.apps[name]
	if !ok {
		return nil, kerrors.New(kerrors.NotFound, "no app %q in this pod", name)
	}
	return a, nil
}

// writeState records the pod's status in StatePath for anyone who cannot
// reach the socket (for instance after init is gone).
// A status identical to the last one written is not written again.
func (s *initServer) writeState() {
	st := s.status()
	s.stateMu.Lock()
	defer s.stateMu.Unlock()
	if s.lastState != nil && reflect.DeepEqual(s.lastState, st) {
		return
	}
	if err := writeStateFile(StatePath, st); err != nil {
		s.log.Warn("write state", "err", err)
		return
	}
	s.lastState = st
}

// drain discards anything more the peer sends and returns when it hangs up.
func drain(c *net.UnixConn) {
	buf := make([]byte, 512)
	for {
		if _, err := c.Read(buf); err != nil {
			return
		}
	}
}
