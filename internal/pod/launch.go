package pod

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	image "kurma.dev/kurma/internal/image/imagetypes"
	"kurma.dev/kurma/internal/pod/stageinit"
	"kurma.dev/kurma/pkg/kerrors"
	"kurma.dev/kurma/pkg/stagerspec"
)

// launched is a stager process started by this Runtime.
type launched struct {
	cmd    *exec.Cmd
	goW    *os.File // daemon's end of fd 3
	readyR *os.File // daemon's end of fd 4
	statR  *os.File // daemon's end of fd 5
	log    *os.File
	waited chan struct{} // closed when cmd.Wait returned
	status string        // exit status, set before waited closes
	// mounts are the mounts of a spare's own mount namespace, read just
	// after it started, counted by mountKey.
	mounts map[string]int
}

// prepareStagerRoot makes the pod's view of the stager's root: folders
// for an overlay (lower: the store's extracted stager rootfs, shared and
// read-only; upper: <dir>/stager.upper, the pod's writes) that stage-init
// mounts inside the stager's mount namespace, or, in copy mode, a copy of
// the rootfs at <dir>/stager.
func prepareStagerRoot(ctx context.Context, lower, dir string, copyRoot bool) error {
	root := filepath.Join(dir, "stager")
	if err := os.Mkdir(root, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", root, err)
	}
	if !copyRoot {
		for _, d := range []string{"stager.upper", "stager.work"} {
			if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
				return fmt.Errorf("create %s: %w", d, err)
			}
		}
		return nil
	}
	out, err := exec.CommandContext(ctx, "cp", "-a", "--reflink=auto", lower+"/.", root+"/").CombinedOutput()
	if err != nil {
		return fmt.Errorf("copy stager root: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// overlayWorks reports whether an overlay with its upper folder under dir
// can be mounted (not on every filesystem: e.g. not on overlayfs itself).
func overlayWorks(dir string) bool {
	tmp, err := os.MkdirTemp(dir, ".overlay-probe-")
	if err != nil {
		return false
	}
	defer os.RemoveAll(tmp)
	for _, d := range []string{"l", "u", "w", "m"} {
		if err := os.Mkdir(filepath.Join(tmp, d), 0o755); err != nil {
			return false
		}
	}
	opts := "lowerdir=" + filepath.Join(tmp, "l") + ",upperdir=" + filepath.Join(tmp, "u") + ",workdir=" + filepath.Join(tmp, "w")
	if err := unix.Mount("overlay", filepath.Join(tmp, "m"), "overlay", 0, opts); err != nil {
		return false
	}
	_ = unix.Unmount(filepath.Join(tmp, "m"), unix.MNT_DETACH)
	return true
}

// stagerEnv is the environment of a stager: a PATH, then its image's.
func stagerEnv(st *image.Image) []string {
	env := []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	for _, e := range st.Manifest.App.Environment {
		env = append(env, e.Name+"="+e.Value)
	}
	return env
}

func (b *build) launch(ctx context.Context) error {
	r := b.r
	if b.warm != nil {
		// Started already, in its cgroups, its pid recorded: add the
		// pod's files (under its folder, which a rollback unmounts).
		b.deadline = time.Now().Add(r.opts.ReadyTimeout)
		return b.attachWarm(ctx)
	}
	spec := b.e.rec.Pod.Spec
	hostNet := len(spec.Networks) == 1 && spec.Networks[0] == "host"
	c := stageinit.Config{
		Root:     b.stagerRoot(),
		Overlay:  b.overlay(),
		Hostname: spec.Name,
		HostNet:  hostNet,
		Slave:    spec.VolumePropagation,
		Exec:     b.stager.Manifest.App.Exec,
		Env:      stagerEnv(b.stager),
	}
	for id, p := range b.layers {
		c.Binds = append(c.Binds, stageinit.Bind{Source: p, Target: filepath.Join(stagerspec.LayersDir, id), ReadOnly: true})
	}
	for name, src := range b.volumes {
		c.Binds = append(c.Binds, stageinit.Bind{Source: src, Target: filepath.Join(stagerspec.VolumesDir, name), ReadOnly: b.ro[name]})
	}
	c.Cgroups, c.CgroupV2Only = stagerCgroups(r.cgroups, b.e.rec.Cgroups)
	arg, err := json.Marshal(&c)
	if err != nil {
		return fmt.Errorf("encode stage-init config: %w", err)
	}
	logf, err := os.OpenFile(filepath.Join(b.dir, "stager.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("open stager log: %w", err)
	}
	b.deadline = time.Now().Add(r.opts.ReadyTimeout)
	var p *launched
	if spec.HostUTS {
		c.Hostname = "" // never the host's hostname
	}
	if !hostNet && len(hostShared(spec)) == 0 && !spec.VolumePropagation {
		// A warm spare is already in fresh namespaces, its Go runtime
		// started: hand it the config and the log. (Not for a pod that
		// wants the host's later mounts under its volumes: the spare's
		// copy of the host's mounts may miss the volume's own mount, made
		// after it started, through which they would propagate.)
		if p = r.takeSpare(); p != nil {
			if err := p.configure(arg, logf); err != nil {
				r.log.Debug("spare stage-init unusable; starting a fresh one", "err", err)
				p.abandon()
				p = nil
			}
		}
	}
	if p == nil {
		if p, err = r.spawn(string(arg), logf, hostNet, hostShared(spec)...); err != nil {
			logf.Close()
			return err
		}
	}
	p.log = logf
	b.proc = p
	if err := r.adopt(b.e, p); err != nil {
		return err
	}
	if err := joinCgroups(b.e.rec.Cgroups, p.cmd.Process.Pid); err != nil {
		return err
	}
	return r.save(b.e, false)
}

// spawn starts a stage-init child in new namespaces: arg is its config
// (or stageinit.SpareArg), out its stdout and stderr (nil: /dev/null);
// share lists clone flags of namespaces it keeps from the host
// (hostShared).
func (r *Runtime) spawn(arg string, out *os.File, hostNet bool, share ...uintptr) (*launched, error) {
	sp, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("socketpair: %w", err)
	}
	goW, goR := os.NewFile(uintptr(sp[0]), "stage-init-go"), os.NewFile(uintptr(sp[1]), "stage-init-go-child")
	defer goR.Close()
	readyR, readyW, err := os.Pipe()
	if err != nil {
		goW.Close()
		return nil, fmt.Errorf("pipe: %w", err)
	}
	defer readyW.Close()
	statR, statW, err := os.Pipe()
	if err != nil {
		goW.Close()
		readyR.Close()
		return nil, fmt.Errorf("pipe: %w", err)
	}
	defer statW.Close()
	p := &launched{goW: goW, readyR: readyR, statR: statR, waited: make(chan struct{})}
	cmd := exec.Command(r.opts.Executable, stageinit.Arg, arg)
	if out != nil {
		cmd.Stdout, cmd.Stderr = out, out
	}
	cmd.ExtraFiles = []*os.File{goR, readyW, statW}
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	// A new PID namespace too: stage-init, then the stager it becomes, is
	// its PID 1, so a stager may serve as the pod's init itself (the
	// default stager does: one process start less) and the pod's
	// processes die with it.
	flags := uintptr(unix.CLONE_NEWNS | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC | unix.CLONE_NEWPID)
	if !hostNet {
		flags |= unix.CLONE_NEWNET
	}
	for _, f := range share {
		flags &^= f
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: flags, Setsid: true}
	if err := cmd.Start(); err != nil {
		p.close()
		return nil, fmt.Errorf("start stage-init: %w", err)
	}
	p.cmd = cmd
	go func() {
		err := cmd.Wait()
		p.status = exitStatus(err)
		close(p.waited)
	}()
	return p, nil
}

// configure hands a spare its config and log descriptor.
func (p *launched) configure(arg []byte, logf *os.File) error {
	select {
	case <-p.waited:
		return errors.New("spare exited")
	default:
	}
	sc, err := p.goW.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	err = sc.Write(func(fd uintptr) bool {
		serr = unix.Sendmsg(int(fd), arg, unix.UnixRights(int(logf.Fd())), nil, 0)
		return true
	})
	if err == nil {
		err = serr
	}
	if err != nil {
		return fmt.Errorf("send config to spare: %w", err)
	}
	return nil
}

// abandon kills an unused or unusable stage-init and frees its pipes.
func (p *launched) abandon() {
	if p.cmd != nil {
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
		<-p.waited
	}
	p.close()
}

func exitStatus(err error) string {
	if err == nil {
		return "exit status 0"
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ProcessState.String()
	}
	return err.Error()
}

// kill undoes launch: SIGKILL to the stage-init/stager and wait for it.
func (b *build) kill(ctx context.Context) {
	p := b.proc
	if p == nil {
		return
	}
	if p.cmd != nil {
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
		select {
		case <-p.waited:
		case <-ctx.Done():
		}
	}
	p.close()
	b.r.closePidfd(b.e)
}

// closePidfd releases a pod's pidfd, under mu (see signal).
func (r *Runtime) closePidfd(e *entry) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e.pidfd >= 0 {
		unix.Close(e.pidfd)
		e.pidfd = -1
	}
}

func (p *launched) close() {
	for _, f := range []*os.File{p.goW, p.readyR, p.statR, p.log} {
		if f != nil {
			f.Close()
		}
	}
}

// netnsPath is where the pod's network namespace stays referenced.
func (b *build) netnsPath() string { return filepath.Join(b.dir, "netns") }

func (b *build) bindNetNS(ctx context.Context) error {
	spec := b.e.rec.Pod.Spec
	if len(spec.Networks) == 1 && spec.Networks[0] == "host" {
		return nil
	}
	target := b.netnsPath()
	f, err := os.OpenFile(target, os.O_CREATE|os.O_RDONLY, 0o444)
	if err != nil {
		return fmt.Errorf("create netns reference: %w", err)
	}
	f.Close()
	src := fmt.Sprintf("/proc/%d/ns/net", b.proc.cmd.Process.Pid)
	if err := unix.Mount(src, target, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s: %w", src, err)
	}
	b.r.mu.Lock()
	b.e.rec.Pod.NetNS = target
	b.r.mu.Unlock()
	return nil
}

func (b *build) unbindNetNS(ctx context.Context) {
	if err := unix.Unmount(b.netnsPath(), unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		b.r.log.Warn("unmount netns", "pod", b.e.rec.Pod.UUID, "err", err)
	}
	_ = os.Remove(b.netnsPath())
}

func (b *build) attachNetwork(ctx context.Context) error {
	if b.r.opts.Network == nil {
		return nil
	}
	b.r.mu.Lock()
	p := b.e.snapshot()
	b.r.mu.Unlock()
	nets, err := b.r.opts.Network.Attach(ctx, p)
	if err != nil {
		return fmt.Errorf("attach networks: %w", err)
	}
	b.r.mu.Lock()
	b.e.rec.Pod.Networks = nets
	b.r.mu.Unlock()
	return nil
}

func (b *build) detachNetwork(ctx context.Context) {
	if b.r.opts.Network == nil {
		return
	}
	b.r.mu.Lock()
	p := b.e.snapshot()
	b.r.mu.Unlock()
	if err := b.r.opts.Network.Detach(ctx, p); err != nil {
		b.r.log.Warn("detach networks", "pod", p.UUID, "err", err)
	}
}

// start lets stage-init exec the stager and checks that the exec worked.
// A pre-started stager gets the byte itself (prestart.go).
func (b *build) start(ctx context.Context) error {
	p := b.proc
	if b.warm != nil {
		return p.goAhead()
	}
	_, _ = p.goW.Write([]byte{1})
	p.goW.Close()
	p.goW = nil
	return p.execDone(ctx, b.deadline)
}

// waitReady waits, bounded by ReadyTimeout, for the stager to close fd 4.
func (b *build) waitReady(ctx context.Context) error {
	p := b.proc
	ch := make(chan error, 1)
	go func() {
		var buf [64]byte
		for {
			_, err := p.readyR.Read(buf[:])
			if err != nil {
				ch <- err
				return
			}
		}
	}()
	timer := time.NewTimer(time.Until(b.deadline))
	defer timer.Stop()
	select {
	case err := <-ch:
		if !errors.Is(err, io.EOF) {
			return fmt.Errorf("readiness pipe: %w", err)
		}
	case <-timer.C:
		p.readyR.Close() // ends the reader goroutine
		return kerrors.New(kerrors.Timeout, "stager did not signal readiness (close fd %d) within %v", stagerspec.ReadyFD, b.r.opts.ReadyTimeout)
	case <-ctx.Done():
		p.readyR.Close()
		return fmt.Errorf("waiting for stager readiness: %w", ctx.Err())
	}
	// EOF also comes when the stager dies; tell the two apart. A dying
	// process is marked exiting before its descriptors are closed, so a
	// stager not marked so closed fd 4 itself (if it dies later, watch
	// sees it).
	if !procExiting(p.cmd.Process.Pid) {
		return nil
	}
	select {
	case <-p.waited:
	case <-time.After(time.Second):
	}
	// The stager's last words say why (no such command, user or working
	// directory: the pod's spec, hence Invalid). Rollback removes the pod's
	// folder and its stager.log with it: the log goes to kurmad's.
	logPath := filepath.Join(b.dir, "stager.log")
	reason, tail := stagerReason(logPath)
	b.r.log.Warn("stager exited before it was ready", "pod", b.e.rec.Pod.UUID, "status", p.status, "stager_log", tail)
	if reason == "" {
		return fmt.Errorf("stager exited before it was ready (%s) and gave no reason", p.status)
	}
	err := kerrors.New(kerrors.Invalid, "%s", reason)
	// A stager exits 126 or 127, as shells do, when an app's command
	// cannot be executed: the CLI ends with the same code.
	if st := p.cmd.ProcessState; st != nil && (st.ExitCode() == 126 || st.ExitCode() == 127) {
		return &execFailed{code: st.ExitCode(), err: err}
	}
	return err
}

// execFailed is a pod start that failed because an app's command could
// not be executed; ExitCode is the stager's exit code for it (126: not
// executable, 127: not found), which the API passes on to the CLI.
type execFailed struct {
	code int
	err  error
}

func (e *execFailed) Error() string { return e.err.Error() }
func (e *execFailed) Unwrap() error { return e.err }
func (e *execFailed) ExitCode() int { return e.code }

// stagerReason reads the end of a stager's log: it returns the reason the
// stager gave for failing (its last line of plain text, without Kurma's
// stager's "kurma-stager ROLE: " prefix; structured log lines are skipped)
// and the last lines of the log as they are.
func stagerReason(path string) (reason, tail string) {
	f, err := os.Open(path)
	if err != nil {
		return "", ""
	}
	defer f.Close()
	const window = 4096
	if fi, err := f.Stat(); err == nil && fi.Size() > window {
		_, _ = f.Seek(fi.Size()-window, io.SeekStart)
	}
	b, _ := io.ReadAll(io.LimitReader(f, window))
	tail = strings.TrimSpace(string(b))
	lines := strings.Split(tail, "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		l := strings.TrimSpace(lines[i])
		if l == "" || strings.HasPrefix(l, "time=") || strings.HasPrefix(l, "{") {
			continue
		}
		if rest, ok := strings.CutPrefix(l, "kurma-stager "); ok {
			if _, r, ok := strings.Cut(rest, ": "); ok {
				l = r
			}
		}
		if len(l) > 512 {
			l = l[:512] + "…"
		}
		return l, tail
	}
	return "", tail
}

// watch follows a stager this Runtime started, once the pod runs.
func (p *launched) watch(r *Runtime, e *entry) {
	p.close()
	go func() {
		<-p.waited
		if r.isClosed() {
			return
		}
		r.onExit(e, p.status, p.status == "exit status 0", true)
	}()
}

// onExit settles a pod whose stager has exited: Exited when it exits 0
// after a Stop (or after a Stop with an unknown status: a re-adopted
// stager is not our child), Errored otherwise; its mounts, cgroups and
// netns go away.
func (r *Runtime) onExit(e *entry, status string, clean, known bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r.mu.Lock()
	stopping := e.rec.Stopping
	r.mu.Unlock()
	msg := ""
	switch {
	case stopping && (clean || !known):
	case stopping:
		msg = "stager did not exit cleanly after stop: " + status
	default:
		msg = "stager exited unexpectedly: " + status
	}
	r.finish(ctx, e, msg)
}

// finish tears a pod down and records its end: Errored with msg, or Exited
// when msg is empty.
func (r *Runtime) finish(ctx context.Context, e *entry, msg string) {
	defer r.busy()()
	e.op.Lock()
	defer e.op.Unlock()
	r.teardown(ctx, e)
	r.mu.Lock()
	if msg != "" {
		e.rec.Pod.State = Errored
		e.rec.Pod.Error = msg
	} else {
		e.rec.Pod.State = Exited
	}
	// Apps still running when the pod ended went down with it.
	for i, a := range e.rec.Pod.Apps {
		if a.Status == nil || !a.Status.Exited {
			e.rec.Pod.Apps[i].Status = &stagerspec.AppStatus{Exited: true, ExitReason: "pod ended"}
		}
	}
	e.rec.Pod.Finished = time.Now().UTC()
	removing := e.removing
	r.mu.Unlock()
	// A pod being removed keeps no record: a restart before the removal
	// ends finds its stager gone and ends it again.
	if !removing {
		if err := r.save(e, true); err != nil {
			r.log.Warn("save pod record", "pod", e.rec.Pod.UUID, "err", err)
		}
	}
	select {
	case <-e.exited:
	default:
		close(e.exited)
	}
}

// teardown removes what a pod holds on the host while it runs: the
// remaining processes and cgroups, its network attachments, the netns
// reference and the stager root mount. It is idempotent.
func (r *Runtime) teardown(ctx context.Context, e *entry) {
	t0 := time.Now()
	defer func() { r.log.Debug("pod teardown", "pod", e.rec.Pod.UUID, "took", time.Since(t0)) }()
	r.closePidfd(e)
	r.mu.Lock()
	p := e.snapshot()
	cgs := e.rec.Cgroups
	r.mu.Unlock()
	if err := removeCgroups(cgs); err != nil {
		r.log.Warn("remove cgroups", "pod", p.UUID, "err", err)
	}
	if r.opts.Network != nil && p.NetNS != "" {
		if err := r.opts.Network.Detach(ctx, p); err != nil {
			r.log.Warn("detach networks", "pod", p.UUID, "err", err)
		}
	}
	dir := r.podDir(p.UUID)
	if err := unmountUnder(dir); err != nil {
		r.log.Warn("unmount pod", "pod", p.UUID, "err", err)
	}
	_ = os.Remove(filepath.Join(dir, "netns"))
	r.mu.Lock()
	e.rec.Pod.NetNS = ""
	r.mu.Unlock()
}
