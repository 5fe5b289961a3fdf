package cniconformance_test

// A private containerd for the `ctr run --cni` proofs (containerd_test.go).
//
// Debian's containerd 1.6 hard-codes a few host paths that no flag moves:
// the shim sockets under /run/containerd/s, ctr's CNI config dir
// /etc/cni/net.d and its plugin dir /opt/cni/bin. Rather than writing into
// the host's dirs, every containerd and ctr process of a test runs in its
// own private mount namespace (unshare --mount) in which a temp dir is
// bind-mounted over /run (containerd) or over /etc/cni/net.d and
// /opt/cni/bin (ctr). The host's files are never read, written or hidden
// for anyone else, and a config that happens to live in the host's
// /etc/cni/net.d (Debian's podman ships one) cannot be picked up by ctr.
// Only when a bind target is missing on the host is the empty directory
// created, and removed again at cleanup.

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"kurma.dev/kurma/internal/testutil"
)

// ctrdImage is the busybox image every containerd test imports.
const ctrdImage = "kctd.test/busybox:latest"

// ctrd is one private containerd and the ctr client bound to it.
type ctrd struct {
	t      *testing.T
	dir    string
	sock   string
	ns     string // containerd namespace, also the cgroup parent
	netd   string // bind-mounted over /etc/cni/net.d for ctr
	cniBin string // bind-mounted over /opt/cni/bin for ctr
	fifo   string
	cmd    *exec.Cmd
	done   chan struct{}
}

// startContainerd runs a private containerd (native snapshotter, runc v2,
// cgroupfs) for the test and imports the busybox image; cleanup removes
// every task, container, cgroup and process it made.
func startContainerd(t *testing.T) *ctrd {
	t.Helper()
	testutil.RequireRoot(t)
	for _, b := range []string{"containerd", "ctr", "containerd-shim-runc-v2", "runc", "unshare", "busybox"} {
		if _, err := exec.LookPath(b); err != nil {
			t.Skipf("%s not installed (hack/apt-packages.txt lists containerd, runc, busybox-static, util-linux)", b)
		}
	}
	dir, err := os.MkdirTemp("", "kctd")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	c := &ctrd{t: t, dir: dir, sock: filepath.Join(dir, "c.sock"), ns: testutil.UniqueName("kctd"),
		netd: filepath.Join(dir, "net.d"), cniBin: filepath.Join(dir, "cnibin"), fifo: filepath.Join(dir, "fifo"),
		done: make(chan struct{})}
	for _, d := range []string{"run", "root", "state", "net.d", "cnibin", "fifo"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	ensureHostDir(t, "/etc/cni/net.d")
	ensureHostDir(t, "/opt/cni/bin")

	conf := fmt.Sprintf(`version = 2
root = %q
state = %q
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = %q
[ttrpc]
  address = %q
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.runtime.v2.task"]
  platforms = ["linux/%s"]
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), c.sock, c.sock+".ttrpc", runtime.GOARCH)
	cfg := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(cfg, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(filepath.Join(dir, "containerd.log"))
	if err != nil {
		t.Fatal(err)
	}
	// unshare and sh exec in place: the PID we hold is containerd's.
	c.cmd = exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c",
		`mount --bind "$1" /run && exec containerd --config "$2"`, "sh", filepath.Join(dir, "run"), cfg)
	c.cmd.Stdout, c.cmd.Stderr = logf, logf
	if err := c.cmd.Start(); err != nil {
		t.Fatalf("start containerd: %v", err)
	}
	go func() { _ = c.cmd.Wait(); _ = logf.Close(); close(c.done) }()
	t.Cleanup(c.stop)

	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := c.ctr(t.Context(), "version"); err == nil {
			break
		}
		select {
		case <-c.done:
			t.Fatalf("containerd exited:\n%s", c.log())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("containerd not ready on %s:\n%s", c.sock, c.log())
		}
		time.Sleep(50 * time.Millisecond)
	}
	c.importImage()
	return c
}

// ensureHostDir creates path (a bind target) if it is missing, and removes
// at cleanup exactly the directories it created, if still empty.
func ensureHostDir(t *testing.T, path string) {
	t.Helper()
	var created []string
	for p := path; p != "/"; p = filepath.Dir(p) {
		if _, err := os.Stat(p); err == nil {
			break
		}
		created = append(created, p)
	}
	if err := os.MkdirAll(path, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, p := range created { // deepest first
			_ = syscall.Rmdir(p)
		}
	})
}

func (c *ctrd) log() string {
	b, _ := os.ReadFile(filepath.Join(c.dir, "containerd.log"))
	return string(b)
}

// ctrCmd is ctr in a private mount namespace whose /etc/cni/net.d and
// /opt/cni/bin are this test's dirs.
func (c *ctrd) ctrCmd(ctx context.Context, args ...string) *exec.Cmd {
	full := append([]string{"--mount", "--propagation", "private", "sh", "-c",
		`mount --bind "$1" /etc/cni/net.d && mount --bind "$2" /opt/cni/bin && shift 2 && exec ctr "$@"`,
		"sh", c.netd, c.cniBin, "--address", c.sock, "--namespace", c.ns}, args...)
	cmd := exec.CommandContext(ctx, "unshare", full...)
	cmd.Env = append(os.Environ(), "CONTAINERD_SNAPSHOTTER=native")
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

// ctr runs a ctr command to completion (1 minute at most).
func (c *ctrd) ctr(ctx context.Context, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	out, err := c.ctrCmd(ctx, args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// runArgs are the `ctr run` arguments for a CNI container named id.
func (c *ctrd) runArgs(id string, argv ...string) []string {
	return append([]string{"run", "--cni", "--rm", "--fifo-dir", c.fifo, ctrdImage, id}, argv...)
}

// fullID is the container id ctr hands to CNI ("<namespace>-<id>").
func (c *ctrd) fullID(id string) string { return c.ns + "-" + id }

// setNetwork installs conf as the only network config ctr sees and links
// the named plugin binaries into its plugin dir.
func (c *ctrd) setNetwork(name string, conf []byte, plugins map[string]string) {
	c.t.Helper()
	if err := os.WriteFile(filepath.Join(c.netd, "10-"+name+".conflist"), conf, 0o644); err != nil {
		c.t.Fatal(err)
	}
	for b, p := range plugins {
		if err := os.Symlink(p, filepath.Join(c.cniBin, b)); err != nil && !errors.Is(err, os.ErrExist) {
			c.t.Fatal(err)
		}
	}
}

// stop removes what is left in our namespace (tasks, containers, images),
// then stops containerd and any shim of ours by PID, and removes the
// namespace's empty cgroup parents.
func (c *ctrd) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if out, err := c.ctr(ctx, "tasks", "ls", "-q"); err == nil {
		for _, id := range strings.Fields(out) {
			_, _ = c.ctr(ctx, "tasks", "kill", "-s", "SIGKILL", id)
			_, _ = c.ctr(ctx, "tasks", "rm", "-f", id)
		}
	}
	if out, err := c.ctr(ctx, "containers", "ls", "-q"); err == nil {
		for _, id := range strings.Fields(out) {
			_, _ = c.ctr(ctx, "containers", "rm", id)
		}
	}
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(10 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.done
	}
	// Shims are re-parented daemons; ours carry our socket in their argv.
	for _, pid := range pidsWithArg(c.sock) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	for _, ctl := range []string{"cpu", "cpuacct", "cpuset", "memory", "devices", "freezer", "blkio", "pids", "systemd",
		"net_cls", "net_prio", "net_cls,net_prio", "cpu,cpuacct", "perf_event", "hugetlb", "rdma", "misc", "unified", ""} {
		_ = syscall.Rmdir(filepath.Join("/sys/fs/cgroup", ctl, c.ns))
	}
}

// pidsWithArg lists processes with arg among their command-line arguments.
func pidsWithArg(arg string) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		for _, a := range bytes.Split(b, []byte{0}) {
			if string(a) == arg {
				out = append(out, pid)
				break
			}
		}
	}
	return out
}

// importImage builds a busybox image (Debian's static busybox plus applet
// links) as a docker archive and imports it.
func (c *ctrd) importImage() {
	c.t.Helper()
	bb, err := exec.LookPath("busybox")
	if err != nil {
		c.t.Skip("busybox-static not installed")
	}
	layer, err := busyboxLayer(bb)
	if err != nil {
		c.t.Fatal(err)
	}
	img, err := mutate.ConfigFile(empty.Image, &v1.ConfigFile{
		Architecture: runtime.GOARCH, OS: "linux",
		RootFS: v1.RootFS{Type: "layers"},
		Config: v1.Config{Cmd: []string{"sh"}, Env: []string{"PATH=/bin"}},
	})
	if err != nil {
		c.t.Fatal(err)
	}
	if img, err = mutate.AppendLayers(img, layer); err != nil {
		c.t.Fatal(err)
	}
	tag, err := name.NewTag(ctrdImage)
	if err != nil {
		c.t.Fatal(err)
	}
	path := filepath.Join(c.dir, "busybox.tar")
	f, err := os.Create(path)
	if err != nil {
		c.t.Fatal(err)
	}
	if err := tarball.Write(tag, img, f); err != nil {
		c.t.Fatalf("write image: %v", err)
	}
	if err := f.Close(); err != nil {
		c.t.Fatal(err)
	}
	if out, err := c.ctr(c.t.Context(), "images", "import", path); err != nil {
		c.t.Fatalf("import image: %v\n%s", err, out)
	}
}

// busyboxLayer is a layer with /bin/busybox, its applet links and the
// empty dirs a container needs.
func busyboxLayer(bb string) (v1.Layer, error) {
	data, err := os.ReadFile(bb)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	now := time.Now()
	for _, d := range []string{"bin/", "tmp/", "proc/", "sys/", "dev/", "etc/", "www/"} {
		mode := int64(0o755)
		if d == "tmp/" {
			mode = 0o1777
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: mode, ModTime: now}); err != nil {
			return nil, err
		}
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "bin/busybox", Mode: 0o755, Size: int64(len(data)), ModTime: now}); err != nil {
		return nil, err
	}
	if _, err := tw.Write(data); err != nil {
		return nil, err
	}
	for _, a := range []string{"sh", "ip", "ifconfig", "cat", "echo", "wget", "httpd", "nc", "sleep", "ls", "mkdir", "ping"} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: "bin/" + a, Linkname: "busybox", Mode: 0o777, ModTime: now}); err != nil {
			return nil, err
		}
	}
	page := []byte(ctrdPage + "\n")
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "www/index.html", Mode: 0o644, Size: int64(len(page)), ModTime: now}); err != nil {
		return nil, err
	}
	if _, err := tw.Write(page); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	raw := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(raw)), nil })
}

// ctrdPage is what the server container serves.
const ctrdPage = "kctd-hello"

var inetRe = regexp.MustCompile(`inet (\d+\.\d+\.\d+\.\d+)/(\d+)`)
