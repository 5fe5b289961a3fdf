package lbpath

import (
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"kurma.dev/kurma/internal/agent/nettest"
	"kurma.dev/kurma/internal/agent/nfthost"
)

// The host's address toward the outside namespace is its node address.
const nodeIP = "203.0.113.1"

// newNodePath is newPath as the agent configures it in a cluster: a node
// address, the bridge glob and pod egress.
func newNodePath(t *testing.T, tp *topo, serviceRoutes ...netip.Prefix) *Path {
	t.Helper()
	p, err := New(t.Context(), Config{HostNS: tp.host, Table: "lbt", ExtIface: ext, NodeIP: addr(nodeIP),
		ServiceRoutes: serviceRoutes, BridgeGlob: "lbtbr*", Egress: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// whoFrom dials addr from nsPath and returns the server's name and the
// client address it saw.
func whoFrom(t *testing.T, nsPath, addr string) (name, from string) {
	t.Helper()
	s, err := nettest.Dial(nsPath, addr, 2*time.Second)
	if err != nil {
		t.Fatalf("dial %s from %s: %v", addr, nettest.Name(nsPath), err)
	}
	name, from, _ = strings.Cut(s, " from ")
	return name, from
}

// TestHostLevelFrontends: node ports on the node address (from outside,
// from a pod, from the host), the VIP from the host itself, external
// addresses; connections from outside are source-NATed to the node
// address, or keep the client's with ExternalLocal (and then reach local
// members only); what the host sends into the bridge leaves from the node
// address; pods reach the outside masqueraded.
func TestHostLevelFrontends(t *testing.T) {
	tp := newTopo(t)
	client := tp.pod(t, "client", "10.0.0.10")
	m1 := tp.pod(t, "m1", "10.0.0.11")
	m2 := tp.pod(t, "m2", "10.0.0.12")
	serveWho(t, m1, "10.0.0.11:8080", "m1")
	serveWho(t, m2, "10.0.0.12:8080", "m2")
	serveWho(t, tp.out, "203.0.113.2:9000", "out")
	// The outside reaches the external address through the node.
	nettest.IP(t, tp.out, "route", "add", "198.51.100.0/24", "via", nodeIP)
	// The host has no route to the VIPs but the one for the service range.
	p := newNodePath(t, tp, netip.MustParsePrefix("10.96.0.0/16"))
	l := webLB("10.0.0.11", "10.0.0.12")
	l.Listeners[0].NodePort = 30080
	l.HostAccess, l.External = true, []netip.Addr{addr("198.51.100.7")}
	l.Members[0].Local = true
	if err := p.Apply(t.Context(), Changes{LBs: []LB{l}}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, from, to string
		wantFrom       string // the client address the member sees
	}{
		{"outside to the node port", tp.out, nodeIP + ":30080", nodeIP},
		{"pod to the node port", client, nodeIP + ":30080", nodeIP},
		{"host to the node port", tp.host, nodeIP + ":30080", nodeIP},
		{"host to the VIP", tp.host, "10.96.0.1:80", nodeIP},
		{"outside to the external address", tp.out, "198.51.100.7:80", nodeIP},
		{"pod to the VIP (inside its VPC: not NATed)", client, "10.96.0.1:80", "10.0.0.10"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			seen := map[string]bool{}
			for range 30 {
				name, from := whoFrom(t, tc.from, tc.to)
				if from != tc.wantFrom {
					t.Fatalf("%s saw the client as %s, want %s", name, from, tc.wantFrom)
				}
				seen[name] = true
			}
			if !seen["m1"] || !seen["m2"] {
				t.Fatalf("both members must answer: %v", seen)
			}
		})
	}
	if name, from := whoFrom(t, tp.host, "10.0.0.12:8080"); name != "m2" || from != nodeIP {
		t.Fatalf("host to a pod: %s saw %s, want the node address", name, from)
	}
	if name, from := whoFrom(t, client, "203.0.113.2:9000"); name != "out" || from != nodeIP {
		t.Fatalf("pod egress: %s saw %s, want the node address", name, from)
	}

	// ExternalLocal: outside connections reach the local member only and
	// keep their source; the VIP inside still spreads.
	l.ExternalLocal = true
	if err := p.Apply(t.Context(), Changes{LBs: []LB{l}}); err != nil {
		t.Fatal(err)
	}
	for range 20 {
		for _, to := range []string{nodeIP + ":30080", "198.51.100.7:80"} {
			if name, from := whoFrom(t, tp.out, to); name != "m1" || from != "203.0.113.2" {
				t.Fatalf("external local %s: %s saw %s, want m1 seeing 203.0.113.2", to, name, from)
			}
		}
	}
	if err := p.Apply(t.Context(), Changes{DeleteLBs: []string{l.ID}}); err != nil {
		t.Fatal(err)
	}
	if _, err := nettest.Dial(tp.out, nodeIP+":30080", 500*time.Millisecond); err == nil {
		t.Fatal("the node port still answers after its deletion")
	}
	assertEmpty(t, tp, p)
}

// TestMemberSelection: members per listener (a member serving one port
// of the Service only), backups used only when no other member is left,
// and InternalLocal.
func TestMemberSelection(t *testing.T) {
	tp := newTopo(t)
	client := tp.pod(t, "client", "10.0.0.10")
	for _, m := range []struct{ name, ip string }{{"m1", "10.0.0.11"}, {"m2", "10.0.0.12"}, {"m3", "10.0.0.13"}} {
		pod := tp.pod(t, m.name, m.ip)
		serveWho(t, pod, m.ip+":8080", m.name)
		serveWho(t, pod, m.ip+":8081", m.name+"/81")
	}
	p := newNodePath(t, tp)
	l := LB{ID: "sel", Iface: bridge, VIP: addr("10.96.0.2"),
		Listeners: []Listener{{Proto: TCP, Port: 80, TargetPort: 8080}, {Proto: TCP, Port: 81, TargetPort: 8081}},
		Members: []Member{
			{Addr: addr("10.0.0.11"), Serves: []ListenerKey{{TCP, 80}}},
			{Addr: addr("10.0.0.12"), Serves: []ListenerKey{{TCP, 81}}},
			{Addr: addr("10.0.0.13"), Backup: true},
		}}
	apply := func() {
		t.Helper()
		if err := p.Apply(t.Context(), Changes{LBs: []LB{l}}); err != nil {
			t.Fatal(err)
		}
	}
	only := func(to, want string) {
		t.Helper()
		for range 15 {
			if name, _ := whoFrom(t, client, to); name != want {
				t.Fatalf("%s answered by %s, want only %s", to, name, want)
			}
		}
	}
	apply()
	only("10.96.0.2:80", "m1")
	only("10.96.0.2:81", "m2/81")
	// m1 goes: port 80 falls back to the backup, port 81 keeps m2.
	l.Members = l.Members[1:]
	apply()
	only("10.96.0.2:80", "m3")
	only("10.96.0.2:81", "m2/81")
	// InternalLocal: only the local member, even a backup is not used
	// while a local one serves.
	l.Members = []Member{{Addr: addr("10.0.0.11")}, {Addr: addr("10.0.0.12"), Local: true}}
	l.InternalLocal = true
	apply()
	only("10.96.0.2:80", "m2")
	if err := p.Apply(t.Context(), Changes{DeleteLBs: []string{l.ID}}); err != nil {
		t.Fatal(err)
	}
	assertEmpty(t, tp, p)
}

// udpConn is one connected UDP socket in nsPath: every exchange uses the
// same source port, so conntrack keeps one flow for it.
type udpConn struct{ c net.Conn }

func newUDPConn(t *testing.T, nsPath, addr string) *udpConn {
	t.Helper()
	var c net.Conn
	if err := ns.WithNetNSPath(nsPath, func(ns.NetNS) error {
		var err error
		c, err = net.Dial("udp", addr)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return &udpConn{c}
}

// ask sends one datagram and returns the answer ("" on a timeout or an
// error such as ICMP port unreachable).
func (u *udpConn) ask() string {
	_ = u.c.SetDeadline(time.Now().Add(time.Second))
	if _, err := u.c.Write([]byte("hi")); err != nil {
		return ""
	}
	b := make([]byte, 100)
	n, err := u.c.Read(b)
	if err != nil {
		return ""
	}
	return string(b[:n])
}

// TestStaleUDPFlows: a UDP client that keeps its source port follows
// the members: when its member goes, its next datagram reaches another
// (conntrack would keep sending it to the gone one); and datagrams that
// crossed the host before the frontend had members do not keep it from
// the members afterwards; a member whose target port changes counts as
// gone (the upstream spec "cleanup conntrack entries when UDP service
// target port changes").
func TestStaleUDPFlows(t *testing.T) {
	tp := newTopo(t)
	client := tp.pod(t, "client", "10.0.0.10")
	m1 := tp.pod(t, "m1", "10.0.0.11")
	serveUDP(t, m1, "10.0.0.11:5353", "m1")
	serveUDP(t, m1, "10.0.0.11:9090", "m1-9090")
	serveUDP(t, tp.pod(t, "m2", "10.0.0.12"), "10.0.0.12:5353", "m2")
	// Without a load balancer, the VIP is routed to the outside, which
	// answers: a plain, not NATed flow.
	nettest.IP(t, tp.host, "route", "add", "default", "via", "203.0.113.2")
	nettest.IP(t, tp.out, "addr", "add", "10.96.0.1/32", "dev", "lo")
	nettest.IP(t, tp.out, "route", "add", "10.0.0.0/24", "via", nodeIP)
	serveUDP(t, tp.out, "10.96.0.1:53", "out")
	p := newNodePath(t, tp)
	u := newUDPConn(t, client, "10.96.0.1:53")
	if got := u.ask(); got != "out" {
		t.Fatalf("before the load balancer: %q, want the outside's answer", got)
	}
	// First members: the old flow goes, the next datagram is balanced.
	if err := p.Apply(t.Context(), Changes{LBs: []LB{webLB("10.0.0.12")}}); err != nil {
		t.Fatal(err)
	}
	if got := u.ask(); got != "m2" {
		t.Fatalf("after the load balancer got members: %q, want m2", got)
	}
	// m2 replaced by m1: the flow to m2 goes.
	if err := p.Apply(t.Context(), Changes{LBs: []LB{webLB("10.0.0.11")}}); err != nil {
		t.Fatal(err)
	}
	if got := u.ask(); got != "m1" {
		t.Fatalf("after m2 left: %q, want m1", got)
	}
	// A change that keeps m1 keeps the flow (m1 answers, with no flush
	// needed to get there).
	if err := p.Apply(t.Context(), Changes{LBs: []LB{webLB("10.0.0.11", "10.0.0.12")}}); err != nil {
		t.Fatal(err)
	}
	for range 10 {
		if got := u.ask(); got != "m1" {
			t.Fatalf("a member added: the flow moved to %q, want it kept on m1", got)
		}
	}
	// The target port changes (same addresses): the flow to m1:5353 goes.
	moved := webLB("10.0.0.11")
	moved.Listeners[1].TargetPort = 9090
	if err := p.Apply(t.Context(), Changes{LBs: []LB{moved}}); err != nil {
		t.Fatal(err)
	}
	if got := u.ask(); got != "m1-9090" {
		t.Fatalf("after the target port changed to 9090: %q, want m1-9090", got)
	}
	if err := p.Apply(t.Context(), Changes{DeleteLBs: []string{"lb1"}}); err != nil {
		t.Fatal(err)
	}
	assertEmpty(t, tp, p)
}

// TestLoopbackNodeIP: a loopback node address (a single-host setup, where
// the underlay is lo) cannot leave the host, so the host's connections
// into the bridge keep their own source and still reach the pod.
func TestLoopbackNodeIP(t *testing.T) {
	tp := newTopo(t)
	m1 := tp.pod(t, "m1", "10.0.0.11")
	serveWho(t, m1, "10.0.0.11:8080", "m1")
	p, err := New(t.Context(), Config{HostNS: tp.host, Table: "lbt", ExtIface: ext, NodeIP: addr("127.0.0.1"), BridgeGlob: "lbtbr*"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	if err := p.Apply(t.Context(), Changes{LBs: []LB{webLB("10.0.0.11")}}); err != nil {
		t.Fatal(err)
	}
	name, from := whoFrom(t, tp.host, "10.0.0.11:8080")
	if name != "m1" || strings.HasPrefix(from, "127.") {
		t.Fatalf("host to the pod: reached %q from %q, want m1 from a non-loopback source", name, from)
	}
}

// TestCloseWaitTimeout: New writes ConntrackCloseWait to conntrack's
// CLOSE_WAIT timeout of the host namespace (the test's own; the sysctl
// is per namespace), and leaves it alone when zero.
func TestCloseWaitTimeout(t *testing.T) {
	tp := newTopo(t)
	read := func() string {
		t.Helper()
		var b []byte
		err := nfthost.InHost(tp.host, func() error {
			var err error
			b, err = os.ReadFile(closeWaitSysctl)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	for _, tc := range []struct {
		d    time.Duration
		want string
	}{
		{time.Hour, "3600"},
		{0, "3600"}, // unchanged
		{90 * time.Second, "90"},
	} {
		p, err := New(t.Context(), Config{HostNS: tp.host, Table: "lbt", ConntrackCloseWait: tc.d})
		if err != nil {
			t.Fatal(err)
		}
		_ = p.Close()
		if got := read(); got != tc.want {
			t.Fatalf("after New with %v: %s = %s, want %s", tc.d, closeWaitSysctl, got, tc.want)
		}
	}
}
