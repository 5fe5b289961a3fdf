package testutil

import (
	"errors"
	"io/fs"
	"os"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"golang.org/x/sys/unix"
)

// NewNetNS creates a fresh, named network namespace (bind-mounted under
// /run/netns) and removes it when the test ends. Its loopback is down, as in
// any new namespace.
func NewNetNS(t testing.TB) ns.NetNS {
	t.Helper()
	RequireRoot(t)
	n, err := testutils.NewNS()
	if err != nil {
		t.Fatalf("create netns: %v", err)
	}
	t.Cleanup(func() {
		_ = n.Close()
		if err := RemoveNetNS(n.Path()); err != nil {
			t.Errorf("remove netns: %v", err)
		}
	})
	return n
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
