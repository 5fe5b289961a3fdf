package stager

import (
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"kurma.dev/kurma/pkg/kerrors"
)

// devNodes are the device nodes an app's /dev gets, copied from the
// stager's /dev (which is the host's).
var devNodes = []string{"null", "zero", "full", "random", "urandom", "tty"}

// setupDev gives an app a minimal /dev instead of the host's: a tmpfs with
// the usual character devices, its own devpts instance (so terminals of
// the app are the app's: PTYPath), /dev/shm and the fd links.
func setupDev(rootfs string) error {
	dev := filepath.Join(rootfs, "dev")
	if err := unix.Mount("tmpfs", dev, "tmpfs", unix.MS_NOSUID|unix.MS_STRICTATIME, "mode=755,size=65536k"); err != nil {
		return fmt.Errorf("mount /dev tmpfs: %w", err)
	}
	for _, n := range devNodes {
		var st unix.Stat_t
		if err := unix.Stat("/dev/"+n, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR {
			continue
		}
		p := filepath.Join(dev, n)
		if err := unix.Mknod(p, unix.S_IFCHR|0o666, int(st.Rdev)); err != nil {
			return fmt.Errorf("mknod /dev/%s: %w", n, err)
		}
		if err := unix.Chmod(p, 0o666); err != nil {
			return err
		}
	}
	for _, d := range []string{"pts", "shm"} {
		if err := os.Mkdir(filepath.Join(dev, d), 0o755); err != nil {
			return err
		}
	}
	if err := unix.Mount("devpts", filepath.Join(dev, "pts"), "devpts", unix.MS_NOSUID|unix.MS_NOEXEC,
		"newinstance,ptmxmode=0666,mode=0620"); err != nil {
		return fmt.Errorf("mount devpts: %w", err)
	}
	if err := unix.Mount("shm", filepath.Join(dev, "shm"), "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=1777,size=65536k"); err != nil {
		return fmt.Errorf("mount /dev/shm: %w", err)
	}
	for name, target := range map[string]string{
		"ptmx": "pts/ptmx", "fd": "/proc/self/fd", "stdin": "/proc/self/fd/0",
		"stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2",
	} {
		if err := os.Symlink(target, filepath.Join(dev, name)); err != nil {
			return err
		}
	}
	return nil
}

// PTYPath is the ptmx of an app's own devpts instance, as seen in the
// stager's (and init's) mount namespace.
func PTYPath(app string) string { return filepath.Join(AppRootfs(app), "dev", "pts", "ptmx") }

// openPTY allocates a terminal pair from the multiplexer at ptmx, so the
// slave belongs to that devpts instance.
func openPTY(ptmx string) (master, slave *os.File, err error) {
	fd, err := unix.Open(ptmx, unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, kerrors.New(kerrors.NotFound, "open %s: %v", ptmx, err)
	}
	if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
		unix.Close(fd)
		return nil, nil, fmt.Errorf("unlock pty: %w", err)
	}
	sfd, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.TIOCGPTPEER, unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC)
	if errno != 0 {
		unix.Close(fd)
		return nil, nil, fmt.Errorf("open pty peer: %w", errno)
	}
	return os.NewFile(uintptr(fd), "ptmx"), os.NewFile(sfd, "pts"), nil
}
