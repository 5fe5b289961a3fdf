package stager_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"kurma.dev/kurma/internal/testutil"
	"kurma.dev/kurma/pkg/appc"
	"kurma.dev/kurma/pkg/stagerspec"
)

// TestLeastPrivilege checks that apps running as root cannot reach the
// stager's root through the pod init (/proc/1/root, the init socket),
// cannot mount, run with the default capability set and no_new_privs, and
// that a retain-set isolator widens the set.
func TestLeastPrivilege(t *testing.T) {
	// Both ways init runs: a process of its own, or the stager itself
	// when it is PID 1 (as kurmad starts it).
	for _, pid1 := range []bool{false, true} {
		t.Run(fmt.Sprintf("pid1=%v", pid1), func(t *testing.T) { testLeastPrivilege(t, pid1) })
	}
}

func testLeastPrivilege(t *testing.T, pid1 bool) {
	retain, _ := json.Marshal(map[string][]string{"set": {"CAP_SYS_ADMIN", "CAP_CHOWN", "CAP_SETUID", "CAP_SETGID", "CAP_SYS_CHROOT"}})
	remove, _ := json.Marshal(map[string][]string{"set": {"CAP_KILL"}})
	p := newPod(t, podOpts{pid1: pid1},
		podApp{name: "plain", exec: []string{"/bin/sleep", "1000"}, mountShared: "/shared"},
		podApp{name: "admin", exec: []string{"/bin/sleep", "1000"},
			isolators: []appc.Isolator{{Name: "os/linux/capabilities-retain-set", Value: retain}}},
		podApp{name: "nokill", exec: []string{"/bin/sleep", "1000"},
			isolators: []appc.Isolator{{Name: "os/linux/capabilities-remove-set", Value: remove}}},
	)
	if !p.waitReady(30 * time.Second) {
		t.Fatalf("stager exited at readiness:\n%s", p.out.String())
	}
	// A copy of the stager binary in the shared volume is a status client
	// the app can run; pointed at init's root it tries the init socket.
	b, err := os.ReadFile(testutil.Bin(t, "kurma-stager"))
	if err != nil {
		t.Fatal(err)
	}
	mustWrite(t, filepath.Join(p.base, "vol-shared", "status"), string(b), 0o755)

	sh := func(app, script string) callResult {
		return p.runIn(app, stagerspec.RunSettings{Exec: []string{"/bin/sh", "-c", script}, User: "0", Group: "0"}, "")
	}
	for _, tc := range []struct {
		name, app, script string
		ok                bool
	}{
		{"own root is readable", "plain", "ls /", true},
		{"init root is not", "plain", "ls /proc/1/root/", false},
		{"init cwd is not", "plain", "ls /proc/1/cwd/", false},
		{"init socket is unreachable", "plain",
			"mkdir -p /run && ln -sfn /proc/1/root/run/kurma-stager /run/kurma-stager && /shared/status", false},
		{"no mount", "plain", "mount -t tmpfs none /tmp", false},
		{"no_new_privs set", "plain", "grep -q '^NoNewPrivs:[[:space:]]*1' /proc/self/status", true},
		{"retain-set restores mount", "admin", "mount -t tmpfs none /tmp && grep -q tmpfs /proc/self/mounts", true},
		{"retain-set still hides init root", "admin", "ls /proc/1/root/", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := sh(tc.app, tc.script)
			if (res.code == 0) != tc.ok {
				t.Errorf("%q in %s: exit %d (want success %v)\nstdout %q\nstderr %q", tc.script, tc.app, res.code, tc.ok, res.stdout, res.stderr)
			}
		})
	}

	// The apps themselves (not only call-ins) carry the confined sets.
	t.Run("app capability sets", func(t *testing.T) {
		st := p.status()
		_, pids := p.podProcesses()
		want := map[string]uint64{
			"plain":  0xa80425fb, // Docker's default set
			"admin":  1<<21 | 1<<0 | 1<<7 | 1<<6 | 1<<18,
			"nokill": 0xa80425fb &^ (1 << 5),
		}
		for app, caps := range want {
			hostPID := hostPIDOf(t, pids, st[app].PID)
			for _, field := range []string{"CapBnd", "CapEff", "CapPrm"} {
				if got := procCaps(t, hostPID, field); got != caps {
					t.Errorf("%s %s = %#x, want %#x", app, field, got, caps)
				}
			}
		}
	})
}

// hostPIDOf finds the host PID of the pod process whose pod PID is nsPID.
func hostPIDOf(t *testing.T, pids []int, nsPID int) int {
	t.Helper()
	for _, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "NSpid:"); ok {
				f := strings.Fields(v)
				if len(f) > 1 && f[len(f)-1] == strconv.Itoa(nsPID) {
					return pid
				}
			}
		}
	}
	t.Fatalf("no process with pod pid %d", nsPID)
	return 0
}

func procCaps(t *testing.T, pid int, field string) uint64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("%s not in /proc/%d/status", field, pid)
	return 0
}
