package pod

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
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
	// Prestart: the stager image may be pre-started; the helper creates
	// its pod from a pre-started stager and waits for the next before it
	// reports, so that one is waiting when it is killed.
	Prestart bool
}

func helperDaemon(cfg string) int {
	var c helperConfig
	if err := json.Unmarshal([]byte(cfg), &c); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	store := newMemStore()
	appRef, _ := fillStore(store, c.StagerRef, c.StagerRoot, c.AppRoot, c.Prestart)
	c.Opts.Images = store
	ctx := context.Background()
	rt, err := New(ctx, c.Opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	warmID := func() string {
		for range 1000 {
			if id := rt.warmID(); id != "" {
				return id
			}
			time.Sleep(10 * time.Millisecond)
		}
		return ""
	}
	if c.Prestart && warmID() == "" {
		fmt.Fprintln(os.Stderr, "no pre-started stager")
		return 1
	}
	p, err := rt.Create(ctx, Spec{Name: c.P, Apps: []AppSpec{{Image: appRef}}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	next := "-"
	if c.Prestart {
		if next = warmID(); next == "" {
			fmt.Fprintln(os.Stderr, "no second pre-started stager")
			return 1
		}
	}
	fmt.Printf("%s %d %s\n", p.UUID, p.StagerPID, next)
	select {}
}

// warmID is the UUID of the waiting pre-started stager, if any.
func (r *Runtime) warmID() string {
	r.spareMu.Lock()
	defer r.spareMu.Unlock()
	if r.warm == nil {
		return ""
	}
	return r.warm.e.rec.Pod.UUID
}

// TestKill9Recovery kills a real stand-in kurmad process with SIGKILL while
// its pod runs; a new Runtime re-adopts the stager (no longer anyone's
// child here), follows it by pidfd and tears it down cleanly on stop.
//
// With a pre-started stager, the pod was made from one and another waits
// when the daemon dies: it exits by itself (its go-ahead socket reads
// EOF), and the restart rolls its record back like an interrupted create.
func TestKill9Recovery(t *testing.T) {
	for _, prestart := range []bool{false, true} {
		t.Run(map[bool]string{false: "stage-init spare", true: "pre-started stager"}[prestart], func(t *testing.T) {
			testKill9Recovery(t, prestart)
		})
	}
}

func testKill9Recovery(t *testing.T, prestart bool) {
	f := newFixtureWith(t, "with-child", prestart, nil)
	opts := f.opts
	opts.Images = nil
	cfg, err := json.Marshal(helperConfig{Opts: opts, StagerRef: f.opts.StagerImage, StagerRoot: f.stagerRoot, AppRoot: f.appRoot, P: "kpod-k9", Prestart: prestart})
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
	var uuid, next string
	var pid int
	if _, err := fmt.Sscanf(strings.TrimSpace(line), "%s %d %s", &uuid, &pid, &next); err != nil {
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
	// The dead daemon's warm spare stage-init, or pre-started stager, goes
	// away by itself.
	waitFor(t, "orphaned spare to exit", 10*time.Second, func() bool {
		return len(orphanSpares()) == 0
	})
	if prestart {
		rec, err := readRecord(filepath.Join(f.opts.PodsDir, next))
		if err != nil || rec.Pod.State != Creating || rec.Pod.StagerPID == 0 {
			t.Fatalf("the waiting pre-started stager's record: %+v %v", rec, err)
		}
		waitFor(t, "orphaned pre-started stager to exit", 10*time.Second, func() bool {
			st, err := procStartTime(rec.Pod.StagerPID)
			return err != nil || st != rec.StagerStart
		})
	}
	f.reopen(t)
	ctx := t.Context()
	if prestart {
		// Rolled back: folder, mounts, cgroups. (The new Runtime's own
		// pre-started stager is made at once: let it be, then drop it.)
		waitFor(t, "a new pre-started stager", 10*time.Second, func() bool { return f.rt.warmID() != "" })
		f.rt.dropSpare(ctx)
		if d := f.podDirs(t); len(d) != 1 || d[0] != uuid {
			t.Errorf("pod folders after restart: %v, want only %s", d, uuid)
		}
		if l := f.leftovers(next, 0); len(l) > 0 {
			t.Errorf("left of the pre-started stager: %v", l)
		}
	}
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
