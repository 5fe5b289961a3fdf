package stager_test

import (
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"kurma.dev/kurma/pkg/appc"
	"kurma.dev/kurma/pkg/stagerspec"
)

func sameNamespace(t *testing.T, a, b string) bool {
	t.Helper()
	var sa, sb syscall.Stat_t
	if err := syscall.Stat(a, &sa); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Stat(b, &sb); err != nil {
		t.Fatal(err)
	}
	return sa.Ino == sb.Ino && sa.Dev == sb.Dev
}

// TestNetworkingPodOptions checks the annotations the daemon's networking
// pod uses: the app's main gets fixed stdin content and then EOF; with
// host-ipc/host-uts the apps share the host's IPC and UTS namespaces and
// the host's hostname is left alone; only a host-privileged app has a
// writable /proc/sys.
func TestNetworkingPodOptions(t *testing.T) {
	hostname, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	config := `{"cniVersion":"1.0.0","name":"knp"}` + "\n"
	stdin := []appc.Annotation{{Name: "kurma.dev/stdin", Value: base64.StdEncoding.EncodeToString([]byte(config))}}
	for _, tc := range []struct {
		name   string
		anns   []appc.Annotation
		shared bool
	}{
		{"host namespaces", []appc.Annotation{{Name: "kurma.dev/host-ipc", Value: "true"}, {Name: "kurma.dev/host-uts", Value: "true"}}, true},
		{"own namespaces", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPod(t, podOpts{annotations: tc.anns},
				podApp{name: "main", exec: []string{"/bin/sh", "-c", "cat > /shared/stdin; echo eof >> /shared/stdin; exec sleep 1000"},
					mountShared: "/shared", annotations: stdin},
				podApp{name: "priv", exec: []string{"/bin/sleep", "1000"},
					annotations: []appc.Annotation{{Name: "kurma.dev/host-privileged", Value: "true"}}},
			)
			if !p.waitReady(30 * time.Second) {
				t.Fatalf("stager exited at readiness:\n%s", p.out.String())
			}
			eventually(t, 10*time.Second, func() error {
				b, _ := os.ReadFile(filepath.Join(p.base, "vol-shared", "stdin"))
				if string(b) != config+"eof\n" {
					return fmt.Errorf("main read %q from stdin", b)
				}
				return nil
			})
			st := p.status()
			_, pids := p.podProcesses()
			for _, app := range []string{"main", "priv"} {
				pid := hostPIDOf(t, pids, st[app].PID)
				for _, ns := range []string{"ipc", "uts"} {
					if got := sameNamespace(t, fmt.Sprintf("/proc/%d/ns/%s", pid, ns), "/proc/self/ns/"+ns); got != tc.shared {
						t.Errorf("%s: in the host's %s namespace: %v, want %v", app, ns, got, tc.shared)
					}
				}
			}
			if h, _ := os.Hostname(); h != hostname {
				t.Fatalf("host hostname changed to %q (was %q)", h, hostname)
			}
			for app, wantRO := range map[string]bool{"main": true, "priv": false} {
				res := p.runIn(app, stagerspec.RunSettings{Exec: []string{"/bin/sh", "-c", "grep ' /proc/sys ' /proc/self/mounts || true"}, User: "0", Group: "0"}, "")
				if ro := strings.Contains(res.stdout, " ro,") || strings.Contains(res.stdout, " ro "); ro != wantRO {
					t.Errorf("%s: /proc/sys read-only %v, want %v (mounts %q)", app, ro, wantRO, res.stdout)
				}
			}
		})
	}
}
