package stager

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"
	"golang.org/x/term"

	"kurma.dev/kurma/pkg/appc"
	"kurma.dev/kurma/pkg/kerrors"
	"kurma.dev/kurma/pkg/stagerspec"
)

// SettingsTimeout is how long /opt/stager/run waits for its settings on
// fd 3, EOF included (the spec's 10 s).
const SettingsTimeout = 10 * time.Second

// maxSettings bounds the run settings so that they fit one packet to init.
const maxSettings = 64 << 10

// SettingsTimeoutEnv overrides SettingsTimeout (a Go duration); tests use
// it to exercise the limit quickly.
const SettingsTimeoutEnv = "KURMA_STAGER_SETTINGS_TIMEOUT"

// Status writes the pod's status JSON to w. When the pod init cannot be
// reached it reports the last state init recorded.
func Status(ctx context.Context, w io.Writer) error {
	st, err := queryStatus(ctx, SocketPath)
	if err != nil {
		var e2 error
		if st, e2 = readStateFile(StatePath); e2 != nil {
			return err
		}
	}
	enc := json.NewEncoder(w)
	return enc.Encode(st)
}

// StatusAt asks the pod init at sock (HostSocketPath) for the pod's
// status: the daemon's shortcut past nsenter and /opt/stager/status, as
// RunAt is for run. An error of category Unavailable means init could not
// be reached.
func StatusAt(ctx context.Context, sock string) (stagerspec.Status, error) {
	return queryStatus(ctx, sock)
}

func queryStatus(ctx context.Context, sock string) (stagerspec.Status, error) {
	c, err := dial(sock)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	if d, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(d)
	}
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Now()) })
	defer stop()
	if err := send(c, request{Op: opStatus}); err != nil {
		return nil, err
	}
	var resp response
	files, err := recv(c, &resp)
	closeAll(files)
	if err != nil {
		return nil, err
	}
	return resp.Status, resp.err()
}

// Logs copies an app's log to w. With follow it keeps streaming new output
// until the app has exited and its log is drained, ctx ends, or w fails
// (the caller went away).
func Logs(ctx context.Context, app string, follow bool, w io.Writer) error {
	if !appc.ValidACName(app) {
		return kerrors.New(kerrors.Invalid, "invalid app name %q", app)
	}
	lr, err := openLogs(app, w)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return kerrors.New(kerrors.NotFound, "no app %q in this pod", app)
		}
		return err
	}
	defer lr.Close()
	if !follow {
		return nil
	}
	out, _ := w.(*os.File)
	cw := newChangeWaiter()
	defer cw.Close()
	for {
		exited := appExited(app)
		if err := lr.follow(w); err != nil {
			return err
		}
		if exited {
			return nil
		}
		if out != nil && readerGone(out) {
			return nil
		}
		cw.wait(ctx)
		if ctx.Err() != nil {
			return nil
		}
	}
}

// changeWaiter wakes a log follower when something is written to the logs
// folder or init rewrites its state file (an app exited), by inotify;
// without inotify it falls back to a 100 ms period.
type changeWaiter struct {
	f *os.File // the inotify descriptor, nil when unavailable
}

// changeWaitMax bounds one wait, so that a follower still notices a
// reader that went away while the app is silent.
const changeWaitMax = 500 * time.Millisecond

func newChangeWaiter() *changeWaiter {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return &changeWaiter{}
	}
	_, err1 := unix.InotifyAddWatch(fd, LogsDir, unix.IN_MODIFY|unix.IN_CREATE|unix.IN_MOVED_TO)
	_, err2 := unix.InotifyAddWatch(fd, filepath.Dir(StatePath), unix.IN_MOVED_TO|unix.IN_CLOSE_WRITE)
	if err1 != nil || err2 != nil {
		unix.Close(fd)
		return &changeWaiter{}
	}
	return &changeWaiter{f: os.NewFile(uintptr(fd), "inotify")}
}

// wait returns after a change, ctx's end or the time limit, whichever
// comes first.
func (c *changeWaiter) wait(ctx context.Context) {
	if c.f == nil {
		t := time.NewTimer(100 * time.Millisecond)
		defer t.Stop()
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		return
	}
	if err := c.f.SetReadDeadline(time.Now().Add(changeWaitMax)); err != nil {
		return
	}
	stop := context.AfterFunc(ctx, func() { _ = c.f.SetReadDeadline(time.Now()) })
	defer stop()
	var buf [4096]byte
	_, _ = c.f.Read(buf[:]) // drains the events that woke us
}

func (c *changeWaiter) Close() {
	if c.f != nil {
		c.f.Close()
	}
}

// appExited reports whether the app is known to have exited (or the pod
// init is gone, which means the same).
func appExited(app string) bool {
	st, err := queryStatus(context.Background(), SocketPath)
	if err != nil {
		if st, err = readStateFile(StatePath); err != nil {
			return true
		}
	}
	a, ok := st[app]
	return !ok || a.Exited
}

// readerGone reports whether the read end of the pipe or socket f writes
// to has been closed.
func readerGone(f *os.File) bool {
	fds := []unix.PollFd{{Fd: int32(f.Fd()), Events: 0}}
	n, err := unix.Poll(fds, 0)
	return err == nil && n > 0 && fds[0].Revents&(unix.POLLERR|unix.POLLHUP) != 0
}

// ReadSettings reads the run settings from f, which must deliver all of
// them, EOF included, within timeout.
func ReadSettings(f *os.File, timeout time.Duration) (*stagerspec.RunSettings, error) {
	if err := f.SetReadDeadline(time.Now().Add(timeout)); err != nil && !errors.Is(err, os.ErrNoDeadline) {
		return nil, fmt.Errorf("settings fd: %w", err)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxSettings+1))
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return nil, kerrors.New(kerrors.Timeout, "run settings not received within %s", timeout)
	}
	if err != nil {
		return nil, fmt.Errorf("read run settings: %w", err)
	}
	if len(b) > maxSettings {
		return nil, kerrors.New(kerrors.Invalid, "run settings larger than %d bytes", maxSettings)
	}
	return ParseRunSettings(b)
}

// SettingsFile opens descriptor fd for ReadSettings in non-blocking mode so
// a deadline applies.
func SettingsFile(fd int) (*os.File, error) {
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != nil {
		return nil, kerrors.New(kerrors.Invalid, "run settings descriptor %d is not open", fd)
	}
	_ = unix.SetNonblock(fd, true)
	return os.NewFile(uintptr(fd), "settings"), nil
}

// Run runs a process in app with settings s, stdio passed straight to it
// (or through a new terminal when s.TTY), and returns its exit code.
func Run(ctx context.Context, app string, s *stagerspec.RunSettings, stdin, stdout, stderr *os.File) (int, error) {
	return RunAt(ctx, SocketPath, app, s, stdin, stdout, stderr)
}

// HostSocketPath is where a process outside the stager's mount namespace
// (the daemon) reaches the init socket of the stager with host PID pid.
func HostSocketPath(pid int) string {
	return filepath.Join("/proc", strconv.Itoa(pid), "root", SocketPath)
}

// RunAt is Run against the pod init's socket at sock (HostSocketPath):
// the daemon's shortcut past nsenter and /opt/stager/run. An error of
// category Unavailable means nothing was started.
func RunAt(ctx context.Context, sock, app string, s *stagerspec.RunSettings, stdin, stdout, stderr *os.File) (int, error) {
	c, err := dial(sock)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	req := request{Op: opRun, App: app, Settings: s}
	var master *os.File
	if s.TTY {
		if !appc.ValidACName(app) {
			return 0, kerrors.New(kerrors.Invalid, "invalid app name %q", app)
		}
		m, slave, err := openPTY(PTYPath(app))
		if err != nil {
			return 0, fmt.Errorf("allocate tty: %w", err)
		}
		master = m
		defer master.Close()
		if term.IsTerminal(int(stdin.Fd())) {
			_ = pty.InheritSize(stdin, master)
		}
		err = send(c, req, slave)
		slave.Close()
		if err != nil {
			return 0, err
		}
	} else if err := send(c, req, stdin, stdout, stderr); err != nil {
		return 0, err
	}
	var resp response
	if _, err := recv(c, &resp); err != nil {
		return 0, fmt.Errorf("run: %w", err)
	}
	if err := resp.err(); err != nil {
		return 0, err
	}
	copied := make(chan struct{})
	if master != nil {
		restore := relayTTY(stdin, master)
		defer restore()
		go func() { _, _ = io.Copy(stdout, master); close(copied) }()
	} else {
		close(copied)
	}
	exit := make(chan response, 1)
	go func() {
		var r response
		if _, err := recv(c, &r); err != nil {
			r = response{Error: err.Error()}
		}
		exit <- r
	}()
	select {
	case <-ctx.Done():
		return 0, ctx.Err()
	case r := <-exit:
		if r.Error != "" {
			return 0, fmt.Errorf("run: %w", r.err())
		}
		select {
		case <-copied:
		case <-time.After(2 * time.Second):
		}
		return r.ExitCode, nil
	}
}

// relayTTY feeds stdin into the terminal, in raw mode and following size
// changes when stdin is itself a terminal. Size changes are polled too:
// the daemon's terminal does not make us its foreground process group, so
// SIGWINCH may never reach us.
func relayTTY(stdin, master *os.File) func() {
	restore := followTerminal(stdin, master)
	go func() { _, _ = io.Copy(master, stdin) }()
	return restore
}

// followTerminal puts stdin in raw mode and keeps master's size equal to
// stdin's, when stdin is a terminal (see relayTTY).
func followTerminal(stdin, master *os.File) func() {
	restore := func() {}
	fd := int(stdin.Fd())
	if term.IsTerminal(fd) {
		if old, err := term.MakeRaw(fd); err == nil {
			restore = func() { _ = term.Restore(fd, old) }
		}
		winch := make(chan os.Signal, 1)
		signal.Notify(winch, syscall.SIGWINCH)
		stop := make(chan struct{})
		go func() {
			tick := time.NewTicker(250 * time.Millisecond)
			defer tick.Stop()
			var last *pty.Winsize
			if sz, err := pty.GetsizeFull(stdin); err == nil && sz.Rows > 0 && sz.Cols > 0 {
				_ = pty.Setsize(master, sz)
				last = sz
			}
			for {
				select {
				case <-stop:
					return
				case <-winch:
				case <-tick.C:
				}
				if sz, err := pty.GetsizeFull(stdin); err == nil && (last == nil || *sz != *last) {
					_ = pty.Setsize(master, sz)
					last = sz
				}
			}
		}()
		prev := restore
		restore = func() { close(stop); signal.Stop(winch); prev() }
	}
	return restore
}

// Attach connects stdin, stdout and stderr to the app's. It returns when
// the app's output ends (the app exited) or stdout/stderr can no longer be
// written. The caller's EOF on stdin detaches input only and the app's
// stdin stays open, unless closeStdin is set: then that EOF closes the
// app's stdin (for an app with a terminal: sends it the EOF character).
func Attach(ctx context.Context, app string, closeStdin bool, stdin, stdout, stderr *os.File) error {
	c, err := dial(SocketPath)
	if err != nil {
		return err
	}
	defer c.Close()
	if err := send(c, request{Op: opAttach, App: app, CloseStdin: closeStdin}); err != nil {
		return err
	}
	var resp response
	files, err := recv(c, &resp)
	if err != nil {
		return fmt.Errorf("attach: %w", err)
	}
	defer closeAll(files)
	if err := resp.err(); err != nil {
		return err
	}
	if len(files) != 3 {
		return kerrors.New(kerrors.Invalid, "attach: got %d descriptors", len(files))
	}
	appIn, appOut, appErr := files[0], files[1], files[2]
	if resp.TTY {
		// appIn is the app's terminal: follow the caller's size, and pass
		// keys through raw (the caller's own terminal must not cook them).
		defer followTerminal(stdin, appIn)()
	}
	go func() {
		_, _ = io.Copy(appIn, stdin)
		if closeStdin {
			if resp.TTY {
				_, _ = appIn.Write([]byte{4}) // ^D: EOF in canonical mode
				return
			}
			appIn.Close()
		}
	}()
	// Output ends when every stream of the app ended (a terminal is one
	// stream); the caller leaves when a write to it fails.
	done := make(chan error, 2)
	streams := 2
	go func() { _, err := io.Copy(stdout, appOut); done <- err }()
	if resp.TTY {
		streams = 1
	} else {
		go func() { _, err := io.Copy(stderr, appErr); done <- err }()
	}
	for range streams {
		select {
		case <-ctx.Done():
			return nil
		case err := <-done:
			if err != nil {
				return nil
			}
		}
	}
	return nil
}
