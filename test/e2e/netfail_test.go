package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"kurma.dev/kurma/internal/image/acibuild"
	"kurma.dev/kurma/internal/network/manager"
	"kurma.dev/kurma/internal/testutil"
	"kurma.dev/kurma/pkg/appc"
)

// faultyPluginACI builds a host-privileged plugin image from busybox whose
// add does what the file "mode" in its state volume says: exit1, garbage
// or hang. Its del records its calls in "calls"; its main saves its stdin
// to "config" and sleeps.
func faultyPluginACI(t *testing.T) string {
	t.Helper()
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Skipf("needs /bin/busybox: %v", err)
	}
	p := filepath.Join(t.TempDir(), "faulty.aci")
	f, err := os.Create(p)
	must(t, err)
	b, err := acibuild.NewACI(f, appc.ImageManifest{Name: "kurma.dev/e2e/faulty-plugin",
		Annotations: []appc.Annotation{{Name: manager.HostPrivileged, Value: "true"}},
		App: &appc.App{Exec: []string{"/bin/sh", "-c", "cat > /var/lib/kurma-network/config; exec sleep 100000"},
			User: "0", Group: "0", Environment: []appc.EnvVar{{Name: "PATH", Value: "/bin"}}}})
	must(t, err)
	must(t, b.File("bin/busybox", 0o755, bb))
	for _, a := range busyboxApplets {
		must(t, b.Symlink("bin/"+a, "busybox"))
	}
	const add = `#!/bin/sh
case "$(cat /var/lib/kurma-network/mode)" in
exit1) echo "knp plugin broke on $2" >&2; exit 1 ;;
garbage) echo "this is not a CNI result"; exit 0 ;;
hang) exec sleep 1000 ;;
esac
exit 3
`
	must(t, b.File("opt/network/add", 0o755, []byte(add)))
	must(t, b.File("opt/network/del", 0o755, []byte("#!/bin/sh\necho \"del $2\" >> /var/lib/kurma-network/calls\n")))
	must(t, b.Dir("var/lib/kurma-network", 0o755))
	must(t, b.Close())
	must(t, f.Close())
	return "file://" + p
}

// TestNetworkPluginFailures runs a plugin that fails in each way in the
// networking pod: the pod start fails with the plugin's message (or the
// timeout) within the limit, del runs for the failing network, and no pod,
// netns reference or plugin process is left.
func TestNetworkPluginFailures(t *testing.T) {
	testutil.RequireRoot(t)
	if testing.Short() {
		t.Skip("end-to-end")
	}
	b := findBins(t)
	src := serveBusybox(t)
	aci := faultyPluginACI(t)
	t.Setenv("KURMA_NETWORK_CALL_TIMEOUT", "2s")
	d := startDaemon(t, b, `pod_networks: [{"name": "knpf", "aci": "`+aci+`", "default": true, "containerInterface": "eth0", "cniVersion": "1.0.0", "type": "knp-faulty"}]`+"\n")
	state := filepath.Join(d.dir, "network", "knpf")
	eventually(t, 30*time.Second, func() error {
		if n := netList(t, d)["knpf"]; n.State != "running" {
			return fmt.Errorf("knpf %+v", n)
		}
		return nil
	})
	// The main got the network's config on stdin (then EOF: cat ended).
	eventually(t, 10*time.Second, func() error {
		c, _ := os.ReadFile(filepath.Join(state, "config"))
		if !strings.Contains(string(c), `"type":"knp-faulty"`) || !strings.Contains(string(c), `"name":"knpf"`) || strings.Contains(string(c), "aci") {
			return fmt.Errorf("main's stdin: %q", c)
		}
		return nil
	})
	for _, tc := range []struct {
		mode, want string
		within     time.Duration
	}{
		{"exit1", `network "knpf": add exited with 1: knp plugin broke on `, 10 * time.Second},
		{"garbage", `network "knpf": add printed no valid result`, 10 * time.Second},
		{"hang", `network "knpf": add did not finish within 2s (killed)`, 12 * time.Second},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			must(t, os.WriteFile(filepath.Join(state, "mode"), []byte(tc.mode), 0o644))
			must(t, os.WriteFile(filepath.Join(state, "calls"), nil, 0o644))
			name := testutil.UniqueName("knp")
			start := time.Now()
			_, stderr, code := d.kurma("run", "-d", "--name", name, src.aci, "sleep", "1000")
			took := time.Since(start)
			if code == 0 {
				d.kurma("rm", "-f", name)
				t.Fatal("pod started on a failing plugin")
			}
			if !strings.Contains(stderr, tc.want) {
				t.Errorf("error %q, want %q", stderr, tc.want)
			}
			if took > tc.within {
				t.Errorf("failure took %s", took)
			}
			if _, _, code := d.kurma("inspect", name); code == 0 {
				t.Errorf("pod %s left after the failed start", name)
			}
			calls, _ := os.ReadFile(filepath.Join(state, "calls"))
			if strings.Count(string(calls), "del ") != 1 {
				t.Errorf("del calls %q, want one", calls)
			}
			if ents, _ := os.ReadDir(d.netnsDir()); len(ents) != 0 {
				t.Errorf("netns references left: %d", len(ents))
			}
			// Only the main's sleep is left in the networking pod.
			eventually(t, 5*time.Second, func() error {
				if n := countPodProcs(t, d, "sleep"); n != 1 {
					return fmt.Errorf("%d sleep processes in the networking pod, want 1 (the main)", n)
				}
				return nil
			})
		})
	}
}

// countPodProcs counts the networking pod's processes named comm.
func countPodProcs(t *testing.T, d *daemon, comm string) int {
	t.Helper()
	stager := d.inspect(t, manager.DefaultNetPodName).StagerPID
	n := 0
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		var pid int
		if _, err := fmt.Sscan(p.Name(), &pid); err != nil {
			continue
		}
		c, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		if err != nil || strings.TrimSpace(string(c)) != comm {
			continue
		}
		for q := pid; q > 1; {
			if q == stager {
				n++
				break
			}
			st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", q))
			if err != nil {
				break
			}
			s := string(st)
			f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
			var ppid int
			if len(f) < 2 {
				break
			}
			if _, err := fmt.Sscan(f[1], &ppid); err != nil || ppid == q {
				break
			}
			q = ppid
		}
	}
	return n
}
