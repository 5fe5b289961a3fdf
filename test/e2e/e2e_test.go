package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"kurma.dev/kurma/internal/cli"
	"kurma.dev/kurma/internal/pod"
	"kurma.dev/kurma/internal/testutil"
	"kurma.dev/kurma/pkg/stagerspec"
)

// TestE2E runs the acceptance scenarios against one daemon; the restart
// scenario has its own daemon.
func TestE2E(t *testing.T) {
	testutil.RequireRoot(t)
	if testing.Short() {
		t.Skip("end-to-end")
	}
	b := findBins(t)
	src := serveBusybox(t)

	t.Run("restart", func(t *testing.T) {
		t.Parallel()
		testRestart(t, b, src)
	})

	t.Run("initial-pods", func(t *testing.T) {
		t.Parallel()
		testInitialPods(t, b, src)
	})

	d := startDaemon(t, b)
	// Pull once so the parallel runs below don't race the first pull.
	for _, u := range []string{src.aci, src.ociLayout, src.docker, src.http} {
		d.ok(t, "image", "pull", u)
	}

	t.Run("socket", func(t *testing.T) {
		fi, err := os.Stat(d.sock)
		must(t, err)
		st := fi.Sys().(*syscall.Stat_t)
		if fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o660 || st.Uid != 0 || st.Gid != 0 {
			t.Fatalf("socket %v uid %d gid %d, want socket 0660 root:root", fi.Mode(), st.Uid, st.Gid)
		}
	})

	t.Run("prestarted-stager", func(t *testing.T) {
		// The default stager image declares it may be pre-started: kurmad
		// keeps one waiting, its child, with a record of a pod in waiting
		// (state creating, no name yet).
		eventually(t, 10*time.Second, func() error {
			recs, _ := filepath.Glob(filepath.Join(d.dir, "pods", "*", "pod.json"))
			for _, r := range recs {
				var rec struct {
					Pod struct {
						Name, State string
						StagerPID   int `json:"stagerPID"`
					} `json:"pod"`
				}
				if b, err := os.ReadFile(r); err != nil || json.Unmarshal(b, &rec) != nil {
					continue
				}
				if rec.Pod.State == "creating" && rec.Pod.Name == "" && rec.Pod.StagerPID > 0 {
					return childWithCmdline(d, "/stager\x00", rec.Pod.StagerPID)
				}
			}
			return fmt.Errorf("no pod in waiting among %v", recs)
		})
	})

	t.Run("stage-init-binary", func(t *testing.T) {
		// Without pre-started stagers, kurmad keeps a warm spare started
		// from kurma-stage-init beside it, not from a re-execution of its
		// own (larger) binary.
		d := startDaemon(t, b, "prestartStager: false\n")
		want := filepath.Join(filepath.Dir(b.kurmad), pod.StageInitBinary) + "\x00stage-init\x00-spare\x00"
		eventually(t, 10*time.Second, func() error { return childWithCmdline(d, want, 0) })
	})

	t.Run("group", func(t *testing.T) {
		for name, uri := range map[string]string{"docker": src.docker, "oci-layout": src.ociLayout, "aci": src.aci, "http": src.http} {
			t.Run("run-"+name, func(t *testing.T) {
				t.Parallel()
				out := d.ok(t, "run", "--rm", uri, "echo", "hello from "+name)
				if out != "hello from "+name+"\n" {
					t.Fatalf("output %q", out)
				}
			})
		}
		t.Run("run-exit-code", func(t *testing.T) {
			t.Parallel()
			out, _, code := d.kurma("run", "--rm", src.aci, "sh", "-c", "echo bye; exit 7")
			if code != 7 || out != "bye\n" {
				t.Fatalf("exit %d output %q, want 7 %q", code, out, "bye\n")
			}
		})
		t.Run("two-apps", func(t *testing.T) { t.Parallel(); testTwoApps(t, d, src) })
		t.Run("exec", func(t *testing.T) { t.Parallel(); testExec(t, d, src) })
		t.Run("logs-follow", func(t *testing.T) { t.Parallel(); testLogsFollow(t, d, src) })
		t.Run("status-exited", func(t *testing.T) { t.Parallel(); testStatusExited(t, d, src) })
		t.Run("attach", func(t *testing.T) { t.Parallel(); testAttach(t, d, src) })
		t.Run("errors", func(t *testing.T) { t.Parallel(); testErrors(t, d, src) })
	})

	t.Run("images", func(t *testing.T) {
		var imgs []struct {
			ID   string   `json:"id"`
			Refs []string `json:"refs"`
		}
		must(t, json.Unmarshal([]byte(d.ok(t, "image", "ls", "--json")), &imgs))
		if len(imgs) < 3 {
			t.Fatalf("image ls: %d images", len(imgs))
		}
		// No pod uses the http image any more: it can be removed.
		d.ok(t, "image", "rm", src.http)
		if _, _, code := d.kurma("image", "inspect", src.http); code != cli.ExitError {
			t.Fatalf("removed image still found (exit %d)", code)
		}
	})
}

func testTwoApps(t *testing.T, d *daemon, src sources) {
	spec := fmt.Sprintf(`name: %s
volumes: [{name: shared, kind: empty}]
apps:
- name: first
  image: %s
  exec: [sleep, "1001"]
  mounts: [{volume: shared, path: /shared}]
- name: second
  image: %s
  exec: [sleep, "1002"]
  mounts: [{volume: shared, path: /shared}]
`, testutil.UniqueName("kapi"), src.aci, src.docker)
	f := filepath.Join(t.TempDir(), "pod.yaml")
	must(t, os.WriteFile(f, []byte(spec), 0o644))
	uuid := strings.TrimSpace(d.ok(t, "create", "-f", f))
	t.Cleanup(func() { d.kurma("rm", "-f", uuid) })
	ps := d.ok(t, "exec", uuid, "first", "ps")
	if !strings.Contains(ps, "sleep 1001") || !strings.Contains(ps, "sleep 1002") {
		t.Fatalf("ps in app first does not see both apps:\n%s", ps)
	}
	d.ok(t, "exec", "--app", "first", uuid, "sh", "-c", "echo shared-data > /shared/f")
	if got := d.ok(t, "exec", uuid, "second", "cat", "/shared/f"); got != "shared-data\n" {
		t.Fatalf("second reads %q from the shared volume", got)
	}
	// Without an app name a two-app pod is ambiguous.
	if _, stderr, code := d.kurma("exec", uuid, "true"); code != cli.ExitError || !strings.Contains(stderr, "2 apps") {
		t.Fatalf("exec without app: exit %d, %s", code, stderr)
	}
}

func testExec(t *testing.T, d *daemon, src sources) {
	name := testutil.UniqueName("kapi")
	d.ok(t, "run", "-d", "--name", name, src.ociLayout, "sleep", "1000")
	t.Cleanup(func() { d.kurma("rm", "-f", name) })
	if ps := d.ok(t, "ps"); !strings.Contains(ps, name) || !strings.Contains(ps, "running") {
		t.Fatalf("ps does not list %s running:\n%s", name, ps)
	}
	tests := []struct {
		name           string
		args           []string
		stdin          string
		code           int
		stdout, stderr string
	}{
		{"output and code", []string{name, "sh", "-c", "echo out; echo err >&2; exit 5"}, "", 5, "out\n", "err\n"},
		{"success", []string{name, "true"}, "", 0, "", ""},
		{"stdin", []string{"-i", name, "wc", "-c"}, "12345", 0, "5\n", ""},
		{"env", []string{"-e", "KAPI_X=42", name, "sh", "-c", "echo $KAPI_X"}, "", 0, "42\n", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var stdin []byte
			if tc.stdin != "" {
				stdin = []byte(tc.stdin)
			}
			out, stderr, code := d.kurmaIn(stdin, append([]string{"exec"}, tc.args...)...)
			if code != tc.code || strings.TrimSpace(out) != strings.TrimSpace(tc.stdout) || !strings.Contains(stderr, strings.TrimSpace(tc.stderr)) {
				t.Fatalf("exit %d stdout %q stderr %q; want %d %q %q", code, out, stderr, tc.code, tc.stdout, tc.stderr)
			}
		})
	}
}

// testLogsFollow proves logs -f streams: the app writes line1, then waits
// for a file that the test creates only after it has read line1 from the
// follower, then writes line2 and exits, which ends the follower.
func testLogsFollow(t *testing.T, d *daemon, src sources) {
	name := testutil.UniqueName("kapi")
	d.ok(t, "run", "-d", "--name", name, src.aci, "sh", "-c",
		"echo line1; while ! test -f /tmp/go; do sleep 0.1; done; echo line2")
	t.Cleanup(func() { d.kurma("rm", "-f", name) })
	cmd := exec.Command(d.b.kurma, "--socket", d.sock, "logs", "-f", name)
	out, err := cmd.StdoutPipe()
	must(t, err)
	must(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	r := bufio.NewReader(out)
	first, err := r.ReadString('\n')
	if err != nil || first != "line1\n" {
		t.Fatalf("first line %q, %v", first, err)
	}
	d.ok(t, "exec", name, "sh", "-c", ": > /tmp/go")
	rest, _ := io.ReadAll(r)
	must(t, cmd.Wait())
	if string(rest) != "line2\n" {
		t.Fatalf("followed %q after line1, want %q", rest, "line2\n")
	}
	if got := d.ok(t, "logs", name); got != "line1\nline2\n" {
		t.Fatalf("logs %q", got)
	}
}

func testStatusExited(t *testing.T, d *daemon, src sources) {
	name := testutil.UniqueName("kapi")
	d.ok(t, "run", "-d", "--name", name, src.docker, "sh", "-c", "exit 3")
	t.Cleanup(func() { d.kurma("rm", "-f", name) })
	eventually(t, 10*time.Second, func() error {
		var st stagerspec.Status
		out, stderr, code := d.kurma("status", "--json", name)
		if code != 0 {
			return fmt.Errorf("status: exit %d %s", code, stderr)
		}
		if err := json.Unmarshal([]byte(out), &st); err != nil {
			return err
		}
		for _, a := range st {
			if a.Exited && a.ExitCode != nil && *a.ExitCode == 3 {
				return nil
			}
		}
		return fmt.Errorf("status %s", out)
	})
	if table := d.ok(t, "status", name); !strings.Contains(table, "exited") || !strings.Contains(table, "3") {
		t.Fatalf("status table:\n%s", table)
	}
	d.ok(t, "stop", "-t", "1", name)
	if p := d.inspect(t, name); p.State != pod.Exited && p.State != pod.Errored {
		t.Fatalf("after stop state %s", p.State)
	}
	if _, _, code := d.kurma("rm", name); code != 0 {
		t.Fatalf("rm of a stopped pod: exit %d", code)
	}
	if _, _, code := d.kurma("inspect", name); code != cli.ExitError {
		t.Fatalf("inspect removed pod: exit %d, want %d", code, cli.ExitError)
	}
}

func testAttach(t *testing.T, d *daemon, src sources) {
	name := testutil.UniqueName("kapi")
	d.ok(t, "run", "-d", "--name", name, src.aci, "cat")
	t.Cleanup(func() { d.kurma("rm", "-f", name) })
	cmd := exec.Command(d.b.kurma, "--socket", d.sock, "attach", name)
	in, err := cmd.StdinPipe()
	must(t, err)
	out, err := cmd.StdoutPipe()
	must(t, err)
	must(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	r := bufio.NewReader(out)
	got := make(chan string, 1)
	go func() {
		line, _ := r.ReadString('\n')
		got <- line
	}()
	// The attach may connect after our first write: repeat until echoed.
	deadline := time.After(10 * time.Second)
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		if _, err := io.WriteString(in, "ping\n"); err != nil {
			t.Fatal(err)
		}
		select {
		case line := <-got:
			if line != "ping\n" {
				t.Fatalf("attach echoed %q", line)
			}
			return
		case <-tick.C:
		case <-deadline:
			t.Fatal("attach did not echo within 10s")
		}
	}
}

func testErrors(t *testing.T, d *daemon, src sources) {
	tests := []struct {
		name string
		args []string
		code int
		msg  string
	}{
		{"unknown pod", []string{"inspect", "kapi-no-such-pod"}, cli.ExitError, "not found"},
		{"unknown pod exec", []string{"exec", "kapi-no-such-pod", "true"}, cli.ExitError, "not found"},
		{"bad image", []string{"run", "--rm", "file:///nonexistent/kapi.aci", "true"}, cli.ExitError, ""},
		{"bad name", []string{"run", "--name", "no/slash", src.aci}, cli.ExitError, "invalid pod name"},
		{"bad volume", []string{"run", "-v", "x:relative", src.aci}, cli.ExitError, "absolute"},
		// The stager's reason, with the codes of docker and podman.
		{"no such command", []string{"run", "--rm", src.aci, "/bin/kapi-nope"}, cli.ExitNotFound,
			`exec "/bin/kapi-nope": no such file or directory`},
		{"no such workdir", []string{"run", "--rm", "-w", "/kapi-nowhere", src.aci, "true"}, cli.ExitCannotExec,
			`working directory "/kapi-nowhere": no such file or directory`},
		{"no such user", []string{"run", "--rm", "-u", "kapi-nobody", src.aci, "true"}, cli.ExitError,
			`user "kapi-nobody" not found`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, stderr, code := d.kurma(tc.args...)
			if code != tc.code || !strings.Contains(stderr, tc.msg) {
				t.Fatalf("exit %d stderr %q; want %d containing %q", code, stderr, tc.code, tc.msg)
			}
		})
	}
	// A duplicate name is a conflict and leaves the first pod alone.
	name := testutil.UniqueName("kapi")
	d.ok(t, "run", "-d", "--name", name, src.aci, "sleep", "1000")
	t.Cleanup(func() { d.kurma("rm", "-f", name) })
	if _, stderr, code := d.kurma("run", "-d", "--name", name, src.aci, "sleep", "1000"); code != cli.ExitError {
		t.Fatalf("duplicate name: exit %d %s", code, stderr)
	}
	if _, stderr, code := d.kurma("rm", name); code != cli.ExitError || !strings.Contains(stderr, "running") && !strings.Contains(stderr, "conflict") {
		t.Fatalf("rm of a running pod without -f: exit %d %s", code, stderr)
	}
	if _, stderr, code := d.kurma("exec", name, "/bin/kapi-nope"); code != cli.ExitNotFound || !strings.Contains(stderr, "kapi-nope") {
		t.Fatalf("exec of a missing command: exit %d %s, want %d", code, stderr, cli.ExitNotFound)
	}
	// inspect prints the pods it found and fails for the others.
	stdout, stderr, code := d.kurma("inspect", name, "kapi-no-such-pod")
	if code != cli.ExitError || !strings.Contains(stdout, name) || !strings.Contains(stderr, "kapi-no-such-pod") {
		t.Fatalf("inspect of a found and a missing pod: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
}

// testRestart kills kurmad with SIGKILL while pods run, restarts it and
// checks the pods are re-adopted (same stager process) and still usable;
// the daemon's cleanup then checks nothing leaked.
func testRestart(t *testing.T, b bins, src sources) {
	d := startDaemon(t, b)
	name := testutil.UniqueName("kapi")
	d.ok(t, "run", "-d", "--name", name, src.aci, "sleep", "1000")
	done := testutil.UniqueName("kapi")
	d.ok(t, "run", "-d", "--name", done, src.aci, "sh", "-c", "exit 4")
	before := d.inspect(t, name)
	if before.StagerPID == 0 {
		t.Fatalf("no stager pid: %+v", before)
	}
	d.kill9()
	if err := syscall.Kill(before.StagerPID, 0); err != nil {
		t.Fatalf("stager %d died with the daemon: %v", before.StagerPID, err)
	}
	d.start()
	after := d.inspect(t, name)
	if after.UUID != before.UUID || after.StagerPID != before.StagerPID || after.State != pod.Running {
		t.Fatalf("after restart: %+v\nbefore: %+v", after, before)
	}
	if out := d.ok(t, "exec", name, "echo", "still here"); out != "still here\n" {
		t.Fatalf("exec after restart: %q", out)
	}
	var ps []*pod.Pod
	must(t, json.Unmarshal([]byte(d.ok(t, "ps", "-a", "--json")), &ps))
	ps = withoutNetPod(ps)
	if len(ps) != 2 {
		t.Fatalf("after restart %d pods, want 2 (nothing duplicated)", len(ps))
	}
	st := d.ok(t, "status", "--json", done)
	if !strings.Contains(st, `"exitCode": 4`) {
		t.Fatalf("status of the exited app after restart: %s", st)
	}
	// A graceful stop leaves pods running too.
	must(t, d.stop())
	if err := syscall.Kill(before.StagerPID, 0); err != nil {
		t.Fatalf("stager %d died with a graceful daemon stop: %v", before.StagerPID, err)
	}
	d.start()
	if p := d.inspect(t, name); p.StagerPID != before.StagerPID || p.State != pod.Running {
		t.Fatalf("after graceful restart: %+v", p)
	}
	d.ok(t, "rm", "-f", name, done)
	waitGone(t, before.StagerPID)

	// --stop-pods-on-exit: a graceful stop takes the pods down, keeping
	// their records.
	must(t, d.stop())
	d.args = []string{"--stop-pods-on-exit"}
	d.start()
	d.ok(t, "run", "-d", "--name", name, src.aci, "sleep", "1000")
	pid := d.inspect(t, name).StagerPID
	must(t, d.stop())
	waitGone(t, pid)
	d.args = nil
	d.start()
	if p := d.inspect(t, name); p.State != pod.Exited && p.State != pod.Errored {
		t.Fatalf("pod after --stop-pods-on-exit: state %s", p.State)
	}
}

// waitGone waits for a process to disappear.
func waitGone(t *testing.T, pid int) {
	t.Helper()
	eventually(t, 10*time.Second, func() error {
		if syscall.Kill(pid, 0) == nil {
			return fmt.Errorf("process %d still alive", pid)
		}
		return nil
	})
}

// testInitialPods starts a daemon whose config prefetches an image and
// declares an initial pod: the pod runs once the daemon is up, and a
// restart does not start it twice.
func testInitialPods(t *testing.T, b bins, src sources) {
	name := testutil.UniqueName("kapi")
	d := startDaemon(t, b, fmt.Sprintf(`prefetchImages: [%q]
initialPods:
- name: %s
  apps:
  - image: %s
    exec: [sleep, "1000"]
`, src.ociLayout, name, src.aci))
	var p *pod.Pod
	eventually(t, 20*time.Second, func() error {
		out, stderr, code := d.kurma("inspect", name)
		if code != 0 {
			return fmt.Errorf("inspect: exit %d %s", code, stderr)
		}
		var ps []*pod.Pod
		if err := json.Unmarshal([]byte(out), &ps); err != nil {
			return err
		}
		if p = ps[0]; p.State != pod.Running {
			return fmt.Errorf("state %s", p.State)
		}
		return nil
	})
	eventually(t, 10*time.Second, func() error {
		if _, stderr, code := d.kurma("image", "inspect", src.ociLayout); code != 0 {
			return fmt.Errorf("prefetched image not in the store: %s", stderr)
		}
		return nil
	})
	must(t, d.stop())
	d.start()
	time.Sleep(300 * time.Millisecond) // let startup look at the initial pods
	var ps []*pod.Pod
	must(t, json.Unmarshal([]byte(d.ok(t, "ps", "-a", "--json")), &ps))
	ps = withoutNetPod(ps)
	if len(ps) != 1 || ps[0].UUID != p.UUID {
		t.Fatalf("after restart: %d pods, want the one initial pod %s", len(ps), p.UUID)
	}
}

// childWithCmdline finds a child of d's kurmad (pid, or any when 0) whose
// command line is want (NUL-separated, as in /proc/<pid>/cmdline).
func childWithCmdline(d *daemon, want string, pid int) error {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return err
	}
	var seen []string
	for _, e := range ents {
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // not a process, or gone
		}
		// The parent PID is the second field after the ")" of comm.
		f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		if len(f) < 2 || f[1] != strconv.Itoa(d.cmd.Process.Pid) || (pid != 0 && e.Name() != strconv.Itoa(pid)) {
			continue
		}
		cl, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err == nil && string(cl) == want {
			return nil
		}
		seen = append(seen, strings.ReplaceAll(string(cl), "\x00", " "))
	}
	return fmt.Errorf("no %q among kurmad's children %q", want, seen)
}
