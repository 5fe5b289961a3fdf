package kubecluster

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Node is one node of the cluster: a containerd (CRI) and a kubelet in a
// network namespace of the node's own. The first node (Cluster.Nodes[0])
// lives in the cluster's namespace, with the control plane; with
// Options.Nodes > 1 every other node has a namespace of its own; each node
// has a veth on the underlay switch (UnderlayBridge).
type Node struct {
	// Name is the kubelet's node name; IP its InternalIP on the underlay
	// (NodeIP for the first node).
	Name, IP string
	// NetNS is the path of the node's network namespace.
	NetNS string
	// Dir is the node's folder: the cluster's for the first node,
	// <Dir>/nodes/<Name> for the others.
	Dir string
	// CgroupRoot is the kubelet's cgroup root.
	CgroupRoot string
	// ContainerdSocket is the node's CRI endpoint (a path).
	ContainerdSocket string
	// CNIConfDir and CNIBinDir are the node's CNI folders.
	CNIConfDir, CNIBinDir string
	// NetNSDir is where the node's containerd mounts pod network
	// namespaces (see Cluster.NetNSDir).
	NetNSDir string

	c      *Cluster
	netns  ns.NetNS
	spawn  *spawner
	suffix string // of its daemons' process names: "" for the first node
	// binds are the node's private folders: its view → the host's.
	binds map[string]string
}

// startNode writes conf (the node's conflist, if any), runs the node's
// containerd with the CRI plugin and its kubelet, imports the offline
// images, and waits for the Node (Ready if it has a conflist).
func (c *Cluster) startNode(ctx context.Context, n *Node, opts Options, conf []byte) error {
	base := filepath.Base(c.Dir)
	n.CgroupRoot = "/" + base + n.suffix
	n.ContainerdSocket = filepath.Join(n.Dir, "containerd", "containerd.sock")
	if err := c.saveRecord(); err != nil {
		return err
	}
	if err := createCgroups(n.CgroupRoot); err != nil {
		return err
	}
	n.CNIConfDir = filepath.Join(n.Dir, "cni", "net.d")
	n.CNIBinDir = filepath.Join(n.Dir, "cni", "bin")
	if err := linkCNIBin(n.CNIBinDir, opts.CNIBinDir, filepath.Join(opts.BinDir, "cni")); err != nil {
		return err
	}
	if err := os.MkdirAll(n.CNIConfDir, 0o755); err != nil {
		return err
	}
	if conf != nil {
		var err error
		if opts.ChainPortmap {
			if conf, err = ChainPortmap(conf); err != nil {
				return err
			}
		}
		if err := os.WriteFile(filepath.Join(n.CNIConfDir, "10-test.conflist"), conf, 0o644); err != nil {
			return err
		}
	}
	if err := n.startContainerd(ctx, opts.SharedNetNS); err != nil {
		return err
	}
	imgs := []string{filepath.Join(opts.BinDir, "images", "k8s-pause.tar"), filepath.Join(opts.BinDir, "images", "k8s-echo.tar")}
	for _, img := range append(imgs, opts.Images...) {
		if err := n.ImportImage(ctx, img); err != nil {
			return err
		}
	}
	return n.startKubelet(ctx, opts, conf != nil)
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

func (n *Node) startContainerd(ctx context.Context, sharedNetNS bool) error {
	d := filepath.Dir(n.ContainerdSocket)
	// The state folder: on the other nodes, the first node's path, which
	// their mount namespaces bind to a folder of their own (n.binds), so
	// that the pods' namespaces have the same paths on every node.
	state := filepath.Join(n.c.Dir, "containerd", "state")
	n.NetNSDir = "/var/run/netns"
	netnsLine := ""
	if sharedNetNS {
		// The CRI plugin's state folder holds them (its netns/).
		n.NetNSDir = filepath.Join(state, "io.containerd.grpc.v1.cri", "netns")
		// A mount point of its own, shared: unmountUnder(c.Dir) undoes
		// it (the other nodes' go with their mount namespaces).
		if err := n.spawn.do(func() error {
			if err := os.MkdirAll(n.NetNSDir, 0o755); err != nil {
				return err
			}
			if err := unix.Mount(n.NetNSDir, n.NetNSDir, "", unix.MS_BIND, ""); err != nil {
				return fmt.Errorf("bind %s: %w", n.NetNSDir, err)
			}
			if err := unix.Mount("", n.NetNSDir, "", unix.MS_SHARED, ""); err != nil {
				return fmt.Errorf("make %s shared: %w", n.NetNSDir, err)
			}
			return nil
		}); err != nil {
			return err
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
`, filepath.Join(d, "root"), state, n.ContainerdSocket, n.ContainerdSocket+".ttrpc",
		PauseImage, netnsLine, n.CNIBinDir, n.CNIConfDir)
	if err := os.MkdirAll(d, 0o700); err != nil {
		return err
	}
	cfg := filepath.Join(d, "config.toml")
	if err := os.WriteFile(cfg, []byte(conf), 0o600); err != nil {
		return err
	}
	name := "containerd" + n.suffix
	p, err := n.startDaemon(name, exec.Command("containerd", "--config", cfg))
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		if _, err := n.ctr(ctx, "version"); err == nil {
			return nil
		}
		select {
		case <-p.Done():
			return fmt.Errorf("%s exited (%v):\n%s", name, p.Err(), n.c.Logs(name, 4000))
		case <-ctx.Done():
			return fmt.Errorf("%s not ready: %w:\n%s", name, ctx.Err(), n.c.Logs(name, 4000))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// ctr runs ctr against the node's containerd, in the CRI's namespace.
func (n *Node) ctr(ctx context.Context, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ctr", append([]string{"--address", n.ContainerdSocket, "--namespace", "k8s.io"}, args...)...)
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// ImportImage imports an image tarball (docker-save or OCI archive) into
// every node's containerd, in the CRI's namespace k8s.io, as
// `ctr -n k8s.io images import` does on each node.
func (c *Cluster) ImportImage(ctx context.Context, path string) error {
	for _, n := range c.Nodes {
		if err := n.ImportImage(ctx, path); err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
	}
	return nil
}

// ImportImage imports an image tarball into the node's containerd, in the
// CRI's namespace.
func (n *Node) ImportImage(ctx context.Context, path string) error {
	_, err := n.ctr(ctx, "images", "import", "--no-unpack=false", path)
	return err
}

func (n *Node) startKubelet(ctx context.Context, opts Options, cni bool) error {
	d := filepath.Join(n.Dir, "kubelet")
	if err := os.MkdirAll(filepath.Join(d, "pod-logs"), 0o755); err != nil {
		return err
	}
	addr, anon := "127.0.0.1", "false"
	if opts.KubeletAPI {
		addr, anon = n.IP, "true"
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
%s`, n.CgroupRoot, n.ContainerdSocket, addr, anon, filepath.Join(d, "pod-logs"), dns)
	cfg := filepath.Join(d, "config.yaml")
	if err := os.WriteFile(cfg, []byte(conf), 0o600); err != nil {
		return err
	}
	kubeconfig := n.c.Kubeconfig
	if n.IP != NodeIP { // the API server, reached over the underlay
		kubeconfig = filepath.Join(d, "kubeconfig")
		if err := n.c.writeKubeconfig(kubeconfig, "https://"+net.JoinHostPort(NodeIP, strconv.Itoa(apiPort))); err != nil {
			return err
		}
	}
	args := append([]string{"--config=" + cfg, "--kubeconfig=" + kubeconfig,
		"--hostname-override=" + n.Name, "--node-ip=" + n.IP,
		"--root-dir=" + filepath.Join(d, "root"), "--cert-dir=" + filepath.Join(d, "pki")}, opts.KubeletArgs...)
	p, err := n.startDaemon("kubelet"+n.suffix, exec.Command(filepath.Join(opts.BinDir, "k8s", "kubelet"), args...))
	if err != nil {
		return err
	}
	return n.waitNode(ctx, p, cni)
}

// waitNode waits until the Node exists and, if ready is set, is Ready.
func (n *Node) waitNode(ctx context.Context, kubelet *Process, ready bool) error {
	c := n.c
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	last := "not registered"
	for {
		node, err := c.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err == nil {
			if !ready {
				return nil
			}
			for _, cond := range node.Status.Conditions {
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
			return fmt.Errorf("%s exited (%v):\n%s", kubelet.Name, kubelet.Err(), c.Logs(kubelet.Name, 6000))
		case <-ctx.Done():
			return fmt.Errorf("node %s not ready (%s): %w\nkubelet:\n%s\ncontainerd:\n%s", n.Name, last, ctx.Err(),
				c.Logs(kubelet.Name, 6000), c.Logs("containerd"+n.suffix, 3000))
		case <-time.After(200 * time.Millisecond):
		}
	}
}
