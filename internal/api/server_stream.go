package api

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"kurma.dev/kurma/internal/pod"
	"kurma.dev/kurma/pkg/appc"
	"kurma.dev/kurma/pkg/kerrors"
	"kurma.dev/kurma/pkg/stagerspec"
)

// session is the server's side of an upgraded connection.
type session struct {
	conn   net.Conn
	fw     *frameWriter
	stdin  *io.PipeReader
	resize chan pod.TermSize
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func wantsUpgrade(r *http.Request) bool {
	return strings.EqualFold(r.Header.Get("Upgrade"), UpgradeProtocol)
}

// upgrade answers 101 and starts reading the client's frames. The session's
// context ends when the client goes away.
func (s *Server) upgrade(w http.ResponseWriter, r *http.Request) (*session, error) {
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return nil, fmt.Errorf("hijack: %w", err)
	}
	if _, err := io.WriteString(conn, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: "+UpgradeProtocol+"\r\nConnection: Upgrade\r\n\r\n"); err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("write upgrade: %w", err)
	}
	pr, pw := io.Pipe()
	ctx, cancel := context.WithCancel(r.Context())
	ss := &session{
		conn: conn, fw: newFrameWriter(conn), stdin: pr,
		resize: make(chan pod.TermSize, 8), ctx: ctx, cancel: cancel,
	}
	ss.wg.Add(1)
	go func() {
		defer ss.wg.Done()
		ss.readLoop(brw.Reader, pw)
	}()
	return ss, nil
}

func (ss *session) readLoop(br *bufio.Reader, stdin *io.PipeWriter) {
	defer ss.cancel()
	stdinOpen := true
	defer func() {
		if stdinOpen {
			_ = stdin.Close()
		}
	}()
	for {
		kind, p, err := readFrame(br)
		if err != nil {
			return
		}
		switch kind {
		case FrameStdin:
			if stdinOpen {
				if _, err := stdin.Write(p); err != nil {
					stdinOpen = false
				}
			}
		case FrameControl:
			c, err := decodeControl(p)
			if err != nil {
				return
			}
			switch c.Type {
			case "resize":
				select {
				case ss.resize <- pod.TermSize{Rows: c.Rows, Cols: c.Cols}:
				default:
				}
			case "stdin-close":
				if stdinOpen {
					stdinOpen = false
					_ = stdin.Close()
				}
			}
		}
	}
}

// finish sends the last control frame and closes the connection.
func (ss *session) finish(code int, err error) {
	if err != nil {
		b := errorBody(err)
		_ = ss.fw.Control(Control{Type: "error", Error: &b.Error})
	} else {
		_ = ss.fw.Control(Control{Type: "exit", Code: code})
	}
	if cw, ok := ss.conn.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	// Give the client a moment to read the last frame and hang up.
	_ = ss.conn.SetReadDeadline(time.Now().Add(2 * time.Second))
	ss.cancel()
	_ = ss.stdin.Close()
	ss.wg.Wait()
	_ = ss.conn.Close()
}

// io returns the streams for one call into the pod manager; release must
// be called when the call returns.
//
// Stdin is handed over as the read end of an OS pipe fed from the client's
// frames: the call-in then reads it directly, and when the process ends the
// manager's wait does not hang on a client that still holds its stdin open
// (exec.Cmd waits for its copier only when Stdin is not an *os.File).
func (ss *session) io(stdin, tty bool) (o pod.IO, release func(), err error) {
	o = pod.IO{Stdout: ss.fw.Stream(FrameStdout), Stderr: ss.fw.Stream(FrameStderr), TTY: tty}
	if tty {
		o.Resize = ss.resize
	}
	if !stdin {
		return o, func() {}, nil
	}
	r, w, err := os.Pipe()
	if err != nil {
		return o, nil, fmt.Errorf("stdin pipe: %w", err)
	}
	go func() {
		_, _ = io.Copy(w, ss.stdin)
		_ = w.Close()
	}()
	o.Stdin = r
	return o, func() { _ = r.Close() }, nil
}

// runPod serves a create with wait: create, stream the first app's output,
// wait for its exit code, remove when asked, send the code.
func (s *Server) runPod(w http.ResponseWriter, r *http.Request, req *CreatePodRequest) {
	if !wantsUpgrade(r) {
		s.writeError(w, r, kerrors.New(kerrors.Invalid, "wait needs an upgrade to %q", UpgradeProtocol))
		return
	}
	t0 := time.Now()
	p, err := s.pods.Create(r.Context(), req.Spec)
	if err != nil {
		s.writeError(w, r, err) // the pod manager's error says "create pod NAME"
		return
	}
	tCreate := time.Since(t0)
	ss, err := s.upgrade(w, r)
	if err != nil {
		s.log.Warn("run: upgrade failed", "pod", p.UUID, "err", err)
		s.removeAfterRun(p, req.Remove)
		return
	}
	_ = ss.fw.Control(Control{Type: "pod", Pod: p})
	t1 := time.Now()
	code, err := s.followRun(ss, p, req)
	tFollow := time.Since(t1)
	t2 := time.Now()
	if req.Remove {
		if rerr := s.removeAfterRun(p, true); rerr != nil && err == nil {
			err = rerr
		}
	}
	s.log.Debug("run timings", "pod", p.UUID, "create", tCreate, "follow", tFollow, "remove", time.Since(t2), "code", code)
	ss.finish(code, err)
}

func (s *Server) removeAfterRun(p *pod.Pod, remove bool) error {
	if !remove {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.pods.Remove(ctx, p.UUID, true); err != nil && !errors.Is(err, kerrors.NotFound) {
		s.log.Warn("run: remove pod", "pod", p.UUID, "err", err)
		return fmt.Errorf("remove pod %s: %w", p.Name, err)
	}
	return nil
}

func (s *Server) followRun(ss *session, p *pod.Pod, req *CreatePodRequest) (int, error) {
	if len(p.Apps) == 0 {
		return 0, kerrors.New(kerrors.Invalid, "pod %s has no apps", p.Name)
	}
	app := p.Apps[0].Name
	tty := len(req.Spec.Apps) > 0 && req.Spec.Apps[0].TTY
	var err error
	switch {
	case tty && req.Stdin:
		err = s.followTerminal(ss, p, app)
	case !req.Stdin:
		// A short-lived app has often finished by the time its pod is
		// ready: then its log is complete and one status call-in gives the
		// code, sparing the follow's polling.
		st, serr := s.settled(ss.ctx, p.UUID)
		if serr == nil {
			if as, ok := st[app]; ok && as.Exited {
				if err := s.pods.Logs(ss.ctx, p.UUID, app, false, ss.fw.Stream(FrameStdout)); err != nil && ss.ctx.Err() == nil {
					return 0, fmt.Errorf("logs: %w", err)
				}
				return exitCode(as), nil
			}
		}
		err = s.followLog(ss, p, app, false)
	default:
		err = s.followLog(ss, p, app, true)
	}
	if err != nil {
		return 0, err
	}
	if ss.ctx.Err() != nil {
		return 0, fmt.Errorf("client went away: %w", ss.ctx.Err())
	}
	return s.waitExit(ss.ctx, p.UUID, app)
}

// settleWaiter is implemented by pod managers that can wait for a pod's
// apps to exit without running call-ins (pod.Runtime.WaitSettled).
type settleWaiter interface {
	WaitSettled(ctx context.Context, ref string, within time.Duration) (stagerspec.Status, bool)
}

// runSettleWait is how long run waits for a short-lived app to end before
// it streams the app's log instead: at most a delay of the first output of
// a long-lived app, about the log follower's own poll period.
const runSettleWait = 100 * time.Millisecond

// settled returns the pod's status once its apps exited, if that happens
// within runSettleWait, and its current status otherwise.
func (s *Server) settled(ctx context.Context, ref string) (stagerspec.Status, error) {
	if w, ok := s.pods.(settleWaiter); ok {
		if st, ok := w.WaitSettled(ctx, ref, runSettleWait); ok {
			return st, nil
		}
	}
	return s.pods.Status(ctx, ref)
}

// followTerminal serves an interactive terminal: attach carries input and
// output. (The app gets its terminal from AppSpec.TTY, which the pod
// manager passes to the stager; a terminal merges stderr into stdout, so the
// call-in's own complaints are not shown.)
func (s *Server) followTerminal(ss *session, p *pod.Pod, app string) error {
	tio, release, err := ss.io(true, true)
	if err != nil {
		return err
	}
	tio.Stderr = io.Discard
	err = s.pods.Attach(ss.ctx, p.UUID, app, tio)
	release()
	if err != nil && ss.ctx.Err() == nil {
		// The app may have ended before attach got there; its output is in
		// its log.
		if lerr := s.pods.Logs(ss.ctx, p.UUID, app, false, ss.fw.Stream(FrameStdout)); lerr != nil {
			return fmt.Errorf("attach: %w", err)
		}
	}
	return nil
}

// followLog streams the app's log until it exits. The log holds the whole
// output from the first byte, so nothing written before we got here is
// lost; with stdin, an attach alongside only feeds the app's stdin.
func (s *Server) followLog(ss *session, p *pod.Pod, app string, stdin bool) error {
	actx, acancel := context.WithCancel(ss.ctx)
	defer acancel()
	var awg sync.WaitGroup
	if stdin {
		sio, release, err := ss.io(true, false)
		if err != nil {
			return err
		}
		sio.Stdout, sio.Stderr = io.Discard, io.Discard
		sio.CloseStdin = true // run -i: the client's EOF ends the app's input
		awg.Add(1)
		go func() {
			defer awg.Done()
			defer release()
			err := s.pods.Attach(actx, p.UUID, app, sio)
			if err != nil && actx.Err() == nil {
				s.log.Debug("run: attach stdin", "pod", p.UUID, "err", err)
			}
		}()
	}
	err := s.pods.Logs(ss.ctx, p.UUID, app, true, ss.fw.Stream(FrameStdout))
	acancel()
	awg.Wait()
	if err != nil && ss.ctx.Err() == nil {
		return fmt.Errorf("logs: %w", err)
	}
	return nil
}

// waitExit polls the status call-in until app has exited and returns its
// exit code (128+9 when it was killed without one).
func (s *Server) waitExit(ctx context.Context, ref, app string) (int, error) {
	delay := s.statusPoll
	for {
		st, err := s.pods.Status(ctx, ref)
		if err != nil {
			// A pod whose stager is gone has no status; its record may.
			if p, gerr := s.pods.Get(ctx, ref); gerr == nil {
				for _, a := range p.Apps {
					if a.Name == app && a.Status != nil && a.Status.Exited {
						return exitCode(*a.Status), nil
					}
				}
			}
			return 0, fmt.Errorf("status: %w", err)
		}
		if as, ok := st[app]; ok && as.Exited {
			return exitCode(as), nil
		}
		if w, ok := s.pods.(settleWaiter); ok {
			// Woken as soon as every app exited, instead of a timer.
			if st, ok := w.WaitSettled(ctx, ref, delay); ok {
				if as, ok := st[app]; ok {
					return exitCode(as), nil
				}
			}
		} else {
			select {
			case <-ctx.Done():
			case <-time.After(delay):
			}
		}
		if ctx.Err() != nil {
			return 0, fmt.Errorf("wait for exit: %w", ctx.Err())
		}
		if delay *= 2; delay > 100*time.Millisecond {
			delay = 100 * time.Millisecond
		}
	}
}

func exitCode(a stagerspec.AppStatus) int {
	if a.ExitCode != nil {
		return *a.ExitCode
	}
	return 128 + 9
}

func (s *Server) handleExec(w http.ResponseWriter, r *http.Request) {
	var req ExecRequest
	if err := decodeJSON(r.Body, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	if len(req.Exec) == 0 || req.Exec[0] == "" {
		s.writeError(w, r, kerrors.New(kerrors.Invalid, "exec: no command"))
		return
	}
	for _, e := range req.Env {
		if !appc.ValidEnvName(e.Name) {
			s.writeError(w, r, kerrors.New(kerrors.Invalid, "exec: invalid environment variable name %q", e.Name))
			return
		}
	}
	if !wantsUpgrade(r) {
		s.writeError(w, r, kerrors.New(kerrors.Invalid, "exec needs an upgrade to %q", UpgradeProtocol))
		return
	}
	ref := r.PathValue("ref")
	p, app, err := s.resolveApp(r, ref, req.App)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	settings := s.runSettings(r.Context(), p, app, &req)
	ss, err := s.upgrade(w, r)
	if err != nil {
		s.log.Warn("exec: upgrade failed", "err", err)
		return
	}
	if req.TTY && req.Rows > 0 && req.Cols > 0 {
		ss.resize <- pod.TermSize{Rows: req.Rows, Cols: req.Cols}
	}
	eio, release, err := ss.io(req.Stdin, req.TTY)
	if err != nil {
		ss.finish(0, err)
		return
	}
	code, err := s.pods.Exec(ss.ctx, p.UUID, app, settings, eio)
	release()
	if err != nil {
		err = fmt.Errorf("exec: %w", err)
	}
	ss.finish(code, err)
}

// runSettings fills an exec request's blanks from the app: user, group,
// working directory and environment from the pod spec, then the image.
func (s *Server) runSettings(ctx context.Context, p *pod.Pod, app string, req *ExecRequest) stagerspec.RunSettings {
	rs := stagerspec.RunSettings{Exec: req.Exec, User: req.User, Group: req.Group,
		WorkingDirectory: req.WorkingDirectory, TTY: req.TTY}
	var spec pod.AppSpec
	var imageID string
	for i, a := range p.Apps {
		if a.Name == app {
			imageID = a.ImageID
			if i < len(p.Spec.Apps) {
				spec = p.Spec.Apps[i]
			}
		}
	}
	var imgApp *appc.App
	if imageID != "" {
		if img, err := s.images.Get(ctx, imageID); err == nil {
			imgApp = img.Manifest.App
		}
	}
	if imgApp == nil {
		imgApp = &appc.App{}
	}
	rs.User = firstNonEmpty(rs.User, spec.User, imgApp.User, "0")
	rs.Group = firstNonEmpty(rs.Group, spec.Group, imgApp.Group, "0")
	rs.WorkingDirectory = firstNonEmpty(rs.WorkingDirectory, spec.WorkingDirectory, imgApp.WorkingDirectory)
	rs.Environment = mergeEnv(imgApp.Environment, spec.Env, req.Env)
	return rs
}

func firstNonEmpty(v ...string) string {
	for _, s := range v {
		if s != "" {
			return s
		}
	}
	return ""
}

// mergeEnv merges environment lists; later lists override earlier names.
func mergeEnv(lists ...[]appc.EnvVar) []appc.EnvVar {
	var out []appc.EnvVar
	idx := map[string]int{}
	for _, l := range lists {
		for _, e := range l {
			if i, ok := idx[e.Name]; ok {
				out[i] = e
				continue
			}
			idx[e.Name] = len(out)
			out = append(out, e)
		}
	}
	return out
}

func (s *Server) handleAttach(w http.ResponseWriter, r *http.Request) {
	var req AttachRequest
	if r.ContentLength != 0 {
		if err := decodeJSON(r.Body, &req); err != nil {
			s.writeError(w, r, err)
			return
		}
	}
	if !wantsUpgrade(r) {
		s.writeError(w, r, kerrors.New(kerrors.Invalid, "attach needs an upgrade to %q", UpgradeProtocol))
		return
	}
	ref := r.PathValue("ref")
	p, app, err := s.resolveApp(r, ref, req.App)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	ss, err := s.upgrade(w, r)
	if err != nil {
		s.log.Warn("attach: upgrade failed", "err", err)
		return
	}
	if req.TTY && req.Rows > 0 && req.Cols > 0 {
		ss.resize <- pod.TermSize{Rows: req.Rows, Cols: req.Cols}
	}
	aio, release, err := ss.io(req.Stdin, req.TTY)
	if err != nil {
		ss.finish(0, err)
		return
	}
	aio.CloseStdin = req.Stdin && req.CloseStdin
	err = s.pods.Attach(ss.ctx, p.UUID, app, aio)
	release()
	if err != nil && ss.ctx.Err() == nil {
		ss.finish(0, fmt.Errorf("attach: %w", err))
		return
	}
	code := 0
	if st, serr := s.pods.Status(ss.ctx, p.UUID); serr == nil {
		if as, ok := st[app]; ok && as.Exited {
			code = exitCode(as)
		}
	}
	ss.finish(code, nil)
}
