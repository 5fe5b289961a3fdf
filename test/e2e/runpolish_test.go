package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"kurma.dev/kurma/internal/testutil"
)

// underTerminal runs the CLI inside script(1), whose pseudo-terminal is
// set to rows×cols first, and returns what the terminal showed.
func (d *daemon) underTerminal(t *testing.T, rows, cols int, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	cmdline := fmt.Sprintf("stty rows %d cols %d; exec %s --socket %s", rows, cols, d.b.kurma, d.sock)
	for _, a := range args {
		cmdline += " '" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	out, err := exec.CommandContext(ctx, "script", "-qec", cmdline, "/dev/null").CombinedOutput()
	if err != nil && !strings.Contains(string(out), "No child processes") {
		t.Fatalf("kurma %v under a terminal: %v\n%q", args, err, out)
	}
	return strings.ReplaceAll(string(out), "\r", "")
}

// TestRunPolish covers the CLI's terminal and stdin handling and the logs
// of stopped pods, end to end through kurmad and the default stager.
func TestRunPolish(t *testing.T) {
	testutil.RequireRoot(t)
	if testing.Short() {
		t.Skip("end-to-end")
	}
	if _, err := exec.LookPath("script"); err != nil {
		t.Skip("script(1) from util-linux is needed")
	}
	b := findBins(t)
	src := serveBusybox(t)
	d := startDaemon(t, b)

	t.Run("run -t gets the caller's terminal size", func(t *testing.T) {
		out := d.underTerminal(t, 31, 97, "run", "--rm", "-t", src.aci, "/bin/busybox", "stty", "size")
		if strings.TrimSpace(out) != "31 97" {
			t.Fatalf("stty size in run -t: %q", out)
		}
	})
	t.Run("exec -t gets the caller's terminal size", func(t *testing.T) {
		name := testutil.UniqueName("krp")
		d.ok(t, "run", "-d", "--name", name, src.aci, "sleep", "1000")
		t.Cleanup(func() { d.kurma("rm", "-f", name) })
		out := d.underTerminal(t, 27, 61, "exec", "-t", name, "/bin/busybox", "stty", "size")
		if strings.TrimSpace(out) != "27 61" {
			t.Fatalf("stty size in exec -t: %q", out)
		}
	})
	t.Run("run -i ends at the client's EOF", func(t *testing.T) {
		start := time.Now()
		out, stderr, code := d.kurmaIn([]byte("x\ny\n"), "run", "--rm", "-i", src.aci, "cat")
		if code != 0 || out != "x\ny\n" {
			t.Fatalf("echo | run -i cat: exit %d out %q stderr %q after %v", code, out, stderr, time.Since(start))
		}
	})
	t.Run("attach keeps stdin open", func(t *testing.T) {
		name := testutil.UniqueName("krp")
		d.ok(t, "run", "-d", "--name", name, src.aci, "cat")
		t.Cleanup(func() { d.kurma("rm", "-f", name) })
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, d.b.kurma, "--socket", d.sock, "attach", name)
		cmd.Stdin = strings.NewReader("ping\n")
		_ = cmd.Run()
		if p := d.inspect(t, name); p.Apps[0].Status != nil && p.Apps[0].Status.Exited {
			t.Fatalf("attach's EOF closed the app's stdin: %+v", p.Apps[0].Status)
		}
		if st := d.ok(t, "status", name); strings.Contains(st, "exited") {
			t.Fatalf("attach's EOF ended cat:\n%s", st)
		}
	})
	t.Run("logs of a stopped pod", func(t *testing.T) {
		name := testutil.UniqueName("krp")
		d.ok(t, "run", "-d", "--name", name, src.aci, "sh", "-c", "echo to-out; echo to-err >&2; sleep 1000")
		t.Cleanup(func() { d.kurma("rm", "-f", name) })
		eventually(t, 10*time.Second, func() error {
			if out := d.ok(t, "logs", name); !strings.Contains(out, "to-err") {
				return fmt.Errorf("logs so far %q", out)
			}
			return nil
		})
		d.ok(t, "stop", "-t", "1", name)
		out, stderr, code := d.kurma("logs", name)
		if code != 0 || !strings.Contains(out, "to-out\n") || !strings.Contains(out, "to-err\n") {
			t.Fatalf("logs of stopped pod: exit %d out %q stderr %q", code, out, stderr)
		}
	})
}
