package pod

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"kurma.dev/kurma/internal/pod/stageinit"
)

// helperEnv makes the test binary act as a stand-in kurmad (helperDaemon):
// it opens a Runtime, creates one pod, prints "<uuid> <pid>" and blocks
// until it is killed.
const helperEnv = "KPOD_HELPER_DAEMON"

type helperConfig struct {
	Opts                              Options
	StagerRef, StagerRoot, AppRoot, P string
}

func helperDaemon(cfg string) int {
	var c helperConfig
	if err := json.Unmarshal([]byte(cfg), &c); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	store := newMemStore()
	appRef, _ := fillStore(store, c.StagerRef, c.StagerRoot, c.AppRoot)
	c.Opts.Images = store
	ctx := context.Background()
	rt, err := New(ctx, c.Opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	p, err := rt.Create(ctx, Spec{Name: c.P, Apps: []AppSpec{{Image: appRef}}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Printf("%s %d\n", p.UUID, p.StagerPID)
	select {}
}

// TestKill9Recovery kills a real stand-in kurmad process with SIGKILL while
// its pod runs; a new Runtime re-adopts the stager (no longer anyone's
// child here), follows it by pidfd and tears it down cleanly on stop.
func TestKill9Recovery(t *testing.T) {
	f := newFixture(t, "with-child", nil)
	opts := f.opts
	opts.Images = nil
	cfg, err := json.Marshal(helperConfig{Opts: opts, StagerRef: f.opts.StagerImage, StagerRoot: f.stagerRoot, AppRoot: f.appRoot, P: "kpod-k9"})
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), helperEnv+"="+string(cfg))
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("helper daemon: %v", err)
	}
	var uuid string
	var pid int
	if _, err := fmt.Sscanf(strings.TrimSpace(line), "%s %d", &uuid, &pid); err != nil {
		t.Fatalf("helper said %q: %v", line, err)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	// The stager outlives its daemon (own session, reparented).
	if _, err := procStartTime(pid); err != nil {
		t.Fatalf("stager died with its daemon: %v", err)
	}
	// The dead daemon's warm spare stage-init goes away by itself.
	waitFor(t, "orphaned spare to exit", 10*time.Second, func() bool {
		return len(orphanSpares()) == 0
	})
	f.reopen(t)
	ctx := t.Context()
	p, err := f.rt.Get(ctx, "kpod-k9")
	if err != nil || p.UUID != uuid || p.State != Running || p.StagerPID != pid {
		t.Fatalf("after restart: %+v %v", p, err)
	}
	if st, err := f.rt.Status(ctx, uuid); err != nil || len(st) != 1 {
		t.Errorf("status after restart: %v %v", st, err)
	}
	if l, _ := f.rt.List(ctx); len(l) != 1 {
		t.Errorf("pods after restart: %d", len(l))
	}
	// Reopening again must not duplicate anything either.
	f.reopen(t)
	if l, _ := f.rt.List(t.Context()); len(l) != 1 {
		t.Errorf("pods after second restart: %d", len(l))
	}
	if err := f.rt.Stop(ctx, uuid, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if g, _ := f.rt.Get(ctx, uuid); g.State != Exited {
		t.Errorf("after stop: %+v", g)
	}
	if l := f.runtimeLeftovers(uuid, pid); len(l) > 0 {
		t.Errorf("left after stop: %v", l)
	}
}

// orphanSpares lists spare stage-init processes of this test binary that
// are not children of this process.
func orphanSpares() []string {
	var out []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || !strings.HasPrefix(string(b), os.Args[0]+"\x00"+stageinit.Arg+"\x00"+stageinit.SpareArg) {
			continue
		}
		st, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		f := strings.Fields(string(st[strings.LastIndexByte(string(st), ')')+1:]))
		if len(f) > 1 && f[1] != strconv.Itoa(os.Getpid()) && f[0] != "Z" {
			out = append(out, e.Name())
		}
	}
	return out
}
