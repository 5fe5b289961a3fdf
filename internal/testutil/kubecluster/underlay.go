package kubecluster

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"

	"kurma.dev/kurma/internal/testutil"
)

// nodeIP returns the underlay address of node i (0-based).
func nodeIP(i int) string {
	ip := net.ParseIP(NodeIP).To4()
	return net.IPv4(ip[0], ip[1], ip[2], ip[3]+byte(i)).String()
}

// addNodeNS makes node i's (i ≥ 1) network namespace and folder and plugs
// it into the underlay: a veth whose peer joins UnderlayBridge in the
// cluster's namespace (made with the second node). Close removes the
// namespace, and the veth pair with it.
func (c *Cluster) addNodeNS(i int, opts Options) (n *Node, retErr error) {
	n = &Node{Name: opts.NodeName + "-" + strconv.Itoa(i+1), IP: nodeIP(i), c: c, suffix: "-" + strconv.Itoa(i+1)}
	n.Dir = filepath.Join(c.Dir, "nodes", n.Name)
	if err := os.MkdirAll(n.Dir, 0o755); err != nil {
		return nil, err
	}
	var err error
	if n.netns, err = testutils.NewNS(); err != nil {
		return nil, fmt.Errorf("create netns of %s: %w", n.Name, err)
	}
	n.NetNS = n.netns.Path()
	// Recorded at once, so that a sweep finds the namespace.
	c.Nodes = append(c.Nodes, n)
	err = c.saveRecord()
	c.Nodes = c.Nodes[:len(c.Nodes)-1]
	defer func() {
		if retErr != nil {
			_ = n.netns.Close()
			_ = testutil.RemoveNetNS(n.NetNS)
		}
	}()
	if err != nil {
		return nil, err
	}
	if i == 1 {
		if err := c.node0.Do(addUnderlayBridge); err != nil {
			return nil, err
		}
	}
	peer := "kkc-u" + strconv.Itoa(i+1) // in the cluster's namespace
	if err := n.netns.Do(func(ns.NetNS) error { return plugUnderlay(n.IP, peer, int(c.netns.Fd())) }); err != nil {
		return nil, fmt.Errorf("underlay of %s: %w", n.Name, err)
	}
	if err := c.node0.Do(func() error { return joinUnderlayBridge(peer) }); err != nil {
		return nil, fmt.Errorf("underlay of %s: %w", n.Name, err)
	}
	if n.spawn, err = newSpawner(n.NetNS); err != nil {
		return nil, err
	}
	n.binds = map[string]string{filepath.Join(c.Dir, "cni"): filepath.Join(n.Dir, "cni"),
		filepath.Join(c.Dir, "containerd", "state"): filepath.Join(n.Dir, "containerd", "state")}
	for k, d := range opts.NodeDirs {
		n.binds[filepath.Clean(d)] = filepath.Join(n.Dir, "private", strconv.Itoa(k))
	}
	if err := n.spawn.do(func() error { return n.privateMounts() }); err != nil {
		n.spawn.stop()
		return nil, fmt.Errorf("mount namespace of %s: %w", n.Name, err)
	}
	return n, nil
}

// privateMounts, run on the node's spawner thread, gives the thread (and
// so every process it starts) a mount namespace of its own, a slave of the
// host's, with n.binds mounted.
func (n *Node) privateMounts() error {
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("unshare: %w", err)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
		return fmt.Errorf("make / rslave: %w", err)
	}
	for dst, src := range n.binds {
		if err := os.MkdirAll(src, 0o755); err != nil {
			return err
		}
		if err := os.MkdirAll(dst, 0o755); err != nil {
			return err
		}
		if err := unix.Mount(src, dst, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind %s on %s: %w", src, dst, err)
		}
	}
	return nil
}

// HostPath returns where, in the host's (the test's) view, the node keeps
// what it sees at path p: p itself on the first node, or below the
// node's folder when p lies in one of its private folders.
func (n *Node) HostPath(p string) string {
	p = filepath.Clean(p)
	best := ""
	for dst := range n.binds {
		if (p == dst || strings.HasPrefix(p, dst+"/")) && len(dst) > len(best) {
			best = dst
		}
	}
	if best == "" {
		return p
	}
	return filepath.Join(n.binds[best], strings.TrimPrefix(p, best))
}

// addUnderlayBridge makes UnderlayBridge in the current (the cluster's)
// namespace, with a route to UnderlayCIDR through it from NodeIP (which
// stays on lo, where single-node clusters have it).
func addUnderlayBridge() error {
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: UnderlayBridge}}
	if err := netlink.LinkAdd(br); err != nil {
		return fmt.Errorf("add %s: %w", UnderlayBridge, err)
	}
	if err := netlink.LinkSetUp(br); err != nil {
		return err
	}
	_, dst, _ := net.ParseCIDR(UnderlayCIDR)
	return netlink.RouteAdd(&netlink.Route{LinkIndex: br.Attrs().Index, Dst: dst, Src: net.ParseIP(NodeIP),
		Scope: netlink.SCOPE_LINK})
}

// plugUnderlay, run in a node's namespace, brings lo up and makes the veth
// UnderlayLink with ip/24 on it, its peer (named peer) in the namespace of
// fd.
func plugUnderlay(ip, peer string, fd int) error {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return err
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		return err
	}
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: UnderlayLink}, PeerName: peer,
		PeerNamespace: netlink.NsFd(fd)}
	if err := netlink.LinkAdd(veth); err != nil {
		return fmt.Errorf("add veth %s/%s: %w", UnderlayLink, peer, err)
	}
	l, err := netlink.LinkByName(UnderlayLink)
	if err != nil {
		return err
	}
	addr, err := netlink.ParseAddr(ip + "/24")
	if err != nil {
		return err
	}
	if err := netlink.AddrAdd(l, addr); err != nil {
		return err
	}
	return netlink.LinkSetUp(l)
}

// joinUnderlayBridge, run in the cluster's namespace, plugs peer into
// UnderlayBridge and brings it up.
func joinUnderlayBridge(peer string) error {
	br, err := netlink.LinkByName(UnderlayBridge)
	if err != nil {
		return err
	}
	l, err := netlink.LinkByName(peer)
	if err != nil {
		return err
	}
	if err := netlink.LinkSetMaster(l, br); err != nil {
		return err
	}
	return netlink.LinkSetUp(l)
}

// PodNetNS returns a path to the network namespace of a running pod of
// the cluster (/proc/PID/ns/net of one of its processes, found through
// the pod's cgroup on its node): tests enter it to dial from the pod.
func (c *Cluster) PodNetNS(p *corev1.Pod) (string, error) {
	var root string
	for _, n := range c.Nodes {
		if n.Name == p.Spec.NodeName {
			root = n.CgroupRoot
		}
	}
	if root == "" {
		return "", fmt.Errorf("pod %s/%s: no node %q in the cluster", p.Namespace, p.Name, p.Spec.NodeName)
	}
	uid := string(p.UID)
	for _, pat := range []string{"kubepods/pod%s/*/cgroup.procs", "kubepods/*/pod%s/*/cgroup.procs"} {
		files, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup/pids", root, fmt.Sprintf(pat, uid)))
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				continue
			}
			for _, pid := range strings.Fields(string(b)) {
				path := "/proc/" + pid + "/ns/net"
				if _, err := os.Stat(path); err == nil {
					return path, nil
				}
			}
		}
	}
	return "", fmt.Errorf("pod %s/%s: no process found under cgroup %s", p.Namespace, p.Name, root)
}
