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
// it into the underlay: a veth UnderlayLink whose peer joins the switch
// (made, with the first node's link, along with the second node). Close
// removes the namespace, and the veth pair with it.
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
		if err := c.addSwitch(); err != nil {
			return nil, err
		}
	}
	if err := n.netns.Do(func(ns.NetNS) error { return plugUnderlay(UnderlayLink, n.IP, i, int(c.switchNS.Fd())) }); err != nil {
		return nil, fmt.Errorf("underlay of %s: %w", n.Name, err)
	}
	if err := c.switchNS.Do(func(ns.NetNS) error { return joinSwitch(i) }); err != nil {
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

// addSwitch makes the underlay's switch, a namespace of its own
// (recorded at once, so that a sweep finds it) holding the bridge
// UnderlayBridge with bridge netfilter off, and plugs the first node into
// it: a veth UnderlayFirstLink in the cluster's namespace, without an
// address (NodeIP stays on lo, where single-node clusters have it), with
// a route to UnderlayCIDR through it from NodeIP.
//
// The bridge must not live in a node's namespace: there the kernel's
// bridge netfilter (bridge-nf-call-iptables, on by default and needed by
// the nodes' own bridges) runs the node's prerouting NAT on frames still
// inside the bridge, and a packet whose destination that NAT changes to
// an address behind the same bridge port it came from (a node port of
// node 1 whose endpoint is on the client's own node, or the reply to a
// masqueraded client there) is bridged back out its ingress port, which
// a bridge never does: it is dropped (TestUnderlayNodePortHairpin). A
// real node has no bridge on its uplink, so it routes such packets.
func (c *Cluster) addSwitch() error {
	sw, err := testutils.NewNS()
	if err != nil {
		return fmt.Errorf("create the underlay's namespace: %w", err)
	}
	c.switchNS, c.SwitchNetNS = sw, sw.Path()
	if err := c.saveRecord(); err != nil {
		return err
	}
	if err := sw.Do(func(ns.NetNS) error { return addSwitchBridge() }); err != nil {
		return fmt.Errorf("underlay switch: %w", err)
	}
	if err := c.node0.Do(func() error { return plugUnderlay(UnderlayFirstLink, "", 0, int(sw.Fd())) }); err != nil {
		return fmt.Errorf("underlay of %s: %w", c.node0.Name, err)
	}
	if err := sw.Do(func(ns.NetNS) error { return joinSwitch(0) }); err != nil {
		return fmt.Errorf("underlay of %s: %w", c.node0.Name, err)
	}
	return nil
}

// addSwitchBridge, run in the switch's namespace, turns bridge netfilter
// off there (frames cross the switch as they would a real one) and makes
// UnderlayBridge, up.
func addSwitchBridge() error {
	for _, k := range []string{"bridge-nf-call-iptables", "bridge-nf-call-ip6tables", "bridge-nf-call-arptables"} {
		p := filepath.Join("/proc/sys/net/bridge", k)
		if _, err := os.Stat(p); err != nil {
			continue // no bridge netfilter in this kernel
		}
		if err := os.WriteFile(p, []byte("0"), 0o644); err != nil {
			return err
		}
	}
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: UnderlayBridge}}
	if err := netlink.LinkAdd(br); err != nil {
		return fmt.Errorf("add %s: %w", UnderlayBridge, err)
	}
	return netlink.LinkSetUp(br)
}

// switchPort names node i's (0-based) port on the switch.
func switchPort(i int) string { return "u" + strconv.Itoa(i+1) }

// plugUnderlay, run in node i's namespace, brings lo up and makes the
// veth name, up, its peer (switchPort(i)) in the switch's namespace fd.
// With ip, name gets ip/24; without (the first node), it gets no address
// and a route to UnderlayCIDR from NodeIP.
func plugUnderlay(name, ip string, i, fd int) error {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return err
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		return err
	}
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: switchPort(i),
		PeerNamespace: netlink.NsFd(fd)}
	if err := netlink.LinkAdd(veth); err != nil {
		return fmt.Errorf("add veth %s/%s: %w", name, switchPort(i), err)
	}
	l, err := netlink.LinkByName(name)
	if err != nil {
		return err
	}
	if ip != "" {
		addr, err := netlink.ParseAddr(ip + "/24")
		if err != nil {
			return err
		}
		if err := netlink.AddrAdd(l, addr); err != nil {
			return err
		}
	}
	if err := netlink.LinkSetUp(l); err != nil {
		return err
	}
	if ip != "" {
		return nil
	}
	_, dst, _ := net.ParseCIDR(UnderlayCIDR)
	return netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: dst, Src: net.ParseIP(NodeIP),
		Scope: netlink.SCOPE_LINK})
}

// joinSwitch, run in the switch's namespace, plugs node i's port into
// UnderlayBridge and brings it up.
func joinSwitch(i int) error {
	br, err := netlink.LinkByName(UnderlayBridge)
	if err != nil {
		return err
	}
	l, err := netlink.LinkByName(switchPort(i))
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
