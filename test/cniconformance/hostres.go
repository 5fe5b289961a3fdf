package cniconformance

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"kurma.dev/kurma/internal/testutil"
)

// netnsGoneTimeout bounds the wait for the kernel to finish destroying a
// removed netns (its cleanup runs in a work queue after the last reference
// goes).
const netnsGoneTimeout = 10 * time.Second

// removeNetNS destroys a container netns early, as when the container
// dies before its DEL (its cleanup then finds it gone). It returns once the
// kernel has torn the namespace down: the host-side peers of its veths are
// gone from the host netns. Without that wait, what DEL and the snapshot
// after it see depends on the kernel's timing.
func (e *Env) removeNetNS(t testing.TB, c *Container) {
	t.Helper()
	var peers []int
	err := c.NetNS.Do(func(ns.NetNS) error {
		links, err := netlink.LinkList()
		if err != nil {
			return err
		}
		for _, l := range links {
			if v, ok := l.(*netlink.Veth); ok {
				idx, err := netlink.VethPeerIndex(v)
				if err != nil {
					return err
				}
				peers = append(peers, idx)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("list veth peers of %s: %v", c.NetNS.Path(), err)
	}
	_ = c.NetNS.Close()
	if err := testutil.RemoveNetNS(c.NetNS.Path()); err != nil {
		t.Fatalf("remove netns: %v", err)
	}
	c.NetNS = nil
	for deadline := time.Now().Add(netnsGoneTimeout); ; {
		var left []int
		err := e.inHost(func() error {
			for _, idx := range peers {
				_, err := netlink.LinkByIndex(idx)
				var nf netlink.LinkNotFoundError
				switch {
				case errors.As(err, &nf):
				case err != nil:
					return err
				default:
					left = append(left, idx)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatalf("look up veth peers: %v", err)
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("host-side veths %v still exist %v after their netns was removed", left, netnsGoneTimeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func newCNI(path []string, cacheDir string) *libcni.CNIConfig {
	return libcni.NewCNIConfigWithCacheDir(path, cacheDir, nil)
}

// CgroupParents are cgroup folders of one name, in each hierarchy under
// /sys/fs/cgroup, that a peer (podman) makes and leaves.
type CgroupParents []string

// NewCgroupParents notes the hierarchies where name does not exist yet:
// remove deletes it there again.
func NewCgroupParents(name string) CgroupParents {
	var out CgroupParents
	roots := []string{"/sys/fs/cgroup"}
	if ents, err := os.ReadDir("/sys/fs/cgroup"); err == nil {
		for _, e := range ents {
			if e.IsDir() {
				roots = append(roots, filepath.Join("/sys/fs/cgroup", e.Name()))
			}
		}
	}
	for _, r := range roots {
		p := filepath.Join(r, name)
		if _, err := os.Stat(filepath.Join(r, "cgroup.procs")); err != nil {
			continue // not a hierarchy (the tmpfs holding v1 ones)
		}
		if _, err := os.Stat(p); errors.Is(err, fs.ErrNotExist) {
			out = append(out, p)
		}
	}
	return out
}

// Remove deletes the noted folders and their empty children, deepest
// first (a cgroup with processes stays).
func (c CgroupParents) Remove() {
	for _, p := range c {
		var dirs []string
		_ = filepath.WalkDir(p, func(path string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, path)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			_ = syscall.Rmdir(dirs[i])
		}
	}
}
