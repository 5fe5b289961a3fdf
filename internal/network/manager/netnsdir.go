package manager

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"kurma.dev/kurma/internal/mountinfo"
	"kurma.dev/kurma/internal/pod"
)

// DefaultNetNSDir is where kurmad keeps the pods' network namespace
// references that the networking pod sees (Options.NetNSDir).
const DefaultNetNSDir = "/run/kurma/netns"

// PrepareNetNSDir makes dir (created if needed) a mount point with shared
// propagation, so that the netns references bound under it later reach the
// networking pod, which mounts dir as a volume with slave propagation. It
// is idempotent: a dir that is a mount point already is only made shared.
func PrepareNetNSDir(dir string) error {
	if !filepath.IsAbs(dir) {
		return fmt.Errorf("netns dir %q must be an absolute path", dir)
	}
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return fmt.Errorf("create netns dir: %w", err)
	}
	mounted, err := isMountPoint(dir)
	if err != nil {
		return err
	}
	if !mounted {
		if err := unix.Mount(dir, dir, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind %s on itself: %w", dir, err)
		}
	}
	if err := unix.Mount("", dir, "", unix.MS_SHARED, ""); err != nil {
		return fmt.Errorf("make %s shared: %w", dir, err)
	}
	return nil
}

// ReleaseNetNSDir unmounts what PrepareNetNSDir and the attachments left
// under dir (for tests; kurmad keeps the dir across restarts).
func ReleaseNetNSDir(dir string) error {
	ents, _ := os.ReadDir(dir)
	var errs []error
	for _, e := range ents {
		p := filepath.Join(dir, e.Name())
		_ = unix.Unmount(p, unix.MNT_DETACH)
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
		errs = append(errs, fmt.Errorf("unmount %s: %w", dir, err))
	}
	return errors.Join(errs...)
}

// isMountPoint reports whether p is a mount point of this mount namespace.
func isMountPoint(p string) (bool, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return false, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && mountinfo.Unescape(fields[4]) == p {
			return true, nil
		}
	}
	return false, sc.Err()
}

// netnsRef returns the pod with NetNS pointing at its reference under
// Options.NetNSDir, binding the pod's namespace there first if it is not
// yet (a reference kept from before a kurmad restart is reused). Without a
// NetNSDir it returns p itself.
//
// For a del (forDel) a reference that exists is used as it is, and when the
// pod's namespace cannot be bound any more the path is returned unbound:
// the plugin's del then finds no namespace and only releases its state.
func (m *Manager) netnsRef(p *pod.Pod, forDel bool) (*pod.Pod, error) {
	if m.opts.NetNSDir == "" {
		return p, nil
	}
	target := filepath.Join(m.opts.NetNSDir, p.UUID)
	cp := *p
	cp.NetNS = target
	if ok, err := sameNetNS(target, p.NetNS); err == nil && ok {
		return &cp, nil
	}
	if forDel {
		var st unix.Statfs_t
		if unix.Statfs(target, &st) == nil && st.Type == unix.NSFS_MAGIC {
			return &cp, nil
		}
		if _, err := os.Stat(p.NetNS); err != nil {
			return &cp, nil
		}
	}
	_ = unix.Unmount(target, unix.MNT_DETACH) // a stale reference
	f, err := os.OpenFile(target, os.O_CREATE|os.O_RDONLY, 0o444)
	if err != nil {
		return nil, fmt.Errorf("create netns reference: %w", err)
	}
	f.Close()
	if err := unix.Mount(p.NetNS, target, "", unix.MS_BIND, ""); err != nil {
		_ = os.Remove(target)
		return nil, fmt.Errorf("bind %s on %s: %w", p.NetNS, target, err)
	}
	return &cp, nil
}

// dropNetNSRef removes the pod's reference under Options.NetNSDir.
func (m *Manager) dropNetNSRef(p *pod.Pod) {
	if m.opts.NetNSDir == "" {
		return
	}
	target := filepath.Join(m.opts.NetNSDir, p.UUID)
	// A plain unmount first: a lazy one may wait for an RCU grace period
	// (tens of ms under load), here once per propagated copy.
	err := unix.Unmount(target, 0)
	if errors.Is(err, unix.EBUSY) {
		err = unix.Unmount(target, unix.MNT_DETACH)
	}
	if err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		m.log.Warn("unmount netns reference", "pod", p.UUID, "err", err)
	}
	if err := os.Remove(target); err != nil && !errors.Is(err, os.ErrNotExist) {
		m.log.Warn("remove netns reference", "pod", p.UUID, "err", err)
	}
}

// sameNetNS reports whether a and b are references to one namespace.
func sameNetNS(a, b string) (bool, error) {
	var sa, sb unix.Stat_t
	if err := unix.Stat(a, &sa); err != nil {
		return false, err
	}
	if err := unix.Stat(b, &sb); err != nil {
		return false, err
	}
	return sa.Dev == sb.Dev && sa.Ino == sb.Ino && sa.Dev != 0, nil
}
