package kubecluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"kurma.dev/kurma/internal/testutil"
)

// Fixed addresses inside the cluster's own network namespace.
const (
	// NodeIP is the first node's InternalIP, an address on the
	// namespace's lo. Node i (0-based) of a cluster of several has
	// 10.253.0.(i+1) (UnderlayCIDR).
	NodeIP = "10.253.0.1"
	// UnderlayCIDR is the nodes' shared network when Options.Nodes > 1:
	// a switch, the bridge UnderlayBridge in a namespace of its own
	// (Cluster.SwitchNetNS), and a veth from each node plugged into it:
	// UnderlayFirstLink in the first node's namespace, UnderlayLink in
	// every other node's.
	UnderlayCIDR = "10.253.0.0/24"
	// UnderlayBridge, UnderlayFirstLink and UnderlayLink name the
	// underlay's links.
	UnderlayBridge    = "kkc-switch"
	UnderlayFirstLink = "kkc-underlay"
	UnderlayLink      = "eth0"
	apiPort           = 6443
	etcdPort          = 2379
	etcdPeerPort      = 2380
	// ServiceCIDR is the API server's --service-cluster-ip-range.
	ServiceCIDR = "10.96.0.0/16"
	// PauseImage and EchoImage are the offline images every node has
	// (test/k8simages): the sandbox image and the test app.
	PauseImage = "kurma.dev/k8s-pause:latest"
	EchoImage  = "kurma.dev/k8s-echo:latest"
)

// Options say which parts of a cluster to run.
type Options struct {
	// BinDir is where `make build` put its output; default
	// $KURMA_BIN_DIR, else <repo>/bin.
	BinDir string
	// NodeName is the kubelet's node name; default "kurma-node". With
	// Nodes > 1, node i (from 1) is named NodeName-(i+1).
	NodeName string
	// Nodes is the number of nodes (default 1). Each node is a containerd
	// and a kubelet with their own folders, cgroup root and sockets; the
	// first shares the control plane's network namespace, each other one
	// has its own, on a shared underlay (UnderlayCIDR). The API server
	// then listens on every address of the first namespace, so that the
	// other nodes' kubelets reach it at NodeIP.
	//
	// Each node after the first also has a mount namespace of its own
	// (a slave of the host's), as a machine has its own file system: the
	// first node's CNI folder and containerd state folder (NetNSDir) are,
	// there, bind mounts of the node's own, so that a DaemonSet's
	// hostPath naming the first node's folders reaches each node's and pod
	// namespaces have alike paths on every node; NodeDirs adds more.
	Nodes int
	// NodeDirs are host folders (existing ones) that each node after the
	// first sees as an empty folder of its own (Node.HostPath tells where
	// it is in the host's view); the first node sees them as they are.
	// "/run" gives each node its own /run (as a machine has).
	NodeDirs []string
	// NoNode runs only etcd and kube-apiserver (plus the controllers
	// asked for): no containerd, no kubelet.
	NoNode bool
	// ControllerManager and Scheduler start those components, needed
	// for Deployments (ReplicaSets, EndpointSlices) and for pods without
	// spec.nodeName.
	ControllerManager, Scheduler bool
	// CNIConfList is the node's CNI network configuration (a conflist),
	// written as the only file of the CRI's conf dir. Without it the node
	// stays NotReady and Start does not wait for Ready.
	CNIConfList []byte
	// CNIConfLists, when it has an entry for node i (0-based), is that
	// node's own conflist instead of CNIConfList (per-node pod ranges of a
	// host-local bridge).
	CNIConfLists [][]byte
	// CNIBinDir holds the plugins CNIConfList names. The node's plugin
	// folder links every file of it, plus the upstream loopback plugin
	// (containerd runs it for every sandbox) when it is missing.
	// Default: <BinDir>/cni.
	CNIBinDir string
	// KubeletArgs are extra kubelet flags (e.g. --v=2).
	KubeletArgs []string
	// HeldLock, when set, is the host-wide cluster lock the caller holds
	// (LockHost) across several clusters: Start does not take it and
	// Close does not release it.
	HeldLock *HostLock
	// APIServerArgs are extra kube-apiserver flags.
	APIServerArgs []string

	// What the upstream e2e suite assumes of a cluster (test/conformance):

	// PublicAPIServer serves the API on every address of the namespace and
	// advertises NodeIP, with the lease endpoint reconciler: the
	// `kubernetes` Service gets NodeIP:6443 as its endpoint, reached by
	// pods through the Service proxy. The API server reaches kubelets at
	// their InternalIP (their names do not resolve), and pods get service
	// account tokens (ServiceAccount admission; the controller manager,
	// when run, publishes the API server's CA as kube-root-ca.crt).
	PublicAPIServer bool
	// KubeletAPI makes the kubelet listen on NodeIP and serve the API
	// server (exec, logs, port-forward) with anonymous authentication.
	KubeletAPI bool
	// ClusterDNS is the kubelet's clusterDNS (pods' nameserver, e.g.
	// ClusterDNSIP); ClusterDomain its clusterDomain (default
	// "cluster.local" when ClusterDNS is set).
	ClusterDNS, ClusterDomain string
	// Images are more image tarballs (docker-save) to import into the
	// node's containerd, under the names they carry.
	Images []string
	// ChainPortmap appends the upstream portmap plugin (nftables backend)
	// to CNIConfList, for hostPort.
	ChainPortmap bool
	// ServiceAccounts gives pods service account tokens, as a real
	// cluster does (for workloads that use the in-cluster config, such as
	// deploy/kubernetes): the ServiceAccount admission plugin is on, and
	// the controller manager (which it needs: ControllerManager is
	// implied) makes the default accounts and publishes the API server's
	// certificate as the kube-root-ca.crt ConfigMap.
	ServiceAccounts bool
	// SharedNetNS makes containerd mount pod network namespaces in a
	// folder of the cluster's own (NetNSDir) that is a shared mount point,
	// as /var/run/netns is on a systemd host. A pod that mounts it with
	// mountPropagation HostToContainer (a CNI agent's DaemonSet) then sees
	// new namespaces; on a host whose / is private, /var/run/netns cannot
	// be mounted so.
	SharedNetNS bool
}

// Cluster is a running cluster. Its API server listens on 127.0.0.1 inside
// the cluster's network namespace: Config and Client dial through the
// namespace, and processes that use Kubeconfig must run there too
// (Command, StartProcess).
type Cluster struct {
	// Dir is the cluster's folder (configs, state, logs).
	Dir string
	// NetNS is the path of the cluster's network namespace.
	NetNS string
	// Kubeconfig is an admin kubeconfig (static token).
	Kubeconfig string
	// Token is the admin bearer token.
	Token string
	// Config and Client are admin clients for the API server.
	Config *rest.Config
	Client kubernetes.Interface
	// Nodes are the cluster's nodes, the first one first (none with
	// Options.NoNode). The fields below (NodeName to NetNSDir) are the
	// first node's.
	Nodes []*Node
	// NodeName is the kubelet's node; CgroupRoot its cgroup root.
	NodeName, CgroupRoot string
	// ContainerdSocket is the node's CRI endpoint (a path).
	ContainerdSocket string
	// CNIConfDir and CNIBinDir are the node's CNI folders.
	CNIConfDir, CNIBinDir string
	// NetNSDir is where containerd mounts pod network namespaces:
	// /var/run/netns, or with Options.SharedNetNS a folder of the cluster.
	NetNSDir string
	// BinDir is the build output in use.
	BinDir string
	// SwitchNetNS is the path of the underlay switch's network namespace
	// (with Options.Nodes > 1).
	SwitchNetNS string

	netns    ns.NetNS
	switchNS ns.NetNS
	spawn    *spawner
	node0    *Node // the first node: the cluster's namespace (also with NoNode)
	lock     *os.File
	sysctls  map[string]string
	// newDirs are the hostDirs that did not exist when the node started.
	newDirs []string

	mu    sync.Mutex // guards procs
	procs []*Process // in start order

	closeOnce sync.Once
	closeErr  error
}

// BinDir returns the folder `make build` writes to: $KURMA_BIN_DIR, else
// <repo>/bin.
func BinDir() string {
	if d := os.Getenv("KURMA_BIN_DIR"); d != "" {
		return d
	}
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..", "bin")
}

// Binaries returns the build outputs a cluster with opts needs that are
// missing from binDir.
func Binaries(binDir string, opts Options) (missing []string) {
	need := []string{"tools/etcd", "k8s/kube-apiserver", "k8s/kubectl"}
	if opts.ControllerManager {
		need = append(need, "k8s/kube-controller-manager")
	}
	if opts.Scheduler {
		need = append(need, "k8s/kube-scheduler")
	}
	if !opts.NoNode {
		need = append(need, "k8s/kubelet", "images/k8s-pause.tar", "images/k8s-echo.tar", "cni/loopback")
	}
	for _, n := range need {
		if _, err := os.Stat(filepath.Join(binDir, n)); err != nil {
			missing = append(missing, n)
		}
	}
	return missing
}

// HostTools returns the host programs a node needs that are not installed.
func HostTools() (missing []string) {
	for _, b := range []string{"containerd", "containerd-shim-runc-v2", "runc", "ctr"} {
		if _, err := exec.LookPath(b); err != nil {
			missing = append(missing, b)
		}
	}
	return missing
}

// Start runs a cluster and returns once the API server is ready and, with a
// node and a CNI configuration, the node is Ready. On error everything it
// started is undone. The caller must Close the cluster.
func Start(ctx context.Context, opts Options) (c *Cluster, retErr error) {
	if !isRoot() {
		return nil, errors.New("kubecluster: needs root")
	}
	if opts.BinDir == "" {
		opts.BinDir = BinDir()
	}
	if opts.NodeName == "" {
		opts.NodeName = "kurma-node"
	}
	if opts.CNIBinDir == "" {
		opts.CNIBinDir = filepath.Join(opts.BinDir, "cni")
	}
	if opts.ServiceAccounts {
		opts.ControllerManager = true
	}
	if opts.Nodes < 1 {
		opts.Nodes = 1
	}
	if opts.Nodes > 200 {
		return nil, fmt.Errorf("kubecluster: %d nodes (at most 200 on the underlay)", opts.Nodes)
	}
	if m := Binaries(opts.BinDir, opts); len(m) > 0 {
		return nil, fmt.Errorf("kubecluster: missing %v in %s (make build)", m, opts.BinDir)
	}
	if !opts.NoNode {
		if m := HostTools(); len(m) > 0 {
			return nil, fmt.Errorf("kubecluster: %v not installed (hack/apt-packages.txt)", m)
		}
	}
	var (
		lock *os.File
		err  error
	)
	if opts.HeldLock == nil {
		if lock, err = hostLock(ctx, lockPath); err != nil {
			return nil, err
		}
	}
	c = &Cluster{lock: lock, NodeName: opts.NodeName, BinDir: opts.BinDir}
	defer func() {
		if retErr != nil {
			if cerr := c.Close(); cerr != nil {
				retErr = fmt.Errorf("%w (and cleanup: %v)", retErr, cerr)
			}
			c = nil
		}
	}()
	if err := sweep(); err != nil {
		return c, fmt.Errorf("sweep clusters of dead tests: %w", err)
	}
	if c.Dir, err = os.MkdirTemp("", dirPrefix); err != nil {
		return c, err
	}
	if c.netns, err = testutils.NewNS(); err != nil {
		return c, fmt.Errorf("create netns: %w", err)
	}
	c.NetNS = c.netns.Path()
	if err := c.saveRecord(); err != nil {
		return c, err
	}
	if err := c.netns.Do(func(ns.NetNS) error { return setupLoopback() }); err != nil {
		return c, err
	}
	if c.spawn, err = newSpawner(c.NetNS); err != nil {
		return c, err
	}
	c.node0 = &Node{Name: opts.NodeName, IP: NodeIP, NetNS: c.NetNS, Dir: c.Dir, c: c, netns: c.netns, spawn: c.spawn}
	if err := c.startControlPlane(ctx, opts); err != nil {
		return c, err
	}
	if opts.NoNode {
		return c, nil
	}
	c.newDirs = missingHostDirs()
	if c.sysctls, err = saveSysctls(); err != nil {
		return c, err
	}
	c.Nodes = []*Node{c.node0}
	for i := 1; i < opts.Nodes; i++ {
		n, err := c.addNodeNS(i, opts)
		if err != nil {
			return c, err
		}
		c.Nodes = append(c.Nodes, n)
	}
	if err := c.saveRecord(); err != nil {
		return c, err
	}
	for i, n := range c.Nodes {
		conf := opts.CNIConfList
		if i < len(opts.CNIConfLists) && opts.CNIConfLists[i] != nil {
			conf = opts.CNIConfLists[i]
		}
		if err := c.startNode(ctx, n, opts, conf); err != nil {
			return c, fmt.Errorf("node %s: %w", n.Name, err)
		}
	}
	c.CgroupRoot, c.ContainerdSocket = c.node0.CgroupRoot, c.node0.ContainerdSocket
	c.CNIConfDir, c.CNIBinDir, c.NetNSDir = c.node0.CNIConfDir, c.node0.CNIBinDir, c.node0.NetNSDir
	return c, nil
}

func isRoot() bool { return os.Geteuid() == 0 }

// setupLoopback brings lo up and puts NodeIP on it.
func setupLoopback() error {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return err
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		return err
	}
	addr, err := netlink.ParseAddr(NodeIP + "/32")
	if err != nil {
		return err
	}
	return netlink.AddrAdd(lo, addr)
}

// Close stops and removes everything the cluster made. It is safe to call
// more than once.
func (c *Cluster) Close() error {
	c.closeOnce.Do(func() { c.closeErr = c.teardown() })
	return c.closeErr
}

func (c *Cluster) teardown() error {
	var errs []error
	c.mu.Lock()
	procs := append([]*Process(nil), c.procs...)
	c.mu.Unlock()
	byName := map[string]*Process{}
	for _, p := range procs {
		byName[p.Name] = p
	}
	// Caller processes first, newest first; then the kubelets, so that
	// nothing recreates pods; then the sandboxes through the CRI (their
	// CNI DEL runs), then the daemons.
	for i := len(procs) - 1; i >= 0; i-- {
		if !procs[i].daemon {
			procs[i].Stop(5 * time.Second)
		}
	}
	for _, n := range c.Nodes {
		if p := byName["kubelet"+n.suffix]; p != nil {
			p.Stop(10 * time.Second)
		}
	}
	for _, n := range []string{"kube-scheduler", "kube-controller-manager"} {
		if p := byName[n]; p != nil {
			p.Stop(10 * time.Second)
		}
	}
	for _, n := range c.Nodes {
		if p := byName["containerd"+n.suffix]; p != nil {
			if err := n.removeSandboxes(); err != nil {
				errs = append(errs, fmt.Errorf("node %s: %w", n.Name, err))
			}
			p.Stop(10 * time.Second)
			if err := n.killShims(); err != nil {
				errs = append(errs, err)
			}
		}
		if n.CgroupRoot != "" {
			if err := removeCgroups(n.CgroupRoot); err != nil {
				errs = append(errs, err)
			}
		}
	}
	for _, n := range []string{"kube-apiserver", "etcd"} {
		if p := byName[n]; p != nil {
			p.Stop(10 * time.Second)
		}
	}
	for _, n := range c.Nodes {
		if n.spawn != nil && n != c.node0 {
			n.spawn.stop()
		}
	}
	if c.spawn != nil {
		c.spawn.stop()
	}
	if c.Dir != "" {
		if err := unmountUnder(c.Dir); err != nil {
			errs = append(errs, err)
		}
		if err := removeContainerLogLinks(c.Dir); err != nil {
			errs = append(errs, err)
		}
	}
	if len(c.Nodes) > 0 && c.node0.CgroupRoot != "" { // a kubelet ran (under the host lock: ours)
		if err := os.Remove(devicePluginSocket); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	removeEmptyDirs(c.newDirs)
	if err := restoreSysctls(c.sysctls); err != nil {
		errs = append(errs, err)
	}
	if c.Dir != "" {
		if err := os.RemoveAll(c.Dir); err != nil {
			errs = append(errs, err)
		}
	}
	// The other nodes' namespaces (their veths go with them), the
	// switch's, then the cluster's.
	for _, n := range c.Nodes {
		if n.netns != nil && n != c.node0 {
			_ = n.netns.Close()
			if err := testutil.RemoveNetNS(n.NetNS); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if c.switchNS != nil {
		_ = c.switchNS.Close()
		if err := testutil.RemoveNetNS(c.SwitchNetNS); err != nil {
			errs = append(errs, err)
		}
	}
	if c.netns != nil {
		_ = c.netns.Close()
		if err := testutil.RemoveNetNS(c.NetNS); err != nil {
			errs = append(errs, err)
		}
	}
	if c.lock != nil {
		_ = c.lock.Close() // releases the flock
	}
	return errors.Join(errs...)
}

// StartProcess starts cmd inside the cluster's network namespace (sharing
// the host's mount namespace), with SIGKILL as its parent-death signal. Its
// output goes to <Dir>/logs/<name>.log unless cmd sets Stdout/Stderr. Close
// stops it (SIGTERM, then SIGKILL) before the cluster's own daemons.
func (c *Cluster) StartProcess(name string, cmd *exec.Cmd) (*Process, error) {
	return c.startIn(c.spawn, name, cmd, false)
}

// StartProcess starts cmd inside the node's network namespace, as
// Cluster.StartProcess does in the cluster's.
func (n *Node) StartProcess(name string, cmd *exec.Cmd) (*Process, error) {
	return n.c.startIn(n.spawn, name, cmd, false)
}

// startDaemon starts one of the control plane's daemons.
func (c *Cluster) startDaemon(name string, cmd *exec.Cmd) (*Process, error) {
	return c.startIn(c.spawn, name, cmd, true)
}

// startDaemon starts one of the node's own daemons (containerd, kubelet).
func (n *Node) startDaemon(name string, cmd *exec.Cmd) (*Process, error) {
	return n.c.startIn(n.spawn, name, cmd, true)
}

// startIn starts cmd through spawner sp; daemon marks the harness's own
// processes, which Close stops last, in their order.
func (c *Cluster) startIn(sp *spawner, name string, cmd *exec.Cmd, daemon bool) (*Process, error) {
	p := &Process{Name: name, Cmd: cmd, done: make(chan struct{}), daemon: daemon}
	var logf *os.File
	if cmd.Stdout == nil && cmd.Stderr == nil {
		if err := os.MkdirAll(filepath.Join(c.Dir, "logs"), 0o755); err != nil {
			return nil, err
		}
		p.Log = filepath.Join(c.Dir, "logs", name+".log")
		f, err := os.OpenFile(p.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return nil, err
		}
		logf = f
		cmd.Stdout, cmd.Stderr = f, f
	}
	if err := sp.start(cmd); err != nil {
		if logf != nil {
			_ = logf.Close()
		}
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() {
		p.waitErr = cmd.Wait()
		if logf != nil {
			_ = logf.Close()
		}
		close(p.done)
	}()
	c.mu.Lock()
	c.procs = append(c.procs, p)
	c.mu.Unlock()
	return p, nil
}

// Processes returns the processes started so far, in start order.
func (c *Cluster) Processes() []*Process {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*Process(nil), c.procs...)
}

// Command returns a one-shot command that runs name inside the cluster's
// network namespace (through nsenter), with KUBECONFIG set to the admin
// kubeconfig.
func (c *Cluster) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	return c.node0.Command(ctx, name, args...)
}

// Command returns a one-shot command that runs name inside the node's
// network namespace, with KUBECONFIG set to an admin kubeconfig that
// reaches the API server from there.
func (n *Node) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "nsenter", append([]string{"--net=" + n.NetNS, "--", name}, args...)...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+n.Kubeconfig())
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

// Kubeconfig is an admin kubeconfig that reaches the API server from the
// node's network namespace (over the underlay for a node after the first).
func (n *Node) Kubeconfig() string {
	if n != n.c.node0 {
		return filepath.Join(n.Dir, "kubelet", "kubeconfig")
	}
	return n.c.Kubeconfig
}

// Kubectl runs bin/k8s/kubectl with args against the cluster and returns
// its combined output.
func (c *Cluster) Kubectl(ctx context.Context, args ...string) (string, error) {
	out, err := c.Command(ctx, filepath.Join(c.BinDir, "k8s", "kubectl"), args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %v: %w: %s", args, err, out)
	}
	return string(out), nil
}

// Do runs f on a thread inside the cluster's network namespace (for
// dialing pods or reading links there).
func (c *Cluster) Do(f func() error) error { return c.node0.Do(f) }

// DialContext dials from inside the cluster's network namespace. The
// connection's socket belongs to the namespace for its whole life.
func (c *Cluster) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	return c.node0.DialContext(ctx, network, addr)
}

// Do runs f on a thread inside the node's network namespace.
func (n *Node) Do(f func() error) error {
	return n.netns.Do(func(ns.NetNS) error { return f() })
}

// DialContext dials from inside the node's network namespace.
func (n *Node) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	var conn net.Conn
	err := n.Do(func() error {
		var d net.Dialer
		var err error
		conn, err = d.DialContext(ctx, network, addr)
		return err
	})
	return conn, err
}

// Logs returns the tail (up to max bytes) of a process's log, for failure
// messages.
func (c *Cluster) Logs(name string, max int) string {
	b, err := os.ReadFile(filepath.Join(c.Dir, "logs", name+".log"))
	if err != nil {
		return err.Error()
	}
	if len(b) > max {
		b = b[len(b)-max:]
	}
	return string(b)
}

// randHex returns n random bytes in hex.
func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
