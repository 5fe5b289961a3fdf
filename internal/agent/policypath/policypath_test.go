package policypath

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"kurma.dev/kurma/internal/agent/nettest"
	"kurma.dev/kurma/internal/policyrule"
	"kurma.dev/kurma/internal/testutil"
)

// topo: a host namespace with bridge pptbr0 (10.0.0.1/24) and pod
// namespaces a (.10), b (.11), c (.12) on it, each serving TCP 8080 (its
// name) and an echo on 9090.
type topo struct {
	host string
	pods map[string]string
}

const bridge = "pptbr0"

var podIP = map[string]string{"a": "10.0.0.10", "b": "10.0.0.11", "c": "10.0.0.12"}

func newTopo(t *testing.T) *topo {
	t.Helper()
	testutil.RequireRoot(t)
	tp := &topo{host: nettest.NewNS(t, testutil.UniqueName("ppth")), pods: map[string]string{}}
	testutil.Run(t, "ip", "netns", "exec", nettest.Name(tp.host), "sysctl", "-qw", "net.ipv4.ip_forward=1")
	nettest.IP(t, tp.host, "link", "add", bridge, "type", "bridge")
	nettest.IP(t, tp.host, "addr", "add", "10.0.0.1/24", "dev", bridge)
	nettest.IP(t, tp.host, "link", "set", bridge, "up")
	for i, name := range []string{"a", "b", "c"} {
		p := nettest.NewNS(t, testutil.UniqueName("pptp"))
		hv := fmt.Sprintf("pptv%d", i)
		nettest.IP(t, tp.host, "link", "add", hv, "type", "veth", "peer", "name", "eth0", "netns", nettest.Name(p))
		nettest.IP(t, tp.host, "link", "set", hv, "master", bridge, "up")
		nettest.IP(t, p, "addr", "add", podIP[name]+"/24", "dev", "eth0")
		nettest.IP(t, p, "link", "set", "eth0", "up")
		nettest.IP(t, p, "route", "add", "default", "via", "10.0.0.1")
		nettest.Serve(t, p, podIP[name]+":8080", name)
		serveEcho(t, p, podIP[name]+":9090")
		tp.pods[name] = p
	}
	return tp
}

func serveEcho(t *testing.T, nsPath, addr string) {
	t.Helper()
	var ln net.Listener
	if err := ns.WithNetNSPath(nsPath, func(ns.NetNS) error {
		var err error
		ln, err = net.Listen("tcp", addr)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	testutil.ServeConns(t, ln, func(c net.Conn) { _, _ = io.Copy(c, c) })
}

func newPath(t *testing.T, tp *topo) *Path { return pathIn(t, tp.host, "ppt") }

// pathIn is a Path on table in network namespace host, closed when the
// test ends.
func pathIn(t *testing.T, host, table string) *Path {
	t.Helper()
	p, err := New(t.Context(), Config{HostNS: host, Table: table})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// can reports whether from reaches to's port 8080.
func (tp *topo) can(from, to string) bool {
	got, err := nettest.Dial(tp.pods[from], podIP[to]+":8080", 400*time.Millisecond)
	return err == nil && got == to
}

// expect checks reachability for each "from>to" pair: ok lists those
// that must connect, every other pair of a, b, c must not.
func (tp *topo) expect(t *testing.T, step string, ok ...string) {
	t.Helper()
	for _, f := range []string{"a", "b", "c"} {
		for _, to := range []string{"a", "b", "c"} {
			if f == to {
				continue
			}
			want := slices.Contains(ok, f+">"+to)
			if got := tp.can(f, to); got != want {
				t.Errorf("%s: %s -> %s connects %v, want %v", step, f, to, got, want)
			}
		}
	}
}

var all = []string{"a>b", "a>c", "b>a", "b>c", "c>a", "c>b"}

func ip(s string) netip.Addr { return netip.MustParseAddr(s) }

func exact(peer string, proto policyrule.Proto, port uint16) Allow {
	return Allow{PeerLo: A4(ip(peer)), PeerHi: A4(ip(peer)), Proto: proto, PortLo: port, PortHi: port}
}

// TestPolicy walks one pod through the rule shapes and checks real
// connections after each Apply.
func TestPolicy(t *testing.T) {
	tp := newTopo(t)
	p := newPath(t, tp)
	ctx := t.Context()
	tp.expect(t, "no policy", all...)
	steps := []struct {
		name string
		pods map[string]*Pod
		ok   []string
	}{
		{"b denies all ingress", map[string]*Pod{"b": {IP: ip("10.0.0.11"), Ingress: Dir{Isolated: true}}},
			[]string{"a>c", "b>a", "b>c", "c>a"}},
		{"b allows a on tcp 8080", map[string]*Pod{"b": {IP: ip("10.0.0.11"), Ingress: Dir{Isolated: true,
			Base: []Allow{exact("10.0.0.10", 6, 8080)}}}}, []string{"a>b", "a>c", "b>a", "b>c", "c>a"}},
		{"b allows a on another port only", map[string]*Pod{"b": {IP: ip("10.0.0.11"), Ingress: Dir{Isolated: true,
			Base: []Allow{exact("10.0.0.10", 6, 8081), exact("10.0.0.10", 17, 8080)}}}}, []string{"a>c", "b>a", "b>c", "c>a"}},
		{"b allows c on every port, anyone on 8080/udp", map[string]*Pod{"b": {IP: ip("10.0.0.11"), Ingress: Dir{Isolated: true,
			Base: []Allow{{PeerLo: A4(ip("10.0.0.12")), PeerHi: A4(ip("10.0.0.12"))}, {PeerLo: A4(ip("0.0.0.0")), PeerHi: A4(ip("255.255.255.255")), Proto: 17, PortLo: 8080, PortHi: 8080}}}}},
			[]string{"a>c", "b>a", "b>c", "c>a", "c>b"}},
		{"b allows a range and port range, overlapping", map[string]*Pod{"b": {IP: ip("10.0.0.11"), Ingress: Dir{Isolated: true,
			Base: []Allow{
				{PeerLo: A4(ip("10.0.0.8")), PeerHi: A4(ip("10.0.0.10")), Proto: 6, PortLo: 8000, PortHi: 8100},
				{PeerLo: A4(ip("10.0.0.9")), PeerHi: A4(ip("10.0.0.10")), Proto: 6, PortLo: 8050, PortHi: 9000},
				{PeerLo: A4(ip("10.0.0.0")), PeerHi: A4(ip("10.0.0.9"))}}}}},
			[]string{"a>b", "a>c", "b>a", "b>c", "c>a"}},
		{"b allows a cidr (any port), a egress only to b:8080", map[string]*Pod{
			"b": {IP: ip("10.0.0.11"), Ingress: Dir{Isolated: true, Base: []Allow{{PeerLo: A4(ip("10.0.0.12")), PeerHi: A4(ip("10.0.0.15"))}}}},
			"a": {IP: ip("10.0.0.10"), Egress: Dir{Isolated: true, Base: []Allow{exact("10.0.0.11", 6, 8080)}}}},
			[]string{"b>a", "b>c", "c>a", "c>b"}},
		{"a egress to everything on 8080, b open", map[string]*Pod{
			"b": nil,
			"a": {IP: ip("10.0.0.10"), Egress: Dir{Isolated: true, Base: []Allow{{PeerLo: A4(ip("0.0.0.0")), PeerHi: A4(ip("255.255.255.255")), Proto: 6, PortLo: 8080, PortHi: 8080}}}}},
			all},
		{"a egress to c's range only", map[string]*Pod{
			"a": {IP: ip("10.0.0.10"), Egress: Dir{Isolated: true, Base: []Allow{{PeerLo: A4(ip("10.0.0.12")), PeerHi: A4(ip("10.0.0.20")), Proto: 6, PortLo: 1, PortHi: 65535}}}}},
			[]string{"a>c", "b>a", "b>c", "c>a", "c>b"}},
		{"all gone", map[string]*Pod{"a": nil}, all},
	}
	for _, s := range steps {
		if err := p.Apply(ctx, s.pods); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		tp.expect(t, s.name, s.ok...)
	}
	if n := p.Elements(); n != 0 {
		t.Errorf("%d elements left", n)
	}
}

// TestEstablishedSurvives: a connection open before a policy forbids it
// keeps working (conntrack); a new one is refused.
func TestEstablishedSurvives(t *testing.T) {
	tp := newTopo(t)
	p := newPath(t, tp)
	var c net.Conn
	if err := ns.WithNetNSPath(tp.pods["c"], func(ns.NetNS) error {
		var err error
		c, err = net.DialTimeout("tcp", "10.0.0.11:9090", time.Second)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	echo := func(msg string) error {
		_ = c.SetDeadline(time.Now().Add(time.Second))
		if _, err := io.WriteString(c, msg+"\n"); err != nil {
			return err
		}
		got, err := r.ReadString('\n')
		if err == nil && strings.TrimSpace(got) != msg {
			err = fmt.Errorf("echo %q, want %q", got, msg)
		}
		return err
	}
	if err := echo("before"); err != nil {
		t.Fatal(err)
	}
	if err := p.Apply(t.Context(), map[string]*Pod{"b": {IP: ip("10.0.0.11"), Ingress: Dir{Isolated: true}}}); err != nil {
		t.Fatal(err)
	}
	if err := echo("after"); err != nil {
		t.Fatalf("established connection cut by the policy: %v", err)
	}
	if tp.can("c", "b") {
		t.Fatal("new connection passes a deny-all policy")
	}
}

func kernelElems(t *testing.T, p *Path) []string {
	t.Helper()
	got, err := p.Kernel()
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func wantElems(all map[string]*Pod) []string { return Want(all) }

// TestSyncAfterRestart: a new Path (the agent after kill -9) given a
// different wanted state makes the kernel equal to it exactly, removing
// what the old run left, and the skeleton survives a second New.
func TestSyncAfterRestart(t *testing.T) {
	tp := newTopo(t)
	p1 := newPath(t, tp)
	old := map[string]*Pod{
		"a": {IP: ip("10.0.0.10"), Ingress: Dir{Isolated: true, Base: []Allow{exact("10.0.0.11", 6, 80), {PeerLo: A4(ip("10.0.0.0")), PeerHi: A4(ip("10.0.0.255")), Proto: 6, PortLo: 1, PortHi: 100}}}},
		"b": {IP: ip("10.0.0.11"), Egress: Dir{Isolated: true, Base: []Allow{{PeerLo: A4(ip("10.0.0.10")), PeerHi: A4(ip("10.0.0.10"))}, {PeerLo: A4(ip("10.1.0.0")), PeerHi: A4(ip("10.1.255.255"))}}}},
	}
	if err := p1.Apply(t.Context(), old); err != nil {
		t.Fatal(err)
	}
	if got, want := kernelElems(t, p1), wantElems(old); !slices.Equal(got, want) {
		t.Fatalf("after apply:\n%v\nwant\n%v", got, want)
	}
	_ = p1.Close()
	p2 := newPath(t, tp)
	if got, want := kernelElems(t, p2), wantElems(old); !slices.Equal(got, want) {
		t.Fatalf("New must keep the elements until Sync:\n%v\nwant\n%v", got, want)
	}
	// A resync of the same state (interval elements too) flushes and
	// re-adds every element in one transaction: the same elements stay.
	for range 2 {
		if err := p2.Sync(t.Context(), old); err != nil {
			t.Fatal(err)
		}
		if got, want := kernelElems(t, p2), wantElems(old); !slices.Equal(got, want) {
			t.Fatalf("after a resync of the same state:\n%v\nwant\n%v", got, want)
		}
	}
	cur := map[string]*Pod{
		"b": {IP: ip("10.0.0.11"), Egress: Dir{Isolated: true, Base: []Allow{{PeerLo: A4(ip("10.0.0.10")), PeerHi: A4(ip("10.0.0.10"))}}}},
		"c": {IP: ip("10.0.0.12"), Ingress: Dir{Isolated: true, Base: []Allow{exact("10.0.0.10", 17, 53)}}},
	}
	if err := p2.Sync(t.Context(), cur); err != nil {
		t.Fatal(err)
	}
	if got, want := kernelElems(t, p2), wantElems(cur); !slices.Equal(got, want) {
		t.Fatalf("after sync:\n%v\nwant\n%v", got, want)
	}
	tp.expect(t, "after sync", "a>b", "b>a", "c>a", "c>b")
}

// TestRestartRewritesNothing: a fresh Path (a restarted agent) synced to
// the state its predecessor left changes nothing in the kernel: the same
// rules with the same handles, the same elements.
func TestRestartRewritesNothing(t *testing.T) {
	tp := newTopo(t)
	p1 := newPath(t, tp)
	pods := map[string]*Pod{
		"a": {IP: ip("10.0.0.10"), Ingress: Dir{Isolated: true, Base: []Allow{exact("10.0.0.11", 6, 80)}}},
	}
	if err := p1.Sync(t.Context(), pods); err != nil {
		t.Fatal(err)
	}
	table := func() string {
		return testutil.Run(t, "ip", "netns", "exec", nettest.Name(tp.host), "nft", "-a", "list", "table", "inet", "ppt")
	}
	before := table()
	_ = p1.Close()
	p2 := newPath(t, tp)
	if err := p2.Sync(t.Context(), pods); err != nil {
		t.Fatal(err)
	}
	if after := table(); after != before {
		t.Errorf("the table changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}
