package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"kurma.dev/kurma/internal/network/manager"
	"kurma.dev/kurma/internal/pod"
)

// pluginMains returns the host PIDs of the networking pod's plugin main
// executables (comm "netplugin", descendants of its stager).
func pluginMains(t *testing.T, d *daemon) []int {
	t.Helper()
	np := d.inspect(t, manager.DefaultNetPodName)
	if np.State != pod.Running || np.StagerPID == 0 {
		t.Fatalf("networking pod %s, stager %d", np.State, np.StagerPID)
	}
	parent := map[int]int{}
	var mains []int
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...
		s := string(st)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 2 {
			continue
		}
		parent[pid], _ = strconv.Atoi(f[1])
		if strings.HasPrefix(s[strings.IndexByte(s, '(')+1:i], "netplugin") {
			mains = append(mains, pid)
		}
	}
	var out []int
	for _, m := range mains {
		for p := m; p > 1; p = parent[p] {
			if p == np.StagerPID {
				out = append(out, m)
				break
			}
		}
	}
	return out
}

func sameNS(t *testing.T, a, b string) bool {
	t.Helper()
	var sa, sb syscall.Stat_t
	must(t, syscall.Stat(a, &sa))
	must(t, syscall.Stat(b, &sb))
	return sa.Ino == sb.Ino && sa.Dev == sb.Dev
}

// checkNetPod checks what the networking pod's plugin containers get: the
// host's net, IPC and UTS namespaces (and its hostname unchanged), their
// own mount namespace, exactly the host-privileged capabilities, and the
// netns folder at the same path.
func checkNetPod(t *testing.T, d *daemon, hostname string, wantMains int) []int {
	t.Helper()
	mains := pluginMains(t, d)
	if len(mains) != wantMains {
		t.Fatalf("%d plugin mains, want %d", len(mains), wantMains)
	}
	if h, _ := os.Hostname(); h != hostname {
		t.Errorf("host hostname changed: %q, was %q", h, hostname)
	}
	for _, pid := range mains {
		for _, ns := range []string{"net", "ipc", "uts"} {
			if !sameNS(t, fmt.Sprintf("/proc/%d/ns/%s", pid, ns), "/proc/self/ns/"+ns) {
				t.Errorf("plugin main %d: not in the host's %s namespace", pid, ns)
			}
		}
		if sameNS(t, fmt.Sprintf("/proc/%d/ns/mnt", pid), "/proc/self/ns/mnt") {
			t.Errorf("plugin main %d shares the host's mount namespace", pid)
		}
		st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		must(t, err)
		const want = 1<<12 | 1<<13 | 1<<21 // NET_ADMIN, NET_RAW, SYS_ADMIN
		for _, l := range strings.Split(string(st), "\n") {
			if v, ok := strings.CutPrefix(l, "CapEff:\t"); ok {
				if c, _ := strconv.ParseUint(v, 16, 64); c != want {
					t.Errorf("plugin main %d: CapEff %s, want %x", pid, v, want)
				}
			}
		}
		if fi, err := os.Stat(fmt.Sprintf("/proc/%d/root%s", pid, d.netnsDir())); err != nil || !fi.IsDir() {
			t.Errorf("plugin main %d: no %s inside: %v", pid, d.netnsDir(), err)
		}
	}
	return mains
}

// netRefVisible checks that a pod's netns reference, bound after the
// networking pod started, is in every plugin main's mount namespace at
// the host path and is the pod's namespace (setns-able there).
func netRefVisible(t *testing.T, d *daemon, p *pod.Pod, mains []int) {
	t.Helper()
	for _, pid := range mains {
		in := fmt.Sprintf("/proc/%d/root%s/%s", pid, d.netnsDir(), p.UUID)
		if !sameNS(t, in, p.NetNS) {
			t.Errorf("plugin main %d: %s is not pod %s's network namespace", pid, in, p.Name)
		}
	}
}

type netLs struct {
	Name, State, Error string
	Restarts           int
}

func netList(t *testing.T, d *daemon) map[string]netLs {
	t.Helper()
	var ls []netLs
	must(t, json.Unmarshal([]byte(d.ok(t, "net", "ls", "--json")), &ls))
	out := map[string]netLs{}
	for _, n := range ls {
		out[n.Name] = n
	}
	return out
}

// killPluginMain kills one plugin main by PID and waits until the network
// is seen failed and then running again with one more restart.
func killPluginMain(t *testing.T, d *daemon, network string, pid int) {
	t.Helper()
	before := netList(t, d)[network].Restarts
	must(t, syscall.Kill(pid, syscall.SIGKILL))
	sawFailed := false
	deadline := time.Now().Add(30 * time.Second)
	for {
		n := netList(t, d)[network]
		if n.State == "failed" {
			sawFailed = true
			if !strings.Contains(n.Error, "exited") {
				t.Errorf("failed network's reason: %q", n.Error)
			}
		}
		if n.State == "running" && n.Restarts > before {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("network %s not restarted: %+v", network, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !sawFailed {
		t.Error("net ls never showed the network failed")
	}
}

// withoutNetPod drops kurmad's networking pod from a pod list (it runs
// whenever pod networks are configured, the default network included).
func withoutNetPod(ps []*pod.Pod) []*pod.Pod {
	out := ps[:0:0]
	for _, p := range ps {
		if p.Name != manager.DefaultNetPodName {
			out = append(out, p)
		}
	}
	return out
}
