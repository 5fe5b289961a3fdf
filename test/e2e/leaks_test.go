package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"kurma.dev/kurma/internal/testutil"
)

// TestFindLeaks proves the leak check the daemon's cleanup relies on: it
// reports a mount and a process rooted under the state dir.
func TestFindLeaks(t *testing.T) {
	testutil.RequireRoot(t)
	dir := t.TempDir()
	if l := findLeaks(dir); len(l) != 0 {
		t.Fatalf("fresh dir has leaks: %v", l)
	}
	mnt := filepath.Join(dir, "m")
	must(t, os.Mkdir(mnt, 0o755))
	must(t, syscall.Mount("tmpfs", mnt, "tmpfs", 0, "size=1m"))
	t.Cleanup(func() { _ = syscall.Unmount(mnt, syscall.MNT_DETACH) })
	cmd := exec.Command("sleep", "30")
	cmd.Dir = mnt
	must(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	l := strings.Join(findLeaks(dir), "\n")
	if !strings.Contains(l, "mount "+mnt) || !strings.Contains(l, "process ") {
		t.Fatalf("leaks not found:\n%s", l)
	}
}
