package kubecluster

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// lockPath is the host-wide lock that serializes clusters across test
// binaries (the kubelet changes host sysctls; cluster ports are fixed).
var lockPath = filepath.Join(os.TempDir(), "kurma-kubecluster.lock")

// hostLock takes the host-wide cluster lock, waiting for ctx. The wait is
// a blocking flock (woken by the kernel at unlock, so a waiter is not
// starved by a package that starts clusters back to back); when ctx ends
// first, the lock is dropped as soon as it comes.
func hostLock(ctx context.Context, path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	got := make(chan error) // unbuffered: a lock nobody takes is dropped
	abandon := make(chan struct{})
	go func() {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX)
		select {
		case got <- err:
		case <-abandon:
			_ = f.Close()
		}
	}()
	select {
	case err := <-got:
		if err != nil {
			_ = f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		return f, nil
	case <-ctx.Done():
		close(abandon)
		return nil, fmt.Errorf("waiting for %s (another cluster runs): %w", path, ctx.Err())
	}
}

// HostLock is the host-wide cluster lock held across clusters: a program
// that runs clusters back to back and compares them (bench/k8s's
// alternating rounds) holds it, so that no other cluster runs between
// them. Pass it as Options.HeldLock.
type HostLock struct{ f *os.File }

// LockHost waits for the host-wide cluster lock, as Start does.
func LockHost(ctx context.Context) (*HostLock, error) {
	f, err := hostLock(ctx, lockPath)
	if err != nil {
		return nil, err
	}
	return &HostLock{f: f}, nil
}

// Release gives the lock back; no cluster of it may be running.
func (l *HostLock) Release() error { return l.f.Close() }

// mounts returns the mount points of the host's mount namespace whose
// filesystem type matches fstype ("" for all).
func mounts(fstype string) ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	s := bufio.NewScanner(f)
	s.Buffer(make([]byte, 64<<10), 1<<20)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		sep := -1
		for i, x := range fields {
			if x == "-" {
				sep = i
				break
			}
		}
		if len(fields) < 5 || sep < 0 || sep+1 >= len(fields) {
			continue
		}
		if fstype == "" || fields[sep+1] == fstype {
			out = append(out, unescapeMount(fields[4]))
		}
	}
	return out, s.Err()
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// createCgroups creates root in every cgroup v1 hierarchy (the kubelet
// refuses a cgroupRoot with missing paths) and seeds its cpuset.
func createCgroups(root string) error {
	hs, err := mounts("cgroup")
	if err != nil {
		return err
	}
	if len(hs) == 0 {
		return errors.New("no cgroup v1 hierarchy mounted")
	}
	for _, h := range hs {
		d := filepath.Join(h, root)
		if err := os.Mkdir(d, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			v, err := os.ReadFile(filepath.Join(h, f))
			if err != nil {
				continue // not the cpuset hierarchy
			}
			if err := os.WriteFile(filepath.Join(d, f), v, 0o644); err != nil {
				return fmt.Errorf("%s: %w", filepath.Join(d, f), err)
			}
		}
	}
	return nil
}

// removeCgroups kills what is left in root's cgroup trees and removes them,
// deepest first, in every v1 hierarchy and in the v2 one of a hybrid
// host, where the kubelet's runc makes them too.
func removeCgroups(root string) error {
	hs, err := mounts("cgroup")
	if err != nil {
		return err
	}
	v2, err := mounts("cgroup2")
	if err != nil {
		return err
	}
	hs = append(hs, v2...)
	var errs []error
	for _, h := range hs {
		top := filepath.Join(h, root)
		var dirs []string
		_ = filepath.WalkDir(top, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
		for _, d := range dirs {
			if err := emptyCgroup(d); err != nil {
				errs = append(errs, err)
				continue
			}
			if err := unix.Rmdir(d); err != nil && !errors.Is(err, unix.ENOENT) {
				errs = append(errs, fmt.Errorf("rmdir %s: %w", d, err))
			}
		}
	}
	return errors.Join(errs...)
}

// emptyCgroup SIGKILLs every process of cgroup d until none is left (10 s).
func emptyCgroup(d string) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, err := os.ReadFile(filepath.Join(d, "cgroup.procs"))
		if err != nil {
			return nil // gone already
		}
		pids := strings.Fields(string(b))
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cgroup %s still holds %v", d, pids)
		}
		for _, p := range pids {
			if pid, err := strconv.Atoi(p); err == nil {
				_ = unix.Kill(pid, unix.SIGKILL)
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// kubeletSysctls are the kernel settings the kubelet rewrites at start
// (unless protectKernelDefaults, which would make it fail here instead).
var kubeletSysctls = []string{"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
	"kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes"}

func saveSysctls() (map[string]string, error) {
	m := map[string]string{}
	for _, k := range kubeletSysctls {
		b, err := os.ReadFile(filepath.Join("/proc/sys", k))
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			return nil, err
		}
		m[k] = strings.TrimSpace(string(b))
	}
	return m, nil
}

func restoreSysctls(m map[string]string) error {
	var errs []error
	for k, v := range m {
		p := filepath.Join("/proc/sys", k)
		if cur, err := os.ReadFile(p); err == nil && strings.TrimSpace(string(cur)) == v {
			continue
		}
		if err := os.WriteFile(p, []byte(v), 0o644); err != nil {
			errs = append(errs, fmt.Errorf("restore %s: %w", k, err))
		}
	}
	return errors.Join(errs...)
}

// unmountUnder lazily unmounts every mount point below dir, deepest first.
func unmountUnder(dir string) error {
	ms, err := mounts("")
	if err != nil {
		return err
	}
	prefix := filepath.Clean(dir) + "/"
	var under []string
	for _, m := range ms {
		if strings.HasPrefix(m, prefix) {
			under = append(under, m)
		}
	}
	sort.Slice(under, func(i, j int) bool { return len(under[i]) > len(under[j]) })
	var errs []error
	for _, m := range under {
		if err := unix.Unmount(m, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", m, err))
		}
	}
	return errors.Join(errs...)
}

// containerLogDir is where the kubelet links container logs, whatever its
// podLogsDir.
const containerLogDir = "/var/log/containers"

// removeContainerLogLinks removes the kubelet's links in containerLogDir
// that point into dir.
func removeContainerLogLinks(dir string) error {
	ents, err := os.ReadDir(containerLogDir)
	if err != nil {
		return nil
	}
	var errs []error
	for _, e := range ents {
		p := filepath.Join(containerLogDir, e.Name())
		if t, err := os.Readlink(p); err == nil && strings.HasPrefix(t, dir+"/") {
			if err := os.Remove(p); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// hostDirs are folders outside the cluster's own that the node's daemons
// create when missing (shim sockets, the kubelet's log links, libcni's
// cache). Close removes those that did not exist before, once empty.
var hostDirs = []string{"/run/containerd/s", "/run/containerd/runc/k8s.io", "/run/containerd/runc",
	"/run/containerd", containerLogDir, "/var/lib/cni/results", "/var/lib/cni",
	filepath.Dir(devicePluginSocket), "/var/lib/kubelet"}

// devicePluginSocket is the kubelet's device-plugin registration socket,
// whose folder the kubelet hard-codes whatever its --root-dir.
const devicePluginSocket = "/var/lib/kubelet/device-plugins/kubelet.sock"

// missingHostDirs returns the hostDirs that do not exist now.
func missingHostDirs() []string {
	var out []string
	for _, d := range hostDirs {
		if _, err := os.Stat(d); errors.Is(err, fs.ErrNotExist) {
			out = append(out, d)
		}
	}
	return out
}

// removeEmptyDirs removes each of dirs (in order) if it is empty.
func removeEmptyDirs(dirs []string) {
	for _, d := range dirs {
		_ = unix.Rmdir(d) // fails, harmlessly, when not empty
	}
}

// killShims SIGKILLs runc shims that the node's containerd started and
// that outlived it.
func (n *Node) killShims() error {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return err
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if !strings.Contains(args[0], "containerd-shim") {
			continue
		}
		for i := 0; i+1 < len(args); i++ {
			if args[i] == "-address" && args[i+1] == n.ContainerdSocket {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
	return nil
}

// removeSandboxes stops and removes every pod sandbox through the CRI, so
// that containerd runs the CNI DEL and removes each pod's netns, mounts and
// containers.
func (n *Node) removeSandboxes() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	conn, err := grpc.NewClient("unix://"+n.ContainerdSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	rs := cri.NewRuntimeServiceClient(conn)
	// containerd answers `ctr version` before its CRI plugin is up, which
	// says "server is not initialized yet" until then.
	var list *cri.ListPodSandboxResponse
	for {
		list, err = rs.ListPodSandbox(ctx, &cri.ListPodSandboxRequest{})
		if err == nil || !strings.Contains(err.Error(), "not initialized") {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("CRI list sandboxes: %w (%w)", err, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
	if err != nil {
		return fmt.Errorf("CRI list sandboxes: %w", err)
	}
	if len(list.Items) > 0 && n.CNIConfDir != "" {
		if err := teardownCNI(ctx, rs, n.CNIConfDir); err != nil {
			return err
		}
	}
	var errs []error
	for _, sb := range list.Items {
		// One the kubelet already stopped (CNI DEL done) is removed as
		// it is: stopping it again runs CNI DEL again, which fails once
		// a test has removed the CNI configuration (an uninstall).
		if sb.State == cri.PodSandboxState_SANDBOX_NOTREADY {
			if _, err := rs.RemovePodSandbox(ctx, &cri.RemovePodSandboxRequest{PodSandboxId: sb.Id}); err == nil {
				continue
			}
		}
		if err := retryCRI(ctx, func() error {
			_, err := rs.StopPodSandbox(ctx, &cri.StopPodSandboxRequest{PodSandboxId: sb.Id})
			return err
		}); err != nil {
			errs = append(errs, fmt.Errorf("CRI stop sandbox %s: %w", sb.Id, err))
			continue
		}
		if err := retryCRI(ctx, func() error {
			_, err := rs.RemovePodSandbox(ctx, &cri.RemovePodSandboxRequest{PodSandboxId: sb.Id})
			return err
		}); err != nil {
			errs = append(errs, fmt.Errorf("CRI remove sandbox %s: %w", sb.Id, err))
		}
	}
	return errors.Join(errs...)
}

// retryCRI runs call, a stop or remove of a sandbox (both idempotent),
// until it succeeds, for at most 20 s of ctx: containerd 1.6 can fail one
// while a container's shim exits under it ("failed to kill container …:
// ttrpc: closed"), and the same call succeeds once the shim is gone.
func retryCRI(ctx context.Context, call func() error) error {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	for {
		err := call()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// teardownConfList is the CNI network a node gets for its teardown when its
// conf dir has none left (a test uninstalled its CNI): the loopback plugin
// only, whose DEL always succeeds. Without any network, containerd 1.6
// refuses to stop a sandbox whose namespace is still open ("cni plugin not
// initialized"), and its namespace, mounts and shim would stay.
const teardownConfList = `{"cniVersion":"0.4.0","name":"kubecluster-teardown","plugins":[{"type":"loopback"}]}`

// teardownCNI writes teardownConfList into confDir when it holds no CNI
// configuration, and waits until the runtime reports its network ready.
func teardownCNI(ctx context.Context, rs cri.RuntimeServiceClient, confDir string) error {
	for _, pat := range []string{"*.conf", "*.conflist", "*.json"} {
		if m, _ := filepath.Glob(filepath.Join(confDir, pat)); len(m) > 0 {
			return nil
		}
	}
	if err := os.WriteFile(filepath.Join(confDir, "99-kubecluster-teardown.conflist"), []byte(teardownConfList), 0o644); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	last := "no status"
	for {
		st, err := rs.Status(ctx, &cri.StatusRequest{})
		if err == nil && st.Status != nil {
			for _, cond := range st.Status.Conditions {
				if cond.Type == cri.NetworkReady {
					if cond.Status {
						return nil
					}
					last = cond.Reason + ": " + cond.Message
				}
			}
		} else if err != nil {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("teardown CNI network in %s not loaded (%s): %w", confDir, last, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}
