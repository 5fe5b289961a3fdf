package cniconformance_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"kurma.dev/kurma/internal/testutil"
	"kurma.dev/kurma/test/cniconformance"
)

// podman drives Debian's podman 4.3 with the CNI network backend, runc,
// cgroupfs, vfs storage and every path (storage, state, network configs,
// plugins) in a temp dir, so the host's podman setup is never touched.
type podman struct {
	t   testing.TB
	dir string
	env []string
}

func newPodman(t *testing.T, pluginDir string) *podman {
	t.Helper()
	testutil.RequireRoot(t)
	for _, b := range []string{"podman", "runc"} {
		if _, err := exec.LookPath(b); err != nil {
			t.Skipf("%s not installed (hack/apt-packages.txt lists it)", b)
		}
	}
	dir := t.TempDir()
	for _, d := range []string{"net.d", "root", "run", "tmp", "rootfs/bin"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	conf := fmt.Sprintf(`[containers]
default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]
[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
runtime = "runc"
tmp_dir = %q
[network]
network_backend = "cni"
cni_plugin_dirs = [%q]
network_config_dir = %q
`, filepath.Join(dir, "tmp"), pluginDir, filepath.Join(dir, "net.d"))
	storage := fmt.Sprintf("[storage]\ndriver = \"vfs\"\nrunroot = %q\ngraphroot = %q\n", filepath.Join(dir, "run"), filepath.Join(dir, "root"))
	for name, body := range map[string]string{"containers.conf": conf, "storage.conf": storage, "registries.conf": ""} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	p := &podman{t: t, dir: dir, env: append(os.Environ(),
		"CONTAINERS_CONF="+filepath.Join(dir, "containers.conf"),
		"CONTAINERS_STORAGE_CONF="+filepath.Join(dir, "storage.conf"),
		"CONTAINERS_REGISTRIES_CONF="+filepath.Join(dir, "registries.conf"))}
	// podman's cgroupfs manager puts containers and conmon under
	// libpod_parent in every hierarchy and never removes it.
	cgParents := cniconformance.NewCgroupParents("libpod_parent")
	t.Cleanup(func() {
		_, _ = p.run(context.Background(), "rm", "-af")
		cgParents.Remove()
		// Unmount anything podman left under our dir before TempDir's
		// RemoveAll.
		if out, err := exec.Command("findmnt", "-rno", "TARGET").Output(); err == nil {
			for _, m := range strings.Split(string(out), "\n") {
				if strings.HasPrefix(m, dir) {
					_ = exec.Command("umount", "-l", m).Run()
				}
			}
		}
	})
	// The image: a static busybox imported from a local rootfs.
	bb, err := exec.LookPath("busybox")
	if err != nil {
		t.Skip("busybox-static not installed")
	}
	data, err := os.ReadFile(bb)
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(dir, "rootfs")
	if err := os.WriteFile(filepath.Join(root, "bin", "busybox"), data, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, l := range []string{"sh", "ip", "cat"} {
		if err := os.Symlink("busybox", filepath.Join(root, "bin", l)); err != nil {
			t.Fatal(err)
		}
	}
	tar := filepath.Join(dir, "rootfs.tar")
	testutil.Run(t, "tar", "-C", root, "-cf", tar, ".")
	if out, err := p.run(t.Context(), "import", tar, "localhost/kcni-bb:latest"); err != nil {
		t.Fatalf("podman import: %v\n%s", err, out)
	}
	return p
}

func (p *podman) run(ctx context.Context, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "podman", args...)
	cmd.Env = p.env
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func (p *podman) writeNet(name string, conf []byte) {
	p.t.Helper()
	if err := os.WriteFile(filepath.Join(p.dir, "net.d", name+".conflist"), conf, 0o644); err != nil {
		p.t.Fatal(err)
	}
}

// pluginDir links the upstream plugins and mizarmp into one CNI_PATH.
func pluginDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	up := upstreamCNIDir(t)
	for _, b := range []string{"bridge", "host-local", "loopback"} {
		if err := os.Symlink(filepath.Join(up, b), filepath.Join(dir, b)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(testutil.Bin(t, "mizarmp"), filepath.Join(dir, "mizarmp")); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestPodman(t *testing.T) {
	testutil.RequireRoot(t)
	plugins := pluginDir(t)
	p := newPodman(t, plugins)
	cp, _ := startControlPlane(t)

	br := testutil.UniqueName("kcni")
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", br).Run() })
	sub := "10.247.9."
	nets := []struct {
		name, conf, wantIP string
	}{
		{"kcnibr", fmt.Sprintf(`{"cniVersion":"1.0.0","name":"kcnibr","plugins":[{"type":"bridge","bridge":%q,"isGateway":true,"ipam":{"type":"host-local","subnet":"%s0/24","dataDir":%q}}]}`,
			br, sub, t.TempDir()), sub},
		{"kcnimp", fmt.Sprintf(`{"cniVersion":"1.0.0","name":"kcnimp","plugins":[%s]}`, cp.Conf("1.0.0", "kcnimp")),
			strings.TrimSuffix(cp.CIDR, "0/24")},
	}
	for _, n := range nets {
		t.Run(n.name, func(t *testing.T) {
			p.writeNet(n.name, []byte(n.conf))
			out, err := p.run(t.Context(), "run", "--rm", "--network", n.name, "localhost/kcni-bb:latest",
				"sh", "-c", "ip -4 addr show eth0; echo nofile=$(ulimit -n)")
			if err != nil {
				t.Fatalf("podman run: %v\n%s", err, out)
			}
			if !strings.Contains(out, "inet "+n.wantIP) {
				t.Errorf("container has no %s* address:\n%s", n.wantIP, out)
			}
			if !strings.Contains(out, "nofile=1024") {
				t.Errorf("default_ulimits not applied:\n%s", out)
			}
		})
	}
	// podman ran DEL for the mizarmp container: no port is left.
	deadline := time.Now().Add(10 * time.Second)
	for {
		ports, err := cp.Ports(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if len(ports) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("ports left after podman run --rm: %v", ports)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
