package kubecluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// startNode runs containerd with the CRI plugin and a kubelet, imports the
// offline images, and waits for the Node (Ready if a CNI config is set).
func (c *Cluster) startNode(ctx context.Context, opts Options) error {
	c.CgroupRoot = "/" + filepath.Base(c.Dir)
	c.ContainerdSocket = filepath.Join(c.Dir, "containerd", "containerd.sock")
	c.newDirs = missingHostDirs()
	var err error
	if c.sysctls, err = saveSysctls(); err != nil {
		return err
	}
	if err := c.saveRecord(); err != nil {
		return err
	}
	if err := createCgroups(c.CgroupRoot); err != nil {
		return err
	}
	c.CNIConfDir = filepath.Join(c.Dir, "cni", "net.d")
	c.CNIBinDir = filepath.Join(c.Dir, "cni", "bin")
	if err := linkCNIBin(c.CNIBinDir, opts.CNIBinDir, filepath.Join(opts.BinDir, "cni")); err != nil {
		return err
	}
	if err := os.MkdirAll(c.CNIConfDir, 0o755); err != nil {
		return err
	}
	if opts.CNIConfList != nil {
		conf := opts.CNIConfList
		if opts.ChainPortmap {
			if conf, err = ChainPortmap(conf); err != nil {
				return err
			}
		}
		if err := os.WriteFile(filepath.Join(c.CNIConfDir, "10-test.conflist"), conf, 0o644); err != nil {
			return err
		}
	}
	if err := c.startContainerd(ctx, opts.SharedNetNS); err != nil {
		return err
	}
	imgs := []string{filepath.Join(opts.BinDir, "images", "k8s-pause.tar"), filepath.Join(opts.BinDir, "images", "k8s-echo.tar")}
	for _, img := range append(imgs, opts.Images...) {
		if err := c.importImage(ctx, img); err != nil {
			return err
		}
	}
	return c.startKubelet(ctx, opts)
}

// linkCNIBin fills dir with links to every file of src, and to the
// loopback plugin of fallback when src has none.
func linkCNIBin(dir, src, fallback string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	ents, err := os.ReadDir(src)
	if err != nil {
		return fmt.Errorf("CNI bin dir: %w", err)
	}
	for _, e := range ents {
		if err := os.Symlink(filepath.Join(src, e.Name()), filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "loopback")); err != nil {
		return os.Symlink(filepath.Join(fallback, "loopback"), filepath.Join(dir, "loopback"))
	}
	return nil
}

func (c *Cluster) startContainerd(ctx context.Context, sharedNetNS bool) error {
	d := filepath.Dir(c.ContainerdSocket)
	c.NetNSDir = "/var/run/netns"
	netnsLine := ""
	if sharedNetNS {
		// The CRI plugin's state folder holds them (its netns/).
		c.NetNSDir = filepath.Join(d, "state", "io.containerd.grpc.v1.cri", "netns")
		if err := os.MkdirAll(c.NetNSDir, 0o755); err != nil {
			return err
		}
		// A mount point of its own, shared: unmountUnder(c.Dir) undoes it.
		if err := unix.Mount(c.NetNSDir, c.NetNSDir, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind %s: %w", c.NetNSDir, err)
		}
		if err := unix.Mount("", c.NetNSDir, "", unix.MS_SHARED, ""); err != nil {
			return fmt.Errorf("make %s shared: %w", c.NetNSDir, err)
		}
		netnsLine = "netns_mounts_under_state_dir = true"
	}
	conf := fmt.Sprintf(`version = 2
root = %q
state = %q
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = %q
[ttrpc]
  address = %q
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  # Root here lacks CAP_SYS_RESOURCE: runc cannot lower oom_score_adj.
  restrict_oom_score_adj = true
  disable_apparmor = true
  %s
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %q
    conf_dir = %q
    max_conf_num = 1
`, filepath.Join(d, "root"), filepath.Join(d, "state"), c.ContainerdSocket, c.ContainerdSocket+".ttrpc",
		PauseImage, netnsLine, c.CNIBinDir, c.CNIConfDir)
	if err := os.MkdirAll(d, 0o700); err != nil {
		return err
	}
	cfg := filepath.Join(d, "config.toml")
	if err := os.WriteFile(cfg, []byte(conf), 0o600); err != nil {
		return err
	}
	p, err := c.StartProcess("containerd", exec.Command("containerd", "--config", cfg))
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		if _, err := c.ctr(ctx, "version"); err == nil {
			return nil
		}
		select {
		case <-p.Done():
			return fmt.Errorf("containerd exited (%v):\n%s", p.Err(), c.Logs("containerd", 4000))
		case <-ctx.Done():
			return fmt.Errorf("containerd not ready: %w:\n%s", ctx.Err(), c.Logs("containerd", 4000))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// ctr runs ctr against the node's containerd, in the CRI's namespace.
func (c *Cluster) ctr(ctx context.Context, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ctr", append([]string{"--address", c.ContainerdSocket, "--namespace", "k8s.io"}, args...)...)
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// ImportImage imports an image tarball (docker-save or OCI archive) into
// the node's containerd, in the CRI's namespace k8s.io, as
// `ctr -n k8s.io images import` does.
func (c *Cluster) ImportImage(ctx context.Context, path string) error {
	return c.importImage(ctx, path)
}

// importImage imports an image tarball into the CRI's namespace.
func (c *Cluster) importImage(ctx context.Context, path string) error {
	_, err := c.ctr(ctx, "images", "import", "--no-unpack=false", path)
	return err
}

func (c *Cluster) startKubelet(ctx context.Context, opts Options) error {
	d := filepath.Join(c.Dir, "kubelet")
	if err := os.MkdirAll(filepath.Join(d, "pod-logs"), 0o755); err != nil {
		return err
	}
	addr, anon := "127.0.0.1", "false"
	if opts.KubeletAPI {
		addr, anon = NodeIP, "true"
	}
	dns := ""
	if opts.ClusterDNS != "" {
		dom := opts.ClusterDomain
		if dom == "" {
			dom = "cluster.local"
		}
		dns = fmt.Sprintf("clusterDNS: [%s]\nclusterDomain: %s\n", opts.ClusterDNS, dom)
	}
	conf := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: %s
containerRuntimeEndpoint: unix://%s
address: %s
healthzBindAddress: 127.0.0.1
readOnlyPort: 0
authentication:
  anonymous: {enabled: %s}
  webhook: {enabled: false}
authorization:
  mode: AlwaysAllow
failSwapOn: false
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%%
  imagefs.available: 1%%
  nodefs.inodesFree: 1%%
  imagefs.inodesFree: 1%%
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
podLogsDir: %s
maxPods: 250
serializeImagePulls: false
makeIPTablesUtilChains: false
kubeAPIQPS: 100
kubeAPIBurst: 200
%s`, c.CgroupRoot, c.ContainerdSocket, addr, anon, filepath.Join(d, "pod-logs"), dns)
	cfg := filepath.Join(d, "config.yaml")
	if err := os.WriteFile(cfg, []byte(conf), 0o600); err != nil {
		return err
	}
	args := append([]string{"--config=" + cfg, "--kubeconfig=" + c.Kubeconfig,
		"--hostname-override=" + c.NodeName, "--node-ip=" + NodeIP,
		"--root-dir=" + filepath.Join(d, "root"), "--cert-dir=" + filepath.Join(d, "pki")}, opts.KubeletArgs...)
	p, err := c.StartProcess("kubelet", exec.Command(filepath.Join(opts.BinDir, "k8s", "kubelet"), args...))
	if err != nil {
		return err
	}
	return c.waitNode(ctx, p, opts.CNIConfList != nil)
}

// waitNode waits until the Node exists and, if ready is set, is Ready.
func (c *Cluster) waitNode(ctx context.Context, kubelet *Process, ready bool) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	last := "not registered"
	for {
		n, err := c.Client.CoreV1().Nodes().Get(ctx, c.NodeName, metav1.GetOptions{})
		if err == nil {
			if !ready {
				return nil
			}
			for _, cond := range n.Status.Conditions {
				if cond.Type == corev1.NodeReady {
					if cond.Status == corev1.ConditionTrue {
						return nil
					}
					last = cond.Reason + ": " + cond.Message
				}
			}
		}
		select {
		case <-kubelet.Done():
			return fmt.Errorf("kubelet exited (%v):\n%s", kubelet.Err(), c.Logs("kubelet", 6000))
		case <-ctx.Done():
			return fmt.Errorf("node %s not ready (%s): %w\nkubelet:\n%s\ncontainerd:\n%s", c.NodeName, last, ctx.Err(),
				c.Logs("kubelet", 6000), c.Logs("containerd", 3000))
		case <-time.After(200 * time.Millisecond):
		}
	}
}
