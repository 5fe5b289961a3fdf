package stager

import (
	"net"
	"os"
	"syscall"

	"golang.org/x/sys/unix"

	"kurma.dev/kurma/pkg/kerrors"
)

// handleRun starts a process in an app with the caller's descriptors as its
// stdio, answers with its pid, then with its exit code. If the caller hangs
// up first, the process group is killed.
func (s *initServer) handleRun(c *net.UnixConn, req request, files []*os.File) {
	a, err := s.app(req.App)
	if err != nil {
		_ = send(c, errResponse(err))
		return
	}
	if req.Settings == nil {
		_ = send(c, errResponse(kerrors.New(kerrors.Invalid, "run: no settings")))
		return
	}
	if err := req.Settings.Validate(); err != nil {
		_ = send(c, errResponse(kerrors.New(kerrors.Invalid, "run: %v", err)))
		return
	}
	tty := req.Settings.TTY
	switch {
	case tty && len(files) == 1:
		files = []*os.File{files[0], files[0], files[0]}
	case !tty && len(files) == 3:
	default:
		_ = send(c, errResponse(kerrors.New(kerrors.Invalid, "run: got %d descriptors", len(files))))
		return
	}
	plan, err := PlanRun(req.App, a.plan.Rootfs, req.Settings)
	if err != nil {
		_ = send(c, errResponse(err))
		return
	}
	plan.Priv = a.plan.Priv // a call-in is no more privileged than its app
	exited := make(chan syscall.WaitStatus, 1)
	pid, err := s.spawn(plan, files, tty, func(ws syscall.WaitStatus) { exited <- ws })
	if err != nil {
		_ = send(c, errResponse(err))
		return
	}
	closeAll(files)
	s.log.Info("run started", "app", req.App, "pid", pid, "exec", plan.Exec[0])
	if err := send(c, response{PID: pid}); err != nil {
		_ = unix.Kill(-pid, unix.SIGKILL)
	}
	gone := make(chan struct{})
	go func() { drain(c); close(gone) }()
	select {
	case ws := <-exited:
		code, _ := exitOf(ws)
		_ = send(c, response{Exited: true, ExitCode: code})
	case <-gone:
		_ = unix.Kill(-pid, unix.SIGKILL)
		<-exited
	}
}

// handleAttach hands the caller the app's stdin and two fresh pipes that
// receive the app's stdout and stderr from now on. The pipes end when the
// app's output ends; a caller that hangs up is dropped.
func (s *initServer) handleAttach(c *net.UnixConn, req request) {
	a, err := s.app(req.App)
	if err != nil {
		_ = send(c, errResponse(err))
		return
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		_ = send(c, errResponse(err))
		return
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		_ = send(c, errResponse(err))
		return
	}
	a.outMu.Lock()
	if a.closed == 2 {
		a.outMu.Unlock()
		closeAll([]*os.File{outR, outW, errR, errW})
		_ = send(c, errResponse(kerrors.New(kerrors.Conflict, "app %q has exited", req.App)))
		return
	}
	a.outs = append(a.outs, outW)
	a.errs = append(a.errs, errW)
	in, handOver := a.stdinW, false
	if req.CloseStdin && !a.plan.TTY && in != nil {
		// The caller gets the last writer init holds: when it is done,
		// the app reads EOF. (A terminal is never closed: its caller
		// sends the EOF character instead.)
		a.stdinW, handOver = nil, true
	}
	a.outMu.Unlock()
	if in == nil {
		// Stdin was closed by an earlier caller: give a writer whose
		// reader is gone.
		var r *os.File
		if r, in, err = os.Pipe(); err == nil {
			r.Close()
			handOver = true
		}
	}
	err = send(c, response{PID: a.pid, TTY: a.plan.TTY}, in, outR, errR)
	if handOver {
		in.Close()
	}
	outR.Close()
	errR.Close()
	if err == nil {
		drain(c)
	}
	// Caller gone: stop feeding it.
	a.outMu.Lock()
	a.outs = remove(a.outs, outW)
	a.errs = remove(a.errs, errW)
	a.outMu.Unlock()
}

// remove drops f from list and closes it if it was there.
func remove(list []*os.File, f *os.File) []*os.File {
	for i, x := range list {
		if x == f {
			f.Close()
			return append(list[:i], list[i+1:]...)
		}
	}
	return list
}
