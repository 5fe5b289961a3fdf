package manager

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os/exec"
	"syscall"
	"time"
)

// HostMain keeps one network's plugin main executable running as a host
// process (host mode): the network's config on its stdin, Env added to its
// environment. While it runs the network is Running; when it exits the
// network is Failed with the exit status and it is restarted after a
// backoff (MinBackoff doubling to MaxBackoff, reset after MaxBackoff of
// good running).
type HostMain struct {
	Manager *Manager
	Network string
	// Argv is the executable and its arguments (host paths).
	Argv []string
	Env  []string
	// MinBackoff, MaxBackoff default to DefaultMinBackoff, DefaultMaxBackoff.
	MinBackoff, MaxBackoff time.Duration
	// OnStart, when set, is told each started process's PID (tests).
	OnStart func(pid int)
}

// Run supervises until ctx ends, then kills the process group.
func (h *HostMain) Run(ctx context.Context) error {
	n, err := h.Manager.network(h.Network)
	if err != nil {
		return err
	}
	if len(h.Argv) == 0 {
		return errors.New("host main: empty argv")
	}
	minB, maxB := h.MinBackoff, h.MaxBackoff
	if minB <= 0 {
		minB = DefaultMinBackoff
	}
	if maxB < minB {
		maxB = max(DefaultMaxBackoff, minB)
	}
	log := h.Manager.log.With("network", h.Network)
	backoff := minB
	for {
		h.Manager.SetState(h.Network, Starting, "")
		started := time.Now()
		reason := h.runOnce(ctx, n.Config, log)
		if ctx.Err() != nil {
			return nil
		}
		h.Manager.SetState(h.Network, Failed, reason)
		if time.Since(started) >= maxB {
			backoff = minB
		}
		log.Warn("network plugin main failed; restarting", "reason", reason, "backoff", backoff)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, maxB)
	}
}

func (h *HostMain) runOnce(ctx context.Context, config []byte, log *slog.Logger) string {
	var errb limitedBuffer
	cmd := exec.CommandContext(ctx, h.Argv[0], h.Argv[1:]...)
	cmd.Stdin = bytes.NewReader(config)
	cmd.Stdout, cmd.Stderr = &errb, &errb
	cmd.Env = append([]string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}, h.Env...)
	// Pdeathsig: a kurmad killed with SIGKILL must not leave its plugin
	// mains behind (a restarted kurmad starts its own).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = time.Second
	if err := cmd.Start(); err != nil {
		return fmt.Sprintf("start plugin main executable: %v", err)
	}
	if h.OnStart != nil {
		h.OnStart(cmd.Process.Pid)
	}
	h.Manager.SetState(h.Network, Running, "")
	err := cmd.Wait()
	reason := "plugin main executable exited"
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		reason += ": " + ee.ProcessState.String()
	} else if err != nil {
		reason += ": " + err.Error()
	}
	if tail := lastLine(errb.Bytes()); tail != "" {
		reason += " (" + tail + ")"
	}
	return reason
}

// lastLine is the last non-empty line of b, clipped.
func lastLine(b []byte) string {
	lines := bytes.Split(bytes.TrimSpace(b), []byte("\n"))
	return clip(string(bytes.TrimSpace(lines[len(lines)-1])))
}
