package manager

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"kurma.dev/kurma/internal/pod"
	"kurma.dev/kurma/internal/stager"
	"kurma.dev/kurma/pkg/kerrors"
	"kurma.dev/kurma/pkg/stagerspec"
)

// Plugin verbs.
const (
	VerbAdd = "add"
	VerbDel = "del"
)

// maxOutput bounds what a plugin call may print on stdout or stderr.
const maxOutput = 1 << 20

// Output is what a plugin call printed and how it ended.
type Output struct {
	Stdout, Stderr []byte
	Code           int
}

// Caller runs /opt/network/<verb> args for one network with stdin, as root,
// and returns when the process has ended. It must kill the process when
// ctx ends. An error means the call could not be made or did not finish;
// a non-zero exit is Output.Code, not an error.
type Caller interface {
	Call(ctx context.Context, network, verb string, args []string, stdin []byte) (Output, error)
}

// PodCaller runs the calls in the networking pod through the pod manager's
// run call-in: the app is named after the network.
type PodCaller struct {
	Pods pod.Manager
	// Pod is the networking pod's name or UUID.
	Pod string
	// Apps maps a network to its app (AppNames); a network missing from
	// it is its own app's name.
	Apps map[string]string
	// NoDirect always uses the run call-in (benchmarks, tests).
	NoDirect bool
}

// direct runs the call through the default stager's init socket. ok is
// false when that is not possible and nothing was started.
func (c *PodCaller) direct(ctx context.Context, app string, s *stagerspec.RunSettings, stdin []byte) (_ Output, ok bool, _ error) {
	p, err := c.Pods.Get(ctx, c.Pod)
	if err != nil || p.State != pod.Running || p.StagerPID <= 0 {
		return Output{}, false, nil
	}
	sock := stager.HostSocketPath(p.StagerPID)
	if _, err := os.Stat(sock); err != nil {
		return Output{}, false, nil
	}
	var files []*os.File
	defer func() { closeFiles(files) }()
	inR, inW, err := os.Pipe()
	if err != nil {
		return Output{}, false, nil
	}
	files = append(files, inR, inW)
	outR, outW, err := os.Pipe()
	if err != nil {
		return Output{}, false, nil
	}
	files = append(files, outR, outW)
	errR, errW, err := os.Pipe()
	if err != nil {
		return Output{}, false, nil
	}
	files = append(files, errR, errW)
	var out, errb limitedBuffer
	var wg sync.WaitGroup
	wg.Add(3)
	go func() { defer wg.Done(); _, _ = inW.Write(stdin); inW.Close() }()
	go func() { defer wg.Done(); _, _ = io.Copy(&out, outR) }()
	go func() { defer wg.Done(); _, _ = io.Copy(&errb, errR) }()
	code, err := stager.RunAt(ctx, sock, app, s, inR, outW, errW)
	if errors.Is(err, kerrors.Unavailable) && ctx.Err() == nil {
		inR.Close()
		outW.Close()
		errW.Close()
		outR.Close()
		errR.Close()
		wg.Wait()
		return Output{}, false, nil
	}
	// Our copies of the process's ends: its output ends when it does.
	inR.Close()
	outW.Close()
	errW.Close()
	if err != nil {
		// Killed (the init kills the process group when we hang up):
		// do not wait for output of a process tree that may linger.
		outR.Close()
		errR.Close()
	}
	copied := make(chan struct{})
	go func() { wg.Wait(); close(copied) }()
	select {
	case <-copied:
	case <-time.After(2 * time.Second):
		// Something the call started still holds its output open.
		outR.Close()
		errR.Close()
		<-copied
	}
	o := Output{Stdout: out.Bytes(), Stderr: errb.Bytes(), Code: code}
	if err == nil && ctx.Err() != nil {
		err = ctx.Err()
	}
	return o, true, err
}

func closeFiles(fs []*os.File) {
	for _, f := range fs {
		_ = f.Close()
	}
}

var _ Caller = (*PodCaller)(nil)

// Call implements Caller. With the default stager it talks to the pod
// init's socket directly (stager.RunAt through /proc/<stager>/root: the
// same run request /opt/stager/run makes, without starting nsenter and
// the call-in); with another stager, or when that socket is unreachable,
// it uses the run call-in (pod.Manager.Exec).
func (c *PodCaller) Call(ctx context.Context, network, verb string, args []string, stdin []byte) (Output, error) {
	app := network
	if a, ok := c.Apps[network]; ok {
		app = a
	}
	settings := stagerspec.RunSettings{Exec: append([]string{"/opt/network/" + verb}, args...), User: "0", Group: "0"}
	if !c.NoDirect {
		if o, ok, err := c.direct(ctx, app, &settings, stdin); ok {
			return o, err
		}
	}
	var out, errb limitedBuffer
	code, err := c.Pods.Exec(ctx, c.Pod, app, settings, pod.IO{Stdin: bytes.NewReader(stdin), Stdout: &out, Stderr: &errb})
	if err == nil && ctx.Err() != nil {
		err = ctx.Err()
	}
	return Output{Stdout: out.Bytes(), Stderr: errb.Bytes(), Code: code}, err
}

// HostCaller runs <Dirs[network]>/<verb> as a host process with Env (and
// the network's NetEnv) added to its environment: for tests, benchmarks and
// host-privileged plugin images unpacked on the host (hostmode.go). The
// process runs in its own process group, killed as a whole when ctx ends.
// Set Dirs, Env and NetEnv before the first Call, or change a network's
// entry later with SetNetwork.
type HostCaller struct {
	// mu guards Dirs and NetEnv against SetNetwork.
	mu     sync.Mutex
	Dirs   map[string]string
	Env    []string
	NetEnv map[string][]string
}

// SetNetwork points network's calls at dir with env added.
func (c *HostCaller) SetNetwork(network, dir string, env []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.Dirs == nil {
		c.Dirs = map[string]string{}
	}
	if c.NetEnv == nil {
		c.NetEnv = map[string][]string{}
	}
	c.Dirs[network], c.NetEnv[network] = dir, env
}

var _ Caller = (*HostCaller)(nil)

// Call implements Caller.
func (c *HostCaller) Call(ctx context.Context, network, verb string, args []string, stdin []byte) (Output, error) {
	c.mu.Lock()
	dir, ok := c.Dirs[network]
	netEnv := c.NetEnv[network]
	c.mu.Unlock()
	if !ok {
		return Output{}, kerrors.New(kerrors.NotFound, "network %q has no plugin folder", network)
	}
	var out, errb limitedBuffer
	cmd := exec.CommandContext(ctx, filepath.Join(dir, verb), args...)
	cmd.Stdin = bytes.NewReader(stdin)
	cmd.Stdout, cmd.Stderr = &out, &errb
	cmd.Env = append(append([]string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}, c.Env...), netEnv...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = time.Second
	err := cmd.Run()
	o := Output{Stdout: out.Bytes(), Stderr: errb.Bytes()}
	if ctx.Err() != nil {
		return o, ctx.Err()
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		o.Code = ee.ExitCode()
		return o, nil
	}
	if err != nil {
		return o, fmt.Errorf("run %s: %w", verb, err)
	}
	return o, nil
}

// limitedBuffer keeps the first maxOutput bytes written and drops the rest.
type limitedBuffer struct{ bytes.Buffer }

func (b *limitedBuffer) Write(p []byte) (int, error) {
	if room := maxOutput - b.Len(); room > 0 {
		if len(p) > room {
			b.Buffer.Write(p[:room])
		} else {
			b.Buffer.Write(p)
		}
	}
	return len(p), nil
}
