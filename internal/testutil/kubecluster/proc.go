package kubecluster

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// spawner starts processes from one OS thread that has entered the
// cluster's network namespace. Children inherit the thread's namespace,
// and their parent-death signal (SIGKILL) fires when that thread ends: at
// Close, after every process was stopped, or when the test binary dies.
type spawner struct {
	reqs chan func()
	done chan struct{}
}

// newSpawner locks a fresh goroutine to its thread and moves that thread
// into the network namespace at nsPath.
func newSpawner(nsPath string) (*spawner, error) {
	s := &spawner{reqs: make(chan func()), done: make(chan struct{})}
	errc := make(chan error, 1)
	go func() {
		// The thread never returns to the scheduler: it exits with
		// the goroutine, since it is no longer in the host's namespace.
		runtime.LockOSThread()
		defer close(s.done)
		f, err := os.Open(nsPath)
		if err != nil {
			errc <- err
			return
		}
		err = unix.Setns(int(f.Fd()), unix.CLONE_NEWNET)
		_ = f.Close()
		if err != nil {
			errc <- fmt.Errorf("setns %s: %w", nsPath, err)
			return
		}
		errc <- nil
		for req := range s.reqs {
			req()
		}
	}()
	if err := <-errc; err != nil {
		return nil, err
	}
	return s, nil
}

// start runs cmd.Start on the namespace thread.
func (s *spawner) start(cmd *exec.Cmd) error {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	errc := make(chan error, 1)
	select {
	case s.reqs <- func() { errc <- cmd.Start() }:
	case <-s.done:
		return errors.New("spawner stopped")
	}
	return <-errc
}

// do runs f on the namespace thread.
func (s *spawner) do(f func() error) error {
	errc := make(chan error, 1)
	select {
	case s.reqs <- func() { errc <- f() }:
	case <-s.done:
		return errors.New("spawner stopped")
	}
	return <-errc
}

// stop ends the namespace thread; processes still running get SIGKILL.
func (s *spawner) stop() {
	select {
	case <-s.done:
	default:
		close(s.reqs)
		<-s.done
	}
}

// Process is one daemon of the cluster (or of the caller, see
// Cluster.StartProcess).
type Process struct {
	Name string
	Cmd  *exec.Cmd
	// Log is the file that received its stdout and stderr, if the
	// harness opened one.
	Log string

	done    chan struct{}
	waitErr error
	once    sync.Once
	daemon  bool // one of the harness's own (Close stops it last)
}

// PID is the process's id.
func (p *Process) PID() int { return p.Cmd.Process.Pid }

// Done is closed once the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Err is the process's exit error; valid once Done is closed.
func (p *Process) Err() error {
	<-p.done
	return p.waitErr
}

// Kill sends SIGKILL and waits for the exit.
func (p *Process) Kill() {
	_ = p.Cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// Stop sends SIGTERM, waits up to grace for the exit, then kills.
func (p *Process) Stop(grace time.Duration) {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.Cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		p.Kill()
	}
}
