package agent_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"kurma.dev/kurma/internal/agent/nettest"
	"kurma.dev/kurma/internal/controller/etcdtest"
	"kurma.dev/kurma/internal/testutil"
	"kurma.dev/kurma/pkg/controllerapi"
)

const (
	pfx      = "kagt"
	ctlIP    = "192.0.2.254"
	ctlPort  = 9696 // replica i: ctlPort+i
	waitUpTO = 20 * time.Second
)

// cluster is the multi-host test bed: an underlay namespace holding a
// bridge and the controller (listening on 192.0.2.254 with a token), and
// host namespaces joined to that bridge by veths, each running a real
// kurma-agent. Pod namespaces are just more namespaces. Nothing touches
// the root namespace's links.
type cluster struct {
	t         *testing.T
	ul        string // underlay namespace path
	dir       string
	tokenFile string
	agentBin  string
	nftTable  string
	ctlBin    string
	storeSpec string                  // --store of every replica
	agentArgs []string                // more flags for every agent started
	ctls      []*proc                 // replica i listens on ctlIP:9696+i
	clients   []*controllerapi.Client // one per replica
	ctl       *proc                   // ctls[0]
	c         *controllerapi.Client   // clients[0]
	hosts     []*host
	outside   string // with clusterOpts.external: the external network's namespace
}

// clusterOpts selects the store and the number of controller replicas.
type clusterOpts struct {
	etcd     bool // a real etcd in the underlay namespace instead of bbolt
	replicas int  // default 1; host i talks to replica i%replicas
	// external gives host 1 an external interface (kagtx0,
	// 203.0.113.1/24) into a namespace that stands for the outside world
	// (203.0.113.2/24), and its agent --external-interface kagtx0.
	external bool
}

type host struct {
	id, ns, ip, stateDir, log string
	ext                       string // external interface, if any
	nftTable                  string // the agent's inet table
	replica                   int    // the controller replica its agent uses
	proc                      *proc
}

// proc is a process this test started; only it is ever signalled.
type proc struct {
	cmd  *exec.Cmd
	done chan struct{}
}

func startProc(t *testing.T, logPath string, name string, args ...string) *proc {
	t.Helper()
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		_ = f.Close()
		t.Fatalf("start %s: %v", name, err)
	}
	p := &proc{cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); _ = f.Close(); close(p.done) }()
	t.Cleanup(func() { p.stop() })
	return p
}

// stop sends SIGTERM, then SIGKILL after 5s, and waits.
func (p *proc) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		p.kill9()
	}
}

func (p *proc) kill9() {
	_ = p.cmd.Process.Kill()
	<-p.done
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// nsHTTPClient dials from inside a namespace: the socket keeps the
// namespace it was created in.
func nsHTTPClient(nsPath string) *http.Client {
	d := &net.Dialer{Timeout: 5 * time.Second}
	tr := &http.Transport{
		MaxIdleConnsPerHost: 64,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var c net.Conn
			err := ns.WithNetNSPath(nsPath, func(ns.NetNS) error {
				var err error
				c, err = d.DialContext(ctx, network, addr)
				return err
			})
			return c, err
		},
	}
	return &http.Client{Transport: tr}
}

func newCluster(t *testing.T, nHosts int) *cluster {
	t.Helper()
	return newClusterOpts(t, nHosts, clusterOpts{})
}

func newClusterOpts(t *testing.T, nHosts int, o clusterOpts) *cluster {
	t.Helper()
	o.replicas = max(o.replicas, 1)
	testutil.RequireRoot(t)
	if testing.Short() {
		t.Skip("multi-host test: needs the controller and agent binaries (skipped with -short)")
	}
	if _, err := exec.LookPath("nft"); err != nil {
		t.Fatalf("nft not installed (hack/apt-packages.txt lists nftables): %v", err)
	}
	c := &cluster{t: t, dir: t.TempDir(), nftTable: testutil.UniqueName(pfx)}
	ctlBin := testutil.Bin(t, "kurma-controller")
	c.agentBin = testutil.Bin(t, "kurma-agent")
	c.ul = nettest.NewNS(t, testutil.UniqueName(pfx))
	nettest.IP(t, c.ul, "link", "add", "kagtbr0", "type", "bridge")
	nettest.IP(t, c.ul, "addr", "add", ctlIP+"/24", "dev", "kagtbr0")
	nettest.IP(t, c.ul, "link", "set", "kagtbr0", "up")

	tok := make([]byte, 16)
	_, _ = rand.Read(tok)
	c.tokenFile = filepath.Join(c.dir, "token")
	if err := os.WriteFile(c.tokenFile, []byte(hex.EncodeToString(tok)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			c.dumpLogs()
		}
	})
	hc := nsHTTPClient(c.ul)
	for i := range o.replicas {
		client, err := controllerapi.New(c.ctlURL(i), controllerapi.WithToken(hex.EncodeToString(tok)), controllerapi.WithHTTPClient(hc))
		if err != nil {
			t.Fatal(err)
		}
		c.clients = append(c.clients, client)
	}
	c.c = c.clients[0]
	c.ctls = make([]*proc, o.replicas)
	c.ctlBin = ctlBin
	c.storeSpec = "bolt:" + filepath.Join(c.dir, "controller.db")
	if o.etcd {
		etcdDir := filepath.Join(c.dir, "etcd")
		if err := os.Mkdir(etcdDir, 0o700); err != nil {
			t.Fatal(err)
		}
		// The underlay namespace is new: any port is free there.
		srv, err := etcdtest.StartSpec(t.Context(), etcdtest.Spec{
			Binary: testutil.Bin(t, "tools/etcd"), Dir: etcdDir, IP: ctlIP, ClientPort: 2379, PeerPort: 2380,
			Wrap: []string{"ip", "netns", "exec", nettest.Name(c.ul)}, HTTP: hc,
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(srv.Stop)
		c.storeSpec = "etcd:" + srv.ClientURL
	}
	for i := range o.replicas {
		c.startReplica(i)
	}
	for i := 1; i <= nHosts; i++ {
		h := &host{id: fmt.Sprintf("h%d", i), ip: fmt.Sprintf("192.0.2.%d", i), stateDir: filepath.Join(c.dir, fmt.Sprintf("h%d", i)), replica: (i - 1) % o.replicas}
		h.log = filepath.Join(c.dir, h.id+".log")
		h.nftTable = c.nftTable
		h.ns = nettest.NewNS(t, testutil.UniqueName(pfx))
		peer := fmt.Sprintf("kagtu%d", i)
		nettest.IP(t, h.ns, "link", "add", "kagtu0", "type", "veth", "peer", "name", peer, "netns", nettest.Name(c.ul))
		nettest.IP(t, c.ul, "link", "set", peer, "master", "kagtbr0", "up")
		nettest.IP(t, h.ns, "addr", "add", h.ip+"/24", "dev", "kagtu0")
		nettest.IP(t, h.ns, "link", "set", "kagtu0", "up")
		if o.external && i == 1 {
			c.outside = nettest.NewNS(t, testutil.UniqueName(pfx))
			h.ext = "kagtx0"
			nettest.IP(t, h.ns, "link", "add", h.ext, "type", "veth", "peer", "name", "eth0", "netns", nettest.Name(c.outside))
			nettest.IP(t, h.ns, "addr", "add", "203.0.113.1/24", "dev", h.ext)
			nettest.IP(t, h.ns, "link", "set", h.ext, "up")
			nettest.IP(t, c.outside, "addr", "add", "203.0.113.2/24", "dev", "eth0")
			nettest.IP(t, c.outside, "link", "set", "eth0", "up")
		}
		c.hosts = append(c.hosts, h)
		c.startAgent(h)
	}
	return c
}

func (c *cluster) ctlURL(i int) string {
	return fmt.Sprintf("http://%s:%d", ctlIP, ctlPort+i)
}

// startController starts replica 0 (again) on the cluster's store and
// waits until it answers.
func (c *cluster) startController() { c.startReplica(0) }

// startReplica starts controller replica i (again) and waits until it
// answers.
func (c *cluster) startReplica(i int) {
	t := c.t
	t.Helper()
	name := "controller"
	if i > 0 {
		name = fmt.Sprintf("controller%d", i)
	}
	p := startProc(t, filepath.Join(c.dir, name+".log"), "ip", "netns", "exec", nettest.Name(c.ul), c.ctlBin,
		"--listen", fmt.Sprintf("%s:%d", ctlIP, ctlPort+i), "--store", c.storeSpec, "--token-file", c.tokenFile)
	c.ctls[i] = p
	if i == 0 {
		c.ctl = p
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, err := c.clients[i].ListHosts(t.Context())
		if err == nil {
			return
		}
		if p.exited() || time.Now().After(deadline) {
			c.dumpLogs()
			t.Fatalf("controller not ready: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (c *cluster) startAgent(h *host) {
	args := []string{"netns", "exec", nettest.Name(h.ns), c.agentBin,
		"--controller", c.ctlURL(h.replica), "--token-file", c.tokenFile,
		"--host-id", h.id, "--underlay-ip", h.ip, "--underlay-dev", "kagtu0",
		"--state-dir", h.stateDir, "--link-prefix", pfx, "--nft-table", c.nftTable, "--resync", "1s"}
	if h.ext != "" {
		args = append(args, "--external-interface", h.ext)
	}
	args = append(args, c.agentArgs...)
	h.proc = startProc(c.t, h.log, "ip", args...)
}

func (c *cluster) dumpLogs() {
	for _, f := range append([]string{"controller", "controller1"}, hostIDs(c.hosts)...) {
		b, _ := os.ReadFile(filepath.Join(c.dir, f+".log"))
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		if len(lines) > 40 {
			lines = lines[len(lines)-40:]
		}
		c.t.Logf("--- %s.log (tail)\n%s", f, strings.Join(lines, "\n"))
	}
}

func hostIDs(hs []*host) []string {
	var out []string
	for _, h := range hs {
		out = append(out, h.id)
	}
	return out
}

// lbNetwork creates the project name with a VPC of one subnet (cidr) and
// the service subnet 10.96.0.0/24, and returns the project's id and both
// subnets.
func (c *cluster) lbNetwork(ctx context.Context, name, cidr string) (pid string, sn, svc *controllerapi.Subnet) {
	c.t.Helper()
	proj, err := c.c.CreateProject(ctx, controllerapi.Project{Name: name})
	if err != nil {
		c.t.Fatal(err)
	}
	sn = c.network(ctx, proj.ID, "net", cidr)
	return proj.ID, sn, c.serviceSubnet(ctx, proj.ID, sn, "10.96.0.0/24")
}

// network creates a project-scoped VPC with one subnet and returns the
// subnet.
// serviceSubnet adds to sn's VPC a subnet of purpose service (load
// balancer VIPs) named "svc".
func (c *cluster) serviceSubnet(ctx context.Context, pid string, sn *controllerapi.Subnet, cidr string) *controllerapi.Subnet {
	c.t.Helper()
	svc, err := c.c.CreateSubnet(ctx, pid, controllerapi.Subnet{Name: "svc", NetworkID: sn.NetworkID, CIDR: cidr,
		IPVersion: 4, Purpose: controllerapi.SubnetPurposeService})
	if err != nil {
		c.t.Fatalf("create service subnet %s: %v", cidr, err)
	}
	return svc
}

func (c *cluster) network(ctx context.Context, pid, name, cidr string) *controllerapi.Subnet {
	c.t.Helper()
	vpc, err := c.c.CreateVPC(ctx, pid, controllerapi.VPC{Name: name})
	if err != nil {
		c.t.Fatalf("create vpc %s: %v", name, err)
	}
	sn, err := c.c.CreateSubnet(ctx, pid, controllerapi.Subnet{Name: name, NetworkID: vpc.ID, CIDR: cidr, IPVersion: 4})
	if err != nil {
		c.t.Fatalf("create subnet %s: %v", cidr, err)
	}
	return sn
}

// pod is a port and the namespace it is plugged into.
type pod struct {
	port *controllerapi.Port
	ns   string
}

func (p pod) ip() string { return p.port.FixedIPs[0].IPAddress }

// newPod creates a namespace and, through the API, a port for it bound to
// host h. It does not wait.
func (c *cluster) newPod(ctx context.Context, t *testing.T, pid, subnetID string, h *host) pod {
	t.Helper()
	nsPath := nettest.NewNS(t, testutil.UniqueName(pfx))
	p, err := c.c.CreatePort(ctx, pid, controllerapi.Port{
		Name: nettest.Name(nsPath), NetworkID: subnetID, VethName: "eth0", NetworkNS: nsPath, BindingHostID: h.id,
	})
	if err != nil {
		t.Fatalf("create port: %v", err)
	}
	return pod{port: p, ns: nsPath}
}

func (c *cluster) waitUp(ctx context.Context, t *testing.T, pid string, pods ...pod) {
	t.Helper()
	for i, p := range pods {
		deadline := time.Now().Add(waitUpTO)
		for {
			got, err := c.c.WaitPort(ctx, pid, p.port.ID, controllerapi.StatusUp, 5*time.Second)
			if err != nil {
				t.Fatalf("wait port %s: %v", p.port.ID, err)
			}
			if got.Status == controllerapi.StatusUp {
				pods[i].port = got
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("port %s on %s is %s (%s), not UP", p.port.ID, p.port.BindingHostID, got.Status, got.StatusReason)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// waitStatus polls until the port has the status (WaitPort returns at once
// for a port that is not PENDING).
func (c *cluster) waitStatus(ctx context.Context, t *testing.T, pid, id, status string) *controllerapi.Port {
	t.Helper()
	deadline := time.Now().Add(waitUpTO)
	for {
		got, err := c.c.GetPort(ctx, pid, id)
		if err != nil {
			t.Fatalf("get port %s: %v", id, err)
		}
		if got.Status == status {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("port %s is %s (%s), want %s", id, got.Status, got.StatusReason, status)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// ownedPorts returns, per port id, how many host-end veths in the host
// namespace carry the agent's alias for it.
func ownedPorts(t *testing.T, hostNS string) map[string]int {
	t.Helper()
	h := nettest.Handle(t, hostNS)
	var err error
	var links []netlink.Link
	for range 5 {
		if links, err = h.LinkList(); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, l := range links {
		if id, ok := strings.CutPrefix(l.Attrs().Alias, "kurma-agent:port:"); ok {
			out[id]++
		}
	}
	return out
}
