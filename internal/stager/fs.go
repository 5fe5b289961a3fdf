package stager

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"kurma.dev/kurma/internal/mountinfo"
	"kurma.dev/kurma/pkg/appc"
	"kurma.dev/kurma/pkg/kerrors"
	"kurma.dev/kurma/pkg/stagerspec"
)

// buildRootfs assembles one app's root filesystem at AppRootfs(app) from
// its layers (top-most first): an overlay mount, or a copy when overlay is
// unavailable or the config asks for it. It returns the union used.
func buildRootfs(log *slog.Logger, app string, layers []string, union string) (string, error) {
	base := filepath.Join(AppsDir, app)
	rootfs := AppRootfs(app)
	if err := os.MkdirAll(rootfs, 0o755); err != nil {
		return "", fmt.Errorf("app %q: %w", app, err)
	}
	lower := make([]string, 0, len(layers))
	for _, id := range layers {
		lower = append(lower, filepath.Join(stagerspec.LayersDir, id))
	}
	if union != "copy" && len(lower) > 0 {
		var err error
		if !onOverlay(AppsDir) {
			if err = mountOverlay(base, rootfs, lower, false); err == nil {
				return "overlay", nil
			}
		}
		// The stager's root is usually an overlay itself (the daemon's),
		// which cannot hold an upper dir: keep the app's writes in a tmpfs.
		err2 := mountOverlay(base, rootfs, lower, true)
		if err2 == nil {
			return "overlay-tmpfs", nil
		}
		err = errors.Join(err, err2)
		if union == "overlay" {
			return "", fmt.Errorf("app %q: %w", app, err)
		}
		log.Warn("overlay unavailable, copying layers", "app", app, "err", err)
	}
	// Bottom-most first, so upper layers overwrite and white out.
	for i := len(lower) - 1; i >= 0; i-- {
		if err := CopyLayer(lower[i], rootfs); err != nil {
			return "", fmt.Errorf("app %q: copy layer %s: %w", app, layers[i], err)
		}
	}
	return "copy", nil
}

// onOverlay reports whether dir is on an overlay filesystem, which cannot
// hold an overlay's upper dir (so there is no point trying).
func onOverlay(dir string) bool {
	var st unix.Statfs_t
	return unix.Statfs(dir, &st) == nil && st.Type == unix.OVERLAYFS_SUPER_MAGIC
}

// mountOverlay mounts the layers at rootfs with upper and work dirs under
// base, or under a tmpfs mounted at base/scratch when scratch is set.
func mountOverlay(base, rootfs string, lower []string, scratch bool) (retErr error) {
	if scratch {
		base = filepath.Join(base, "scratch")
		if err := os.MkdirAll(base, 0o755); err != nil {
			return err
		}
		if err := unix.Mount("tmpfs", base, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=755"); err != nil {
			return fmt.Errorf("mount scratch tmpfs: %w", err)
		}
		defer func() {
			if retErr != nil {
				_ = unix.Unmount(base, unix.MNT_DETACH)
			}
		}()
	}
	upper := filepath.Join(base, "upper")
	work := filepath.Join(base, "work")
	for _, d := range []string{upper, work} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	for _, l := range lower {
		if strings.ContainsAny(l, ":,") {
			return kerrors.New(kerrors.Invalid, "layer path %q unusable in overlay options", l)
		}
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", strings.Join(lower, ":"), upper, work)
	if len(opts) >= unix.Getpagesize()-1 {
		return kerrors.New(kerrors.Invalid, "too many layers for one overlay mount")
	}
	// volatile: the upper dir lives no longer than the pod, so the overlay
	// need not sync it (on unmount that sync was the largest part of a
	// pod's teardown when the upper dir was on a disk). Kernels before
	// 5.10 refuse the option; then mount without it.
	err := unix.Mount("overlay", rootfs, "overlay", 0, opts+",volatile")
	if errors.Is(err, unix.EINVAL) {
		err = unix.Mount("overlay", rootfs, "overlay", 0, opts)
	}
	if err != nil {
		return fmt.Errorf("mount overlay: %w", err)
	}
	return nil
}

// prepareMounts gives an app's rootfs a minimal /dev (setupDev),
// /sys read-only, a /proc mount point (init mounts the pod's proc there),
// and binds the pod volumes the app mounts.
func prepareMounts(m *stagerspec.Manifest, ra appc.RuntimeApp, def appc.App, rootfs string) error {
	for _, d := range []string{"proc", "dev", "sys", "tmp"} {
		if err := mkdirIn(rootfs, "/"+d); err != nil {
			return err
		}
	}
	if err := setupDev(rootfs); err != nil {
		return err
	}
	if err := bindMount("/sys", filepath.Join(rootfs, "sys"), true); err != nil {
		return fmt.Errorf("bind /sys: %w", err)
	}
	if fi, err := os.Stat("/etc/resolv.conf"); err == nil && fi.Mode().IsRegular() {
		// Best effort: the daemon may provide DNS settings for the pod.
		if b, err := os.ReadFile("/etc/resolv.conf"); err == nil {
			if p, err := SecureJoin(rootfs, "/etc/resolv.conf"); err == nil {
				if os.MkdirAll(filepath.Dir(p), 0o755) == nil {
					_ = os.WriteFile(p, b, 0o644)
				}
			}
		}
	}
	vols := map[string]appc.Volume{}
	for _, v := range m.Pod.Volumes {
		vols[v.Name] = v
	}
	type bind struct {
		vol  appc.Volume
		path string
		ro   bool
	}
	var binds []bind
	seen := map[string]bool{}
	for _, mt := range ra.Mounts {
		v := vols[mt.Volume]
		ro := v.ReadOnly != nil && *v.ReadOnly
		for _, mp := range def.MountPoints {
			if filepath.Clean(mp.Path) == filepath.Clean(mt.Path) && mp.ReadOnly {
				ro = true
			}
		}
		binds = append(binds, bind{v, mt.Path, ro})
		seen[filepath.Clean(mt.Path)] = true
	}
	// Image mount points whose name matches a pod volume are bound too.
	for _, mp := range def.MountPoints {
		v, ok := vols[mp.Name]
		if !ok || seen[filepath.Clean(mp.Path)] || !strings.HasPrefix(mp.Path, "/") {
			continue
		}
		binds = append(binds, bind{v, mp.Path, mp.ReadOnly || (v.ReadOnly != nil && *v.ReadOnly)})
	}
	for _, b := range binds {
		src := filepath.Join(stagerspec.VolumesDir, b.vol.Name)
		fi, err := os.Stat(src)
		if err != nil {
			return fmt.Errorf("volume %q: %w", b.vol.Name, err)
		}
		dst, err := SecureJoin(rootfs, b.path)
		if err != nil {
			return err
		}
		if fi.IsDir() {
			err = os.MkdirAll(dst, 0o755)
		} else {
			err = touch(dst)
		}
		if err != nil {
			return fmt.Errorf("mount point %s: %w", b.path, err)
		}
		if err := bindMount(src, dst, b.ro); err != nil {
			return fmt.Errorf("volume %q at %s: %w", b.vol.Name, b.path, err)
		}
	}
	return nil
}

func bindMount(src, dst string, ro bool) error {
	if err := unix.Mount(src, dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return err
	}
	if ro {
		if err := unix.Mount("", dst, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
			_ = unix.Unmount(dst, unix.MNT_DETACH)
			return fmt.Errorf("remount read-only: %w", err)
		}
	}
	return nil
}

func mkdirIn(rootfs, p string) error {
	host, err := SecureJoin(rootfs, p)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(host, 0o755); err != nil {
		return fmt.Errorf("mkdir %s: %w", p, err)
	}
	return nil
}

func touch(p string) error {
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	return f.Close()
}

// teardownRootfs unmounts everything mounted for an app, deepest first.
// Plain unmounts, not lazy ones: once the pod's processes are gone nothing
// holds them, and on current kernels a lazy (MNT_DETACH) unmount may wait
// for an RCU grace period, which cost tens of milliseconds per pod under
// load. A mount that is still busy is detached lazily instead.
func teardownRootfs(app string) error {
	base := filepath.Join(AppsDir, app)
	subs, err := mountsUnder(base)
	if err != nil {
		return fmt.Errorf("app %q: list mounts: %w", app, err)
	}
	var errs []error
	for i := len(subs) - 1; i >= 0; i-- {
		err := unix.Unmount(subs[i], 0)
		if errors.Is(err, unix.EBUSY) {
			err = unix.Unmount(subs[i], unix.MNT_DETACH)
		}
		if err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", subs[i], err))
		}
	}
	return errors.Join(errs...)
}

// mountsUnder lists mount points strictly below dir, in mount order.
func mountsUnder(dir string) ([]string, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		mp := mountinfo.Unescape(f[4])
		if strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	return out, nil
}
