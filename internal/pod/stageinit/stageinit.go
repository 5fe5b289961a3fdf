package stageinit

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// PrestartEnv is stagerspec.PrestartEnv, written out: stage-init links
// nothing it can do without (a test keeps the two equal).
const PrestartEnv = "KURMA_STAGER_GO_FD"

// Arg is the first argument of a stage-init command line:
// `<binary> stage-init <json>`, or `<binary> stage-init -spare`.
const Arg = "stage-init"

// File descriptors of the daemon → stage-init protocol. ReadyFD (4) is the
// stager spec's readiness pipe and passes through to the stager.
const (
	GoFD     = 3 // read end: one byte "go" from the daemon, EOF = abort
	StatusFD = 5 // write end, close-on-exec: an error message, or EOF on exec
)

// Overlay is the overlay of a stager's root.
type Overlay struct {
	Lower string `json:"lower"`
	Upper string `json:"upper"`
	Work  string `json:"work"`
}

// Bind is one bind mount into the stager root.
type Bind struct {
	Source   string `json:"source"`
	Target   string `json:"target"` // path inside the root
	ReadOnly bool   `json:"readOnly,omitempty"`
}

// Config is what the daemon passes to stage-init (as argv[2], or on fd 3
// to a spare).
type Config struct {
	Root string `json:"root"`
	// Overlay, when set, is mounted at Root first (inside the stager's
	// mount namespace: the host never sees it).
	Overlay  *Overlay `json:"overlay,omitempty"`
	Hostname string   `json:"hostname,omitempty"`
	HostNet  bool     `json:"hostNet,omitempty"`
	// Slave makes the mounts rslave instead of rprivate (the host's later
	// mounts under bound volumes then appear in the stager).
	Slave bool   `json:"slave,omitempty"`
	Binds []Bind `json:"binds"`
	// Cgroups bind the pod's cgroup folders at their hierarchy's mount
	// point inside the root.
	Cgroups []Bind `json:"cgroups,omitempty"`
	// CgroupV2Only is set when /sys/fs/cgroup itself is cgroup2.
	CgroupV2Only bool `json:"cgroupV2Only,omitempty"`
	// Prestart starts a pre-started stager (stagerspec.PrestartEnv): Root
	// is already a mount, a shared one of the host's, through which the
	// daemon adds the pod's files later; the mounts become slaves (the
	// root keeps receiving from the host, nothing flows back) instead of
	// private; and stage-init execs the stager at once, handing it fd 3,
	// on which the daemon's go-ahead then reaches the stager itself.
	Prestart bool     `json:"prestart,omitempty"`
	Exec     []string `json:"exec"`
	Env      []string `json:"env,omitempty"`
}

// Main is the body of `kurma-stage-init stage-init` (and of `kurmad
// stage-init`): args are the arguments after Arg. it runs in the fresh
// namespaces of a new stager, prepares its root, waits for the daemon's
// go-ahead on fd 3, pivots into the root and execs the stager with fd 4 (readiness) as
// the only extra descriptor. It returns an exit code only on failure, after
// writing the reason to fd 5 and stderr.
func Main(args []string) int {
	fail := func(err error) int {
		msg := "stage-init: " + err.Error()
		st := os.NewFile(StatusFD, "status")
		_, _ = st.Write([]byte(msg))
		fmt.Fprintln(os.Stderr, msg)
		return 1
	}
	if len(args) != 1 {
		return fail(errors.New("expects one JSON argument"))
	}
	unix.CloseOnExec(GoFD)
	unix.CloseOnExec(StatusFD)
	cfg := []byte(args[0])
	prepared := false
	if args[0] == SpareArg {
		// A warm spare: the config and the log descriptor come later.
		// What needs no config is done while it waits (a spare never has
		// host networking).
		upLoopback(false)
		prepared = true
		var err error
		if cfg, err = receiveConfig(); err != nil {
			return fail(err)
		}
		if cfg == nil {
			return 0 // the daemon let its spare go
		}
	}
	var c Config
	if err := json.Unmarshal(cfg, &c); err != nil {
		return fail(fmt.Errorf("decode config: %w", err))
	}
	if !prepared {
		upLoopback(c.HostNet)
	}
	if err := setupRoot(&c); err != nil {
		return fail(err)
	}
	if c.Prestart {
		if _, err := unix.FcntlInt(GoFD, unix.F_SETFD, 0); err != nil {
			return fail(fmt.Errorf("pass fd %d on: %w", GoFD, err))
		}
		c.Env = append(c.Env, PrestartEnv+"="+strconv.Itoa(GoFD))
	} else {
		var b [1]byte
		if n, _ := io.ReadFull(os.NewFile(GoFD, "go"), b[:]); n != 1 {
			return fail(errors.New("daemon aborted the start"))
		}
	}
	if err := pivotRoot(c.Root); err != nil {
		return fail(err)
	}
	if len(c.Exec) == 0 {
		return fail(errors.New("stager has no exec"))
	}
	exe := c.Exec[0]
	if !strings.HasPrefix(exe, "/") {
		exe = "/" + exe
	}
	err := syscall.Exec(exe, c.Exec, c.Env)
	return fail(fmt.Errorf("exec stager %s: %w", exe, err))
}

// SpareArg is the argument after Arg of a warm spare, which gets its
// Config on fd 3 (see internal/pod/spare.go).
const SpareArg = "-spare"

// receiveConfig waits on fd 3 (a seqpacket socket) for the config message,
// which carries the stager's log descriptor; the log becomes stdout and
// stderr. nil, nil means the daemon closed the socket.
func receiveConfig() ([]byte, error) {
	buf := make([]byte, 1<<20)
	oob := make([]byte, unix.CmsgSpace(4))
	n, oobn, _, _, err := unix.Recvmsg(GoFD, buf, oob, unix.MSG_CMSG_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("receive config: %w", err)
	}
	if n == 0 {
		return nil, nil
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		return nil, fmt.Errorf("receive config: no log descriptor")
	}
	fds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(fds) != 1 {
		return nil, fmt.Errorf("receive config: no log descriptor")
	}
	for _, to := range []int{1, 2} {
		if err := unix.Dup3(fds[0], to, 0); err != nil {
			return nil, fmt.Errorf("redirect output: %w", err)
		}
	}
	unix.Close(fds[0])
	return buf[:n], nil
}

// upLoopback brings up the loopback of a new network namespace (it needs
// no config, so a spare does it while it waits). An ioctl, not netlink:
// every package linked costs each stage-init start its initialisation.
func upLoopback(hostNet bool) {
	if hostNet {
		return
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil || unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr) != nil {
		return
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	_ = unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr)
}

// setupRoot makes the mounts of the stager spec inside the new mount
// namespace, after cutting propagation to the host. (A spare keeps the
// host's propagation until then, so that what the host unmounts meanwhile
// is unmounted in its copy too instead of being pinned by it.)
func setupRoot(c *Config) error {
	prop := uintptr(unix.MS_PRIVATE)
	if c.Slave || c.Prestart {
		// Still nothing propagates to the host, but the host's mounts
		// under a (shared) host volume reach the pod.
		prop = unix.MS_SLAVE
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|prop, ""); err != nil {
		return fmt.Errorf("make / rprivate or rslave: %w", err)
	}
	if c.Prestart {
		// The root is a mount already (the host's, now a slave of it).
	} else if o := c.Overlay; o != nil {
		opts := "lowerdir=" + o.Lower + ",upperdir=" + o.Upper + ",workdir=" + o.Work
		if err := unix.Mount("overlay", c.Root, "overlay", 0, opts); err != nil {
			return fmt.Errorf("mount stager root overlay: %w", err)
		}
	} else if err := unix.Mount(c.Root, c.Root, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		// pivot_root needs the new root to be a mount point.
		return fmt.Errorf("bind stager root on itself: %w", err)
	}
	if c.Hostname != "" {
		_ = unix.Sethostname([]byte(c.Hostname))
	}
	in := func(p string) string { return filepath.Join(c.Root, filepath.Clean("/"+p)) }
	for _, b := range c.Binds {
		// With Slave, recursive: mounts already under a volume (netns
		// references of running pods) come along, later ones propagate.
		if err := bindInto(b.Source, in(b.Target), b.ReadOnly, c.Slave); err != nil {
			return err
		}
	}
	if err := bindInto("/dev", in("/dev"), false, true); err != nil {
		return err
	}
	if err := os.MkdirAll(in("/proc"), 0o755); err != nil {
		return fmt.Errorf("create /proc: %w", err)
	}
	if err := unix.Mount("proc", in("/proc"), "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount /proc: %w", err)
	}
	if err := os.MkdirAll(in("/sys"), 0o755); err != nil {
		return fmt.Errorf("create /sys: %w", err)
	}
	if err := unix.Mount("sysfs", in("/sys"), "sysfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount /sys: %w", err)
	}
	if len(c.Cgroups) > 0 {
		if !c.CgroupV2Only {
			if err := unix.Mount("cgroup", in("/sys/fs/cgroup"), "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=755"); err != nil {
				return fmt.Errorf("mount /sys/fs/cgroup: %w", err)
			}
		}
		for _, cg := range c.Cgroups {
			if err := bindInto(cg.Source, in(cg.Target), false, false); err != nil {
				return err
			}
		}
	}
	return nil
}

// bindInto bind-mounts src on target (made as a folder or file to match),
// read-only when ro.
func bindInto(src, target string, ro, rec bool) error {
	st, err := os.Stat(src)
	if err != nil {
		return fmt.Errorf("bind source: %w", err)
	}
	if st.IsDir() {
		err = os.MkdirAll(target, 0o755)
	} else {
		if err = os.MkdirAll(filepath.Dir(target), 0o755); err == nil {
			var f *os.File
			if f, err = os.OpenFile(target, os.O_CREATE|os.O_RDONLY, 0o644); err == nil {
				f.Close()
			}
		}
	}
	if err != nil {
		return fmt.Errorf("create mount point %s: %w", target, err)
	}
	flags := uintptr(unix.MS_BIND)
	if rec {
		flags |= unix.MS_REC
	}
	if err := unix.Mount(src, target, "", flags, ""); err != nil {
		return fmt.Errorf("bind %s on %s: %w", src, target, err)
	}
	if ro {
		if err := unix.Mount("", target, "", flags|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
			return fmt.Errorf("make %s read-only: %w", target, err)
		}
	}
	return nil
}

// pivotRoot makes root the root of the mount namespace and detaches the old
// root (MNT_DETACH), so the namespace keeps no copy of the host's mount
// tree: host mounts (netns binds of other workloads, volumes of other
// pods) are not pinned by this pod. Done as runc does: pivot_root(".", ".")
// stacks the old root on the new one, which the unmount then drops.
func pivotRoot(root string) error {
	oldRoot, err := unix.Open("/", unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open old root: %w", err)
	}
	defer unix.Close(oldRoot)
	if err := unix.Chdir(root); err != nil {
		return fmt.Errorf("chdir %s: %w", root, err)
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root %s: %w", root, err)
	}
	// The old root is now mounted on top of the new one, at "/": get back
	// onto it, make sure nothing propagates from it, and detach it.
	if err := unix.Fchdir(oldRoot); err != nil {
		return fmt.Errorf("fchdir old root: %w", err)
	}
	if err := unix.Mount("", ".", "", unix.MS_SLAVE|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("make old root rslave: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach old root: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return fmt.Errorf("chdir /: %w", err)
	}
	return nil
}
