package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"kurma.dev/kurma/internal/testutil"
)

// TestReset: with kurmad killed and its pods still running,
// deploy/kurma-reset.sh ends the pods and removes their cgroups, mounts,
// masquerade rules and the daemon's folders; the harness's cleanup then
// finds nothing left (no mount, process or pod folder under the daemon's
// folder, no netns reference).
func TestReset(t *testing.T) {
	testutil.RequireRoot(t)
	if testing.Short() {
		t.Skip("end-to-end")
	}
	b := findBins(t)
	src := serveBusybox(t)
	d := startDaemon(t, b)
	name := testutil.UniqueName("kapi")
	uuid := strings.TrimSpace(d.ok(t, "run", "-d", "--name", name, src.aci, "sleep", "1000"))
	var ps []struct {
		StagerPID int `json:"stagerPID"`
	}
	if err := json.Unmarshal([]byte(d.ok(t, "inspect", uuid)), &ps); err != nil || len(ps) != 1 || ps[0].StagerPID == 0 {
		t.Fatalf("inspect %s: %v %+v", uuid, err, ps)
	}
	pid := ps[0].StagerPID
	d.kill9()

	script := filepath.Join(testutil.RepoRoot(t), "deploy", "kurma-reset.sh")
	cmd := exec.Command(script)
	// This daemon's folders; the default network's bridge and IPAM folder
	// are shared with the other tests, so they stay.
	cmd.Env = append(os.Environ(), "KURMA_STATE_DIR="+d.dir, "KURMA_RUN_DIR="+d.netnsDir(),
		"KURMA_NETWORK_STATE=", "KURMA_BRIDGE=")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("kurma-reset: %v\n%s", err, out)
	}
	t.Logf("kurma-reset:\n%s", out)
	// Killed, it may stay a zombie until its new parent reaps it.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil || strings.Contains(string(st), ") Z ") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the pod's stager (pid %d) still runs", pid)
		}
	}
	if _, err := os.Stat(d.dir); err == nil {
		t.Errorf("%s still exists", d.dir)
	}
	for _, h := range []string{"/sys/fs/cgroup/memory", "/sys/fs/cgroup/pids", "/sys/fs/cgroup/unified", "/sys/fs/cgroup"} {
		if _, err := os.Stat(filepath.Join(h, "kurma", uuid)); err == nil {
			t.Errorf("cgroup %s still exists", filepath.Join(h, "kurma", uuid))
		}
	}
	if rules, err := exec.Command("nft", "list", "table", "inet", masqTable).Output(); err == nil && strings.Contains(string(rules), uuid) {
		t.Errorf("masquerade rule for %s left:\n%s", uuid, rules)
	}
}
