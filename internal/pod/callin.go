package pod

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"

	"github.com/creack/pty"

	"kurma.dev/kurma/pkg/kerrors"
	"kurma.dev/kurma/pkg/stagerspec"
)

// callIn prepares an exec.Cmd that runs a stager call-in inside the
// stager's mount and network namespaces and root, by nsenter (see doc.go).
func (r *Runtime) callIn(ctx context.Context, ref string, path string, args ...string) (*exec.Cmd, *Pod, error) {
	e, err := r.lookup(ref)
	if err != nil {
		return nil, nil, err
	}
	r.mu.Lock()
	p := e.snapshot()
	r.mu.Unlock()
	if p.State != Running {
		return nil, p, kerrors.New(kerrors.Conflict, "pod %s is %s, not running", p.Name, p.State)
	}
	nsenter := r.opts.Nsenter
	if nsenter == "" {
		if nsenter, err = exec.LookPath("nsenter"); err != nil {
			return nil, nil, kerrors.New(kerrors.Unavailable, "nsenter (util-linux) is needed for stager call-ins: %v", err)
		}
	}
	argv := []string{"--target", strconv.Itoa(p.StagerPID), "--mount", "--root", "--wd"}
	if p.NetNS != "" {
		argv = append(argv, "--net")
	}
	argv = append(argv, "--", path)
	argv = append(argv, args...)
	cmd := exec.CommandContext(ctx, nsenter, argv...)
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	return cmd, p, nil
}

// running returns a snapshot of a running pod.
func (r *Runtime) running(ref string) (*Pod, error) {
	e, err := r.lookup(ref)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	p := e.snapshot()
	r.mu.Unlock()
	if p.State != Running {
		return nil, kerrors.New(kerrors.Conflict, "pod %s is %s, not running", p.Name, p.State)
	}
	return p, nil
}

func (r *Runtime) checkApp(p *Pod, app string) error {
	for _, a := range p.Apps {
		if a.Name == app {
			return nil
		}
	}
	return kerrors.New(kerrors.NotFound, "pod %s has no app %q", p.Name, app)
}

// Status runs /opt/stager/status and decodes its JSON.
func (r *Runtime) Status(ctx context.Context, ref string) (stagerspec.Status, error) {
	if p, err := r.running(ref); err == nil {
		// Every app exited: the stager's cache is final, no call-in needed.
		if st, ok := r.settledStatus(p); ok {
			return st, nil
		}
	}
	cmd, p, err := r.callIn(ctx, ref, stagerspec.StatusCallIn)
	if err != nil {
		return nil, err
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("status of pod %s: %w: %s", p.Name, err, strings.TrimSpace(errb.String()))
	}
	var st stagerspec.Status
	if err := json.Unmarshal(out.Bytes(), &st); err != nil {
		return nil, fmt.Errorf("status of pod %s: bad JSON from stager: %w", p.Name, err)
	}
	return st, nil
}

// Exec runs a command in an app through /opt/stager/run, the settings on
// fd 3, and returns the command's exit code.
func (r *Runtime) Exec(ctx context.Context, ref, app string, s stagerspec.RunSettings, stdio IO) (int, error) {
	if s.User == "" {
		s.User = "0"
	}
	if s.Group == "" {
		s.Group = "0"
	}
	s.TTY = s.TTY || stdio.TTY
	if err := s.Validate(); err != nil {
		return -1, kerrors.New(kerrors.Invalid, "run settings: %v", err)
	}
	cmd, p, err := r.callIn(ctx, ref, stagerspec.RunCallIn, app)
	if err != nil {
		return -1, err
	}
	if err := r.checkApp(p, app); err != nil {
		return -1, err
	}
	data, err := json.Marshal(&s)
	if err != nil {
		return -1, fmt.Errorf("encode run settings: %w", err)
	}
	sr, sw, err := os.Pipe()
	if err != nil {
		return -1, fmt.Errorf("pipe: %w", err)
	}
	cmd.ExtraFiles = []*os.File{sr}
	go func() {
		_, _ = sw.Write(data)
		sw.Close()
	}()
	defer sr.Close()
	return runStdio(cmd, stdio)
}

// Logs copies an app's log through /opt/stager/logs APP [-f].
func (r *Runtime) Logs(ctx context.Context, ref, app string, follow bool, w io.Writer) error {
	if p, err := r.running(ref); err == nil && !follow && r.checkApp(p, app) == nil {
		// The log files are readable from the host: no call-in needed.
		if found, err := r.copyHostLogs(p, app, w); found || err != nil {
			if err != nil {
				return fmt.Errorf("logs of %s/%s: %w", p.Name, app, err)
			}
			return nil
		}
	}
	args := []string{app}
	if follow {
		args = append(args, "-f")
	}
	cmd, p, err := r.callIn(ctx, ref, stagerspec.LogsCallIn, args...)
	if errors.Is(err, kerrors.Conflict) && p != nil {
		// No stager to ask: read what it left in the pod's folder.
		return r.storedLogs(p, app, w)
	}
	if err != nil {
		return err
	}
	if err := r.checkApp(p, app); err != nil {
		return err
	}
	var errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = w, &errb
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil && follow {
			return nil
		}
		return fmt.Errorf("logs of %s/%s: %w: %s", p.Name, app, err, strings.TrimSpace(errb.String()))
	}
	return nil
}

// storedLogs copies the log files a stager wrote under its root's /logs
// (the older generation first) for a pod whose stager is gone: they are in
// the overlay's upper folder, or in the copied root.
func (r *Runtime) storedLogs(p *Pod, app string, w io.Writer) error {
	if p.State != Exited {
		return kerrors.New(kerrors.Conflict, "pod %s is %s: no logs yet", p.Name, p.State)
	}
	if err := r.checkApp(p, app); err != nil {
		return err
	}
	if _, err := r.copyHostLogs(p, app, w); err != nil {
		return fmt.Errorf("logs of %s/%s: %w", p.Name, app, err)
	}
	return nil // no file: the app never wrote anything
}

// closeStdinFlag is the default stager's attach option that closes the
// app's stdin at the caller's EOF (internal/stager.CloseStdinFlag; not
// imported: the pod manager does not link the stager).
const closeStdinFlag = "-close-stdin"

// Attach connects stdio to an app through /opt/stager/attach APP
// [-close-stdin].
func (r *Runtime) Attach(ctx context.Context, ref, app string, stdio IO) error {
	args := []string{app}
	if stdio.CloseStdin {
		args = append(args, closeStdinFlag)
	}
	cmd, p, err := r.callIn(ctx, ref, stagerspec.AttachCallIn, args...)
	if err != nil {
		return err
	}
	if err := r.checkApp(p, app); err != nil {
		return err
	}
	code, err := runStdio(cmd, stdio)
	if err != nil {
		return err
	}
	if code != 0 && ctx.Err() == nil {
		return fmt.Errorf("attach to %s/%s: call-in exited with %d", p.Name, app, code)
	}
	return nil
}

// runStdio runs cmd with the caller's streams (through a pty the daemon
// allocates when stdio.TTY is set) and returns its exit code.
func runStdio(cmd *exec.Cmd, stdio IO) (int, error) {
	if !stdio.TTY {
		cmd.Stdin, cmd.Stdout, cmd.Stderr = stdio.Stdin, stdio.Stdout, stdio.Stderr
		if cmd.Stdout == nil {
			cmd.Stdout = io.Discard
		}
		if cmd.Stderr == nil {
			cmd.Stderr = io.Discard
		}
		return exitCode(cmd.Run())
	}
	master, slave, err := pty.Open()
	if err != nil {
		return -1, fmt.Errorf("allocate pty: %w", err)
	}
	defer master.Close()
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	// A size already waiting applies before the command starts.
	if stdio.Resize != nil {
		select {
		case sz, ok := <-stdio.Resize:
			if ok {
				_ = pty.Setsize(master, &pty.Winsize{Rows: sz.Rows, Cols: sz.Cols})
			}
		default:
		}
	}
	if err := cmd.Start(); err != nil {
		slave.Close()
		return -1, fmt.Errorf("start call-in: %w", err)
	}
	slave.Close()
	done := make(chan struct{})
	var wg sync.WaitGroup
	if stdio.Resize != nil {
		go func() {
			for {
				select {
				case sz, ok := <-stdio.Resize:
					if !ok {
						return
					}
					_ = pty.Setsize(master, &pty.Winsize{Rows: sz.Rows, Cols: sz.Cols})
				case <-done:
					return
				}
			}
		}()
	}
	if stdio.Stdin != nil {
		go func() { _, _ = io.Copy(master, stdio.Stdin) }()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		out := stdio.Stdout
		if out == nil {
			out = io.Discard
		}
		_, _ = io.Copy(out, master) // ends with EIO once the slave closes
	}()
	err = cmd.Wait()
	close(done)
	wg.Wait()
	return exitCode(err)
}

func exitCode(err error) (int, error) {
	if err == nil {
		return 0, nil
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode(), nil
	}
	return -1, fmt.Errorf("run call-in: %w", err)
}
