package testutil

import (
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"golang.org/x/sys/unix"
)

// The network namespace helpers of every Kurma test and benchmark live
// here: NewNetNS (an anonymous namespace as an ns.NetNS), NewNamedNetNS (a
// namespace by name, for code that shells out to `ip -n`), CreateNetNS (for
// benchmark mains, without a testing.TB) and RemoveNetNS / DelNamedNetNS.

// NetNSDir is where named network namespaces are bound (ip-netns(8)).
const NetNSDir = "/run/netns"

// NewNetNS creates a fresh, named network namespace (bind-mounted under
// /run/netns) and removes it when the test ends. Its loopback is down, as in
// any new namespace.
func NewNetNS(t testing.TB) ns.NetNS {
	t.Helper()
	RequireRoot(t)
	n, remove, err := CreateNetNS()
	if err != nil {
		t.Fatalf("create netns: %v", err)
	}
	t.Cleanup(func() {
		if err := remove(); err != nil {
			t.Errorf("remove netns: %v", err)
		}
	})
	return n
}

// CreateNetNS creates a network namespace bound under /run/netns and
// returns it with the function that closes and removes it (for benchmark
// mains; tests use NewNetNS).
func CreateNetNS() (ns.NetNS, func() error, error) {
	n, err := testutils.NewNS()
	if err != nil {
		return nil, nil, err
	}
	return n, func() error {
		_ = n.Close()
		return RemoveNetNS(n.Path())
	}, nil
}

// NewNamedNetNS creates the network namespace name (use UniqueName with
// your prefix) with loopback up, removes it when the test ends, and
// returns its path.
func NewNamedNetNS(t testing.TB, name string) string {
	t.Helper()
	RequireRoot(t)
	Run(t, "ip", "netns", "add", name)
	t.Cleanup(func() { DelNamedNetNS(name) })
	Run(t, "ip", "-n", name, "link", "set", "lo", "up")
	return filepath.Join(NetNSDir, name)
}

// DelNamedNetNS removes a named namespace; missing is fine.
func DelNamedNetNS(name string) {
	if _, err := os.Stat(filepath.Join(NetNSDir, name)); err == nil {
		_ = exec.Command("ip", "netns", "del", name).Run()
	}
}

// RemoveNetNS unmounts and deletes a named network namespace, as `ip netns
// del` does: the unmount is lazy (MNT_DETACH) because other mount
// namespaces (pods, containerd, podman started by concurrent tests) may hold
// copies of /run/netns, which make a plain unmount fail with EBUSY. A path
// that is already gone is not an error: some tests remove the namespace
// themselves.
func RemoveNetNS(path string) error {
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
		return &fs.PathError{Op: "unmount", Path: path, Err: err}
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}
