package stager_test

import (
	"bufio"
	"encoding/json"
	"errors"
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

	"github.com/creack/pty"

	"kurma.dev/kurma/pkg/appc"
	"kurma.dev/kurma/pkg/stagerspec"
)

var whiteoutCheck = stagerspec.RunSettings{
	Exec: []string{"/bin/sh", "-c", "test ! -e /etc/removed && test ! -e /opq/old && test -e /opq/new && test -e /top.txt && test -e /etc/passwd"},
	User: "0", Group: "0",
}

func TestPod(t *testing.T) {
	p := newPod(t, podOpts{config: `{"gracePeriod":"6s"}`, overlayRoot: true},
		podApp{name: "alpha", exec: []string{"/bin/sh", "-c", "echo hello-alpha; echo from-alpha > /data/alpha.txt; exec sleep 1000"}, mountShared: "/data"},
		podApp{name: "beta", exec: []string{"/bin/cat"}, mountShared: "/data"},
		podApp{name: "gamma", exec: []string{"/bin/sh", "-c", "echo bye; exit 3"}},
		podApp{name: "delta", exec: []string{"/bin/cat"}, tty: true},
		podApp{name: "brief", exec: []string{"/bin/sh", "-c", "echo one; sleep 1; echo two"}},
	)
	start := time.Now()
	if !p.waitReady(30 * time.Second) {
		t.Fatalf("stager exited before/at readiness:\n%s", p.out.String())
	}
	t.Logf("ready after %v", time.Since(start))
	// The stager root is an overlay, so app writes go to a tmpfs scratch.
	if !strings.Contains(p.out.String(), "union=overlay-tmpfs") {
		t.Errorf("overlay-tmpfs union not used:\n%s", p.out.String())
	}

	t.Run("ready after apps started", func(t *testing.T) {
		st := p.status()
		for _, app := range []string{"alpha", "beta", "gamma", "delta", "brief"} {
			a, ok := st[app]
			if !ok || (a.PID <= 0 && !a.Exited) {
				t.Errorf("app %s not started at readiness: %+v", app, a)
			}
		}
	})

	t.Run("status", func(t *testing.T) {
		eventually(t, 5*time.Second, func() error {
			st := p.status()
			g := st["gamma"]
			if !g.Exited || g.ExitCode == nil || *g.ExitCode != 3 || g.ExitReason != "exited" {
				return fmt.Errorf("gamma: %+v", g)
			}
			for _, app := range []string{"alpha", "beta"} {
				if st[app].Exited || st[app].PID <= 1 {
					return fmt.Errorf("%s: %+v", app, st[app])
				}
			}
			return nil
		})
	})

	t.Run("shared pid namespace", func(t *testing.T) {
		alphaPID := p.status()["alpha"].PID
		res := p.runIn("beta", stagerspec.RunSettings{Exec: []string{"ps"}, User: "0", Group: "0"}, "")
		if res.code != 0 {
			t.Fatalf("ps: %d %s", res.code, res.stderr)
		}
		found := false
		for _, line := range strings.Split(res.stdout, "\n") {
			f := strings.Fields(line)
			if len(f) > 0 && f[0] == strconv.Itoa(alphaPID) && strings.Contains(line, "sleep 1000") {
				found = true
			}
		}
		if !found {
			t.Errorf("beta does not see alpha's pid %d:\n%s", alphaPID, res.stdout)
		}
	})

	t.Run("shared volume", func(t *testing.T) {
		eventually(t, 5*time.Second, func() error {
			res := p.runIn("beta", stagerspec.RunSettings{Exec: []string{"cat", "/data/alpha.txt"}, User: "0", Group: "0"}, "")
			if res.code != 0 || res.stdout != "from-alpha\n" {
				return fmt.Errorf("cat: %d %q %q", res.code, res.stdout, res.stderr)
			}
			return nil
		})
	})

	t.Run("logs", func(t *testing.T) {
		eventually(t, 5*time.Second, func() error {
			res := p.callin(nil, nil, nil, "logs", "alpha")
			if res.code != 0 || !strings.Contains(res.stdout, "hello-alpha") {
				return fmt.Errorf("logs alpha: %d %q %q", res.code, res.stdout, res.stderr)
			}
			return nil
		})
		// -f on an exited app ends once its log is drained.
		done := make(chan callResult, 1)
		go func() { done <- p.callin(nil, nil, nil, "logs", "gamma", "-f") }()
		select {
		case res := <-done:
			if res.code != 0 || res.stdout != "bye\n" {
				t.Errorf("logs -f gamma: %d %q %q", res.code, res.stdout, res.stderr)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("logs -f of an exited app did not end")
		}
		// -f on a running app streams until it exits.
		go func() { done <- p.callin(nil, nil, nil, "logs", "brief", "-f") }()
		select {
		case res := <-done:
			if res.code != 0 || res.stdout != "one\ntwo\n" {
				t.Errorf("logs -f brief: %d %q %q", res.code, res.stdout, res.stderr)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("logs -f did not end when the app exited")
		}
		if res := p.callin(nil, nil, nil, "logs", "nope"); res.code == 0 {
			t.Errorf("logs of unknown app succeeded")
		}
	})

	t.Run("run", func(t *testing.T) {
		for _, tc := range []struct {
			name     string
			s        stagerspec.RunSettings
			stdin    string
			code     int
			out, err string
		}{
			{name: "exit code and streams", s: stagerspec.RunSettings{Exec: []string{"/bin/sh", "-c", "echo out; echo err >&2; exit 7"}, User: "0", Group: "0"}, code: 7, out: "out\n", err: "err\n"},
			{name: "stdin passed through", s: stagerspec.RunSettings{Exec: []string{"cat"}, User: "0", Group: "0"}, stdin: "piped", out: "piped"},
			{name: "hostname is pod name", s: stagerspec.RunSettings{Exec: []string{"hostname"}, User: "0", Group: "0"}, out: p.name + "\n"},
			{name: "user and group by name", s: stagerspec.RunSettings{Exec: []string{"/bin/sh", "-c", "echo $(id -u) $(id -g) $HOME"}, User: "kuser", Group: "kgroup"}, out: "1234 4321 /home/kuser\n"},
			{name: "numeric ids", s: stagerspec.RunSettings{Exec: []string{"/bin/sh", "-c", "echo $(id -u) $(id -g)"}, User: "555", Group: "666"}, out: "555 666\n"},
			{name: "ids of a file", s: stagerspec.RunSettings{Exec: []string{"/bin/sh", "-c", "echo $(id -u) $(id -g)"}, User: "/owned", Group: "/owned"}, out: "2222 3333\n"},
			{name: "supplementary gids", s: stagerspec.RunSettings{Exec: []string{"id", "-G"}, User: "0", Group: "0", SupplementaryGIDs: []int{77, 88}}, out: "0 77 88\n"},
			{name: "working directory", s: stagerspec.RunSettings{Exec: []string{"pwd"}, User: "0", Group: "0", WorkingDirectory: "/etc"}, out: "/etc\n"},
			{name: "environment", s: stagerspec.RunSettings{Exec: []string{"/bin/sh", "-c", "echo $FOO $AC_APP_NAME $PATH"}, User: "0", Group: "0",
				Environment: []appc.EnvVar{{Name: "FOO", Value: "bar"}, {Name: "PATH", Value: "/bin"}}}, out: "bar beta /bin\n"},
			{name: "whiteouts applied (overlay)", s: whiteoutCheck},
			{name: "minimal dev", s: stagerspec.RunSettings{Exec: []string{"/bin/sh", "-c",
				"test -c /dev/null && test -c /dev/urandom && test ! -e /dev/kmsg && test -c /dev/pts/ptmx && echo x > /dev/null && echo dev-ok"}, User: "0", Group: "0"}, out: "dev-ok\n"},
			{name: "unknown app", s: stagerspec.RunSettings{Exec: []string{"true"}, User: "0", Group: "0"}, code: 125, err: "no app"},
			{name: "unknown user", s: stagerspec.RunSettings{Exec: []string{"true"}, User: "nosuchuser", Group: "0"}, code: 125, err: "nosuchuser"},
			{name: "missing executable", s: stagerspec.RunSettings{Exec: []string{"/bin/nothing"}, User: "0", Group: "0"}, code: 127, err: `exec "/bin/nothing": no such file or directory`},
			{name: "missing working directory", s: stagerspec.RunSettings{Exec: []string{"true"}, User: "0", Group: "0", WorkingDirectory: "/nowhere"}, code: 126, err: `working directory "/nowhere"`},
			{name: "invalid settings", s: stagerspec.RunSettings{Exec: []string{"true"}}, code: 125, err: "user and group"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				app := "beta"
				if tc.name == "unknown app" {
					app = "nosuch"
				}
				res := p.runIn(app, tc.s, tc.stdin)
				if res.code != tc.code {
					t.Fatalf("exit %d, want %d (stdout %q stderr %q)", res.code, tc.code, res.stdout, res.stderr)
				}
				if tc.out != "" && res.stdout != tc.out {
					t.Errorf("stdout %q, want %q", res.stdout, tc.out)
				}
				if tc.err != "" && !strings.Contains(res.stderr, tc.err) {
					t.Errorf("stderr %q, want it to contain %q", res.stderr, tc.err)
				}
			})
		}
	})

	t.Run("run with tty", func(t *testing.T) {
		res := p.runIn("alpha", stagerspec.RunSettings{Exec: []string{"/bin/sh", "-c", "tty; test -c \"$(tty)\" && echo tty-in-app; echo term=$TERM; exit 5"}, User: "0", Group: "0", TTY: true}, "")
		if res.code != 5 {
			t.Fatalf("exit %d, want 5 (%q %q)", res.code, res.stdout, res.stderr)
		}
		if !strings.Contains(res.stdout, "/dev/pts/") || !strings.Contains(res.stdout, "tty-in-app") || !strings.Contains(res.stdout, "term=xterm") {
			t.Errorf("tty output %q", res.stdout)
		}
	})

	t.Run("run with the caller on a terminal", func(t *testing.T) {
		// As the daemon does for a tty exec: the call-in's stdio is a
		// terminal whose size the command must see.
		master, slave, err := pty.Open()
		if err != nil {
			t.Fatal(err)
		}
		defer master.Close()
		if err := pty.Setsize(master, &pty.Winsize{Rows: 33, Cols: 111}); err != nil {
			t.Fatal(err)
		}
		sr, sw, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		defer sr.Close()
		b, _ := json.Marshal(stagerspec.RunSettings{Exec: []string{"/bin/sh", "-c", "stty size; exit 4"}, User: "0", Group: "0", TTY: true})
		_, _ = sw.Write(b)
		sw.Close()
		cmd := p.callinCmd("run", "alpha")
		cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
		cmd.ExtraFiles = []*os.File{sr}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		slave.Close()
		var out strings.Builder
		copied := make(chan struct{})
		go func() { _, _ = io.Copy(&out, master); close(copied) }()
		err = cmd.Wait()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 4 {
			t.Errorf("exit: %v", err)
		}
		select {
		case <-copied:
		case <-time.After(3 * time.Second):
		}
		if !strings.Contains(out.String(), "33 111") {
			t.Errorf("terminal size not passed on: %q", out.String())
		}
	})

	t.Run("run settings timeout", func(t *testing.T) {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		defer w.Close()
		if _, err := w.WriteString(`{"exec":["true"],`); err != nil {
			t.Fatal(err)
		}
		begin := time.Now()
		res := p.callin(nil, r, []string{"KURMA_STAGER_SETTINGS_TIMEOUT=300ms"}, "run", "beta")
		if res.code != 125 || !strings.Contains(res.stderr, "not received within") {
			t.Errorf("got %d %q", res.code, res.stderr)
		}
		if el := time.Since(begin); el > 5*time.Second {
			t.Errorf("took %v", el)
		}
		// No settings descriptor at all.
		if res := p.callin(nil, nil, nil, "run", "beta"); res.code != 125 || !strings.Contains(res.stderr, "not open") {
			t.Errorf("without fd 3: %d %q", res.code, res.stderr)
		}
	})

	t.Run("attach and logs follow", func(t *testing.T) {
		follow := p.callinCmd("logs", "beta", "-f")
		fr, err := follow.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := follow.Start(); err != nil {
			t.Fatal(err)
		}
		followDone := make(chan error, 1)
		go func() { followDone <- follow.Wait() }()
		t.Cleanup(func() { _ = follow.Process.Kill() })

		attach(t, p, "beta")
		fl := make(chan string, 10)
		go func() {
			sc := bufio.NewScanner(fr)
			for sc.Scan() {
				fl <- sc.Text()
			}
		}()
		select {
		case l := <-fl:
			if !strings.HasPrefix(l, "echo-me-") {
				t.Errorf("logs -f: %q", l)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("logs -f streamed nothing")
		}
		// The caller goes away: logs -f must notice and end.
		fr.(*os.File).Close()
		select {
		case <-followDone:
		case <-time.After(5 * time.Second):
			t.Error("logs -f kept running after its reader left")
		}
	})

	t.Run("attach to a tty app", func(t *testing.T) {
		attach(t, p, "delta")
		res := p.runIn("delta", stagerspec.RunSettings{Exec: []string{"/bin/sh", "-c", "ps -o pid,tty,args | grep -c pts"}, User: "0", Group: "0"}, "")
		if res.code != 0 {
			t.Errorf("ps: %d %q %q", res.code, res.stdout, res.stderr)
		}
	})

	t.Run("sigterm tears everything down", func(t *testing.T) {
		ns, pids := p.podProcesses()
		if len(pids) < 3 {
			t.Fatalf("pod processes %v", pids)
		}
		begin := time.Now()
		if err := p.stop(20 * time.Second); err != nil {
			t.Fatalf("stager exit: %v\n%s", err, p.out.String())
		}
		// alpha's sleep and beta's cat die on TERM: no need for the grace.
		if el := time.Since(begin); el > 4*time.Second {
			t.Errorf("stop took %v", el)
		}
		if left := pidsInNS(ns); len(left) > 0 {
			t.Errorf("processes left in the pod: %v", left)
		}
		assertNoMounts(t, p.base)
	})
}

func assertNoMounts(t *testing.T, dir string) {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), dir) {
		t.Errorf("mounts left under %s", dir)
	}
}

func TestPodCopyAndGrace(t *testing.T) {
	p := newPod(t, podOpts{config: `{"union":"copy","gracePeriod":"1s"}`},
		podApp{name: "stubborn", exec: []string{"/bin/sh", "-c", `trap "echo got-term" TERM; echo started; while true; do sleep 0.1; done`}},
	)
	if !p.waitReady(30 * time.Second) {
		t.Fatalf("stager died:\n%s", p.out.String())
	}
	if !strings.Contains(p.out.String(), "union=copy") {
		t.Errorf("copy union not used:\n%s", p.out.String())
	}
	if res := p.runIn("stubborn", whiteoutCheck, ""); res.code != 0 {
		t.Errorf("whiteouts not applied in copy mode: %d %q", res.code, res.stderr)
	}
	ns, _ := p.podProcesses()
	begin := time.Now()
	if err := p.stop(20 * time.Second); err != nil {
		t.Fatalf("stager exit: %v", err)
	}
	el := time.Since(begin)
	if el < time.Second || el > 6*time.Second {
		t.Errorf("stop took %v, want grace (1s) then KILL", el)
	}
	log, _ := os.ReadFile(filepath.Join(p.root, "logs", "stubborn"))
	if !strings.Contains(string(log), "got-term") {
		t.Errorf("app did not get TERM first; log %q", log)
	}
	if left := pidsInNS(ns); len(left) > 0 {
		t.Errorf("processes left: %v", left)
	}
	assertNoMounts(t, p.base)
	b, err := os.ReadFile(filepath.Join(p.root, "state.json"))
	if err != nil {
		t.Fatal(err)
	}
	var state struct{ Apps stagerspec.Status }
	if err := json.Unmarshal(b, &state); err != nil {
		t.Fatal(err)
	}
	if a := state.Apps["stubborn"]; !a.Exited || a.ExitCode == nil || *a.ExitCode != 137 || a.ExitReason != "killed" {
		t.Errorf("state.json after stop: %s", b)
	}
}

func TestInitDeathEndsStager(t *testing.T) {
	p := newPod(t, podOpts{config: `{}`}, podApp{name: "idle", exec: []string{"sleep", "1000"}})
	if !p.waitReady(30 * time.Second) {
		t.Fatalf("stager died:\n%s", p.out.String())
	}
	if !strings.Contains(p.out.String(), "union=overlay ") {
		t.Errorf("overlay with upper on the stager's disk not used:\n%s", p.out.String())
	}
	ns, pids := p.podProcesses()
	initPID := 0
	for _, pid := range pids {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if strings.Contains(string(b), "\nNSpid:\t"+strconv.Itoa(pid)+"\t1\n") {
			initPID = pid
		}
	}
	if initPID == 0 {
		t.Fatalf("no init among %v", pids)
	}
	if err := syscall.Kill(initPID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-p.done:
		p.done <- err
		if err == nil {
			t.Error("stager exited 0 after its init died")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("stager outlived its init")
	}
	if left := pidsInNS(ns); len(left) > 0 {
		t.Errorf("processes left: %v", left)
	}
}

func TestPodFailsToStart(t *testing.T) {
	p := newPod(t, podOpts{config: `{}`}, podApp{name: "broken", exec: []string{"/bin/does-not-exist"}})
	if p.waitReady(30 * time.Second) {
		t.Fatal("stager signalled readiness with an app that cannot start")
	}
	err := <-p.done
	p.done <- err
	var ee *exec.ExitError
	if !asExit(err, &ee) || ee.ExitCode() == 0 {
		t.Errorf("stager exit: %v", err)
	}
	if !strings.Contains(p.out.String(), "does-not-exist") {
		t.Errorf("no clear error:\n%s", p.out.String())
	}
	assertNoMounts(t, p.base)
}

func asExit(err error, ee **exec.ExitError) bool {
	e, ok := err.(*exec.ExitError)
	if ok {
		*ee = e
	}
	return ok && e.Sys().(syscall.WaitStatus).Exited()
}

// attach connects to app and checks that a line written comes back (the
// app is cat).
func attach(t *testing.T, p *pod, app string) {
	t.Helper()
	att := p.callinCmd("attach", app)
	in, err := att.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := att.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := att.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = att.Process.Kill(); _ = att.Wait() })
	lines := make(chan string, 10)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	// The attach may connect after our first write: repeat until echoed.
	for i := 0; i < 50; i++ {
		fmt.Fprintf(in, "echo-me-%d\n", i)
		select {
		case l := <-lines:
			if strings.Contains(l, "echo-me-") {
				return
			}
		case <-time.After(200 * time.Millisecond):
		}
	}
	t.Fatalf("attach to %s did not echo", app)
}
