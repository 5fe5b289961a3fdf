package netplugin_test

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/google/uuid"

	"kurma.dev/kurma/internal/testutil"
)

// syncBuffer is a bytes.Buffer safe to read while a process writes it.
type syncBuffer struct {
	ch  chan struct{}
	buf bytes.Buffer
}

func newSyncBuffer() *syncBuffer {
	b := &syncBuffer{ch: make(chan struct{}, 1)}
	b.ch <- struct{}{}
	return b
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	<-b.ch
	defer func() { b.ch <- struct{}{} }()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	<-b.ch
	defer func() { b.ch <- struct{}{} }()
	return b.buf.String()
}

// startMain starts the image's main executable in the host namespace.
func (e *env) startMain(conf []byte, gc time.Duration) (*exec.Cmd, *syncBuffer) {
	e.t.Helper()
	logs := newSyncBuffer()
	cmd := exec.Command(e.main)
	cmd.Stdin = bytes.NewReader(conf)
	cmd.Stdout, cmd.Stderr = logs, logs
	cmd.Env = append(os.Environ(), "KURMA_CNI_PATH="+e.cniPath, "KURMA_NETWORK_STATE_DIR="+e.state,
		"KURMA_NETPLUGIN_GC_INTERVAL="+gc.String())
	if err := e.host.Do(func(ns.NetNS) error { return cmd.Start() }); err != nil {
		e.t.Fatal(err)
	}
	pid := cmd.Process.Pid
	e.t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			_ = cmd.Wait()
		}
	})
	return cmd, logs
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestMainExecGCAndSIGTERM(t *testing.T) {
	e := newEnv(t)
	conf := e.bridgeConf(nil)
	cmd, logs := e.startMain(conf, 100*time.Millisecond)
	waitFor(t, "netplugin ready", func() bool { return strings.Contains(logs.String(), "netplugin ready") })

	keep := testutil.NewNetNS(t)
	gone := testutil.NewNetNS(t)
	keepID, goneID := uuid.NewString(), uuid.NewString()
	e.mustAdd(conf, keep, keepID, "eth0")
	e.mustAdd(conf, gone, goneID, "eth0")
	if a := e.allocated(); len(a) != 2 {
		t.Fatalf("allocated %v", a)
	}
	// The dead pod is on a second network too, served by another plugin
	// container sharing the state dir: this main must leave it alone.
	other := e.bridgeConf(map[string]any{"name": e.netName + "b"})
	e.mustAdd(other, gone, goneID, "net1")
	// The pod dies without a del: its namespace goes away.
	if err := gone.Close(); err != nil {
		t.Fatal(err)
	}
	if err := testutil.RemoveNetNS(gone.Path()); err != nil {
		t.Fatal(err)
	}
	// The gc is done when it has logged; by then the address, the cache
	// entry and the lock file must be gone.
	waitFor(t, "gc of the dead pod", func() bool { return strings.Contains(logs.String(), goneID) })
	if a := e.allocated(); len(a) != 1 {
		t.Fatalf("allocated after gc %v, want the live pod's only", a)
	}
	if v := links(t, e.host, "veth"); len(v) != 1 {
		t.Fatalf("veths after gc %v, want one (the live pod's)", v)
	}
	if l := e.leftovers(); hasPrefix(l, "cache/results/"+e.netName+"-"+goneID) || hasPrefix(l, "locks/"+e.netName+"_"+goneID) {
		t.Fatalf("state of dead pod left: %v", l)
	}
	if l := e.leftovers(); !hasPrefix(l, "cache/results/"+e.netName+"-"+keepID) {
		t.Fatalf("gc removed the live pod's cache: %v", l)
	}
	if l := e.leftovers(); !hasPrefix(l, "cache/results/"+e.netName+"b-"+goneID) {
		t.Fatalf("gc removed another network's attachment: %v", l)
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("main exited with %v\n%s", err, logs.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("main did not stop on SIGTERM")
	}
	// The live pod's attachment is untouched.
	if a := e.allocated(); len(a) != 1 {
		t.Fatalf("allocated after stop %v", a)
	}
}

func TestMainExecRejectsBadConfig(t *testing.T) {
	e := newEnv(t)
	tests := []struct {
		name string
		conf []byte
		want string
	}{
		{"not json", []byte("nope"), "read config"},
		{"missing plugin", e.bridgeConf(map[string]any{"type": "knetnosuchplugin"}), "knetnosuchplugin"},
		{"bad name", e.bridgeConf(map[string]any{"name": "a b"}), "network name"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cmd, logs := e.startMain(tc.conf, time.Minute)
			err := cmd.Wait()
			if err == nil {
				t.Fatal("main accepted a bad config")
			}
			if !strings.Contains(logs.String(), tc.want) {
				t.Fatalf("log does not mention %q:\n%s", tc.want, logs.String())
			}
		})
	}
}

func TestMainExecKeepsRunningOnOpenStdin(t *testing.T) {
	// The config is one JSON value; main must not wait for EOF.
	e := newEnv(t)
	conf, _ := json.Marshal(map[string]any{"cniVersion": "1.0.0", "name": e.netName, "type": "loopback"})
	logs := newSyncBuffer()
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pr.Close(); pw.Close() })
	cmd := exec.Command(e.main)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = pr, logs, logs
	cmd.Env = append(os.Environ(), "KURMA_CNI_PATH="+e.cniPath, "KURMA_NETWORK_STATE_DIR="+e.state)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL); _ = cmd.Wait() })
	if _, err := pw.Write(conf); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "netplugin ready", func() bool { return strings.Contains(logs.String(), "netplugin ready") })
}
