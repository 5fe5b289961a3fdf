package stager_test

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
)

// TestOverlayIsVolatile checks that app overlays are mounted volatile, so
// tearing a pod down does not sync the app's writes to disk, in both
// places the upper dir can live.
func TestOverlayIsVolatile(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    podOpts
	}{
		{"upper on the stager's disk", podOpts{}},
		{"upper on a tmpfs", podOpts{overlayRoot: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPod(t, tc.o, podApp{name: "app", exec: []string{"/bin/sleep", "1000"}})
			if !p.waitReady(30 * time.Second) {
				t.Fatalf("stager exited at readiness:\n%s", p.out.String())
			}
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", p.cmd.Process.Pid))
			if err != nil {
				t.Fatal(err)
			}
			found := false
			for _, l := range strings.Split(string(b), "\n") {
				f := strings.Fields(l)
				if len(f) < 5 || f[4] != "/apps/app/rootfs" || !strings.Contains(l, " - overlay ") {
					continue
				}
				found = true
				if !strings.Contains(l, "volatile") {
					t.Errorf("app overlay not volatile: %s", l)
				}
			}
			if !found {
				t.Errorf("no overlay at /apps/app/rootfs in the stager's mounts:\n%s", b)
			}
		})
	}
}
