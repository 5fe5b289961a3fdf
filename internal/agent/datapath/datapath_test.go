package datapath

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"kurma.dev/kurma/internal/agent/nettest"
	"kurma.dev/kurma/internal/testutil"
	"kurma.dev/kurma/pkg/kerrors"
)

const testPrefix = "kagt"

// testHost is a network namespace playing a host, with a datapath over it.
type testHost struct {
	ns string
	dp *Datapath
}

// newTestHost creates a host namespace whose underlay is the veth/dummy
// named dev carrying underlay (e.g. "192.0.2.1/24"); when peer is not empty
// the underlay is a veth whose other end goes into peer (another host).
func newTestHost(t *testing.T, underlay string, link func(hostNS string) string) *testHost {
	t.Helper()
	hostNS := nettest.NewNS(t, testutil.UniqueName(testPrefix))
	dev := link(hostNS)
	nettest.IP(t, hostNS, "addr", "add", underlay, "dev", dev)
	nettest.IP(t, hostNS, "link", "set", dev, "up")
	ip, _, _ := net.ParseCIDR(underlay)
	dp, err := New(t.Context(), Config{
		HostNS: hostNS, Prefix: testPrefix, UnderlayIP: ip, UnderlayDev: dev,
		NFTTable: testutil.UniqueName(testPrefix), Forwarding: true,
	})
	if err != nil {
		t.Fatalf("datapath.New: %v", err)
	}
	t.Cleanup(func() { _ = dp.Close() })
	return &testHost{ns: hostNS, dp: dp}
}

func dummyUnderlay(t *testing.T) func(string) string {
	return func(hostNS string) string {
		// No dummy driver on every kernel: a veth pair with both ends here.
		nettest.IP(t, hostNS, "link", "add", "kagtu0", "type", "veth", "peer", "name", "kagtu1")
		return "kagtu0"
	}
}

func ipnet(t *testing.T, s string) net.IPNet {
	t.Helper()
	ip, n, err := net.ParseCIDR(s)
	if err != nil {
		t.Fatal(err)
	}
	if ip.To4() != nil {
		ip = ip.To4()
	}
	return net.IPNet{IP: ip, Mask: n.Mask}
}

func portSpec(t *testing.T, id string, vni uint32, netns, addr, gw string, mac byte) PortSpec {
	return PortSpec{
		ID: id, VNI: vni, NetNS: netns, IfName: "eth0",
		MAC:   net.HardwareAddr{0x02, 0x42, 0, 0, byte(vni), mac},
		Addrs: []PortAddr{{Addr: ipnet(t, addr), Gateway: net.ParseIP(gw).To4()}},
	}
}

func podLink(t *testing.T, nsPath, name string) (netlink.Link, *netlink.Handle) {
	t.Helper()
	h, nsh, err := podHandle(nsPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close(); _ = nsh.Close() })
	l, err := h.LinkByName(name)
	if err != nil {
		t.Fatalf("%s in %s: %v", name, nsPath, err)
	}
	return l, h
}

func TestPlugUnplug(t *testing.T) {
	testutil.RequireRoot(t)
	ctx := t.Context()
	host := newTestHost(t, "192.0.2.1/24", dummyUnderlay(t))
	if err := host.dp.EnsureVPC(ctx, VPCSpec{VNI: 42, Gateways: []net.IPNet{ipnet(t, "10.42.0.1/24")}}); err != nil {
		t.Fatal(err)
	}
	pod1 := nettest.NewNS(t, testutil.UniqueName(testPrefix))
	pod2 := nettest.NewNS(t, testutil.UniqueName(testPrefix))
	p1 := portSpec(t, "port-one", 42, pod1, "10.42.0.5/24", "10.42.0.1", 5)
	p2 := portSpec(t, "port-two", 42, pod2, "10.42.0.6/24", "10.42.0.1", 6)
	for _, p := range []PortSpec{p1, p2} {
		if err := host.dp.Plug(ctx, p); err != nil {
			t.Fatalf("plug %s: %v", p.ID, err)
		}
	}

	t.Run("pod side", func(t *testing.T) {
		l, h := podLink(t, pod1, "eth0")
		a := l.Attrs()
		if a.HardwareAddr.String() != p1.MAC.String() || a.Flags&net.FlagUp == 0 || a.MTU != host.dp.MTU() {
			t.Fatalf("eth0: mac %s flags %v mtu %d", a.HardwareAddr, a.Flags, a.MTU)
		}
		addrs, err := addrList(h, l, unix.AF_INET)
		if err != nil || len(addrs) != 1 || addrs[0].IPNet.String() != "10.42.0.5/24" {
			t.Fatalf("addresses %v, %v", addrs, err)
		}
		routes, err := routeList(h, l, unix.AF_INET)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.ContainsFunc(routes, func(r netlink.Route) bool {
			return (r.Dst == nil || r.Dst.String() == "0.0.0.0/0") && r.Gw.Equal(net.ParseIP("10.42.0.1"))
		}) {
			t.Fatalf("no default route via the gateway: %v", routes)
		}
	})
	t.Run("host side", func(t *testing.T) {
		l, err := host.dp.h.LinkByName(host.dp.names.hostVeth(p1.ID))
		if err != nil {
			t.Fatal(err)
		}
		br, _ := host.dp.h.LinkByName(host.dp.names.bridge(42))
		if l.Attrs().MasterIndex != br.Attrs().Index || l.Attrs().Flags&net.FlagUp == 0 {
			t.Fatalf("host end not up on the bridge: %+v", l.Attrs())
		}
		// Hairpin from the fresh plug on (a pod that reaches its own
		// VIP): no later replug turns it on.
		if pi, err := host.dp.h.LinkGetProtinfo(l); err != nil || !pi.Hairpin {
			t.Fatalf("host end's bridge port: hairpin %v, %v", pi.Hairpin, err)
		}
		if want := "kurma-agent:port:" + p1.ID; l.Attrs().Alias != want {
			t.Fatalf("host end's alias %q, want %q", l.Attrs().Alias, want)
		}
		ports, err := host.dp.ListPorts(ctx)
		if err != nil || len(ports) != 2 || ports[0].VNI != 42 {
			t.Fatalf("ListPorts = %+v, %v", ports, err)
		}
	})
	t.Run("pods talk", func(t *testing.T) {
		nettest.Serve(t, pod2, "10.42.0.6:7001", "two")
		ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		defer cancel()
		if err := nettest.Reach(ctx, pod1, "10.42.0.6:7001", "two"); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("plug twice is idempotent", func(t *testing.T) {
		before, _ := host.dp.h.LinkByName(host.dp.names.hostVeth(p1.ID))
		l, _ := podLink(t, pod1, "eth0")
		if err := host.dp.Plug(ctx, p1); err != nil {
			t.Fatal(err)
		}
		after, _ := host.dp.h.LinkByName(host.dp.names.hostVeth(p1.ID))
		l2, _ := podLink(t, pod1, "eth0")
		if before.Attrs().Index != after.Attrs().Index || l.Attrs().Index != l2.Attrs().Index {
			t.Fatal("second plug replaced the veth pair")
		}
		if got := nettest.Links(t, pod1); len(got) != 2 {
			t.Fatalf("pod links after replug: %v", got)
		}
	})
	t.Run("replug repairs", func(t *testing.T) {
		nettest.IP(t, pod1, "addr", "flush", "dev", "eth0")
		nettest.IP(t, pod1, "link", "set", "eth0", "down")
		if err := host.dp.Plug(ctx, p1); err != nil {
			t.Fatal(err)
		}
		if out := nettest.IP(t, pod1, "-4", "addr", "show", "eth0"); !strings.Contains(out, "10.42.0.5/24") || !strings.Contains(out, "UP") {
			t.Fatalf("not repaired:\n%s", out)
		}
		if out := nettest.IP(t, pod1, "route", "show", "default"); !strings.Contains(out, "via 10.42.0.1") {
			t.Fatalf("default route not repaired: %q", out)
		}
	})
	t.Run("unplug leaves nothing", func(t *testing.T) {
		for _, p := range []PortSpec{p1, p2} {
			if err := host.dp.Unplug(ctx, p.ID); err != nil {
				t.Fatal(err)
			}
			if err := host.dp.Unplug(ctx, p.ID); err != nil {
				t.Fatalf("second unplug: %v", err)
			}
		}
		if got := nettest.Links(t, pod1); !slices.Equal(got, []string{"lo"}) {
			t.Fatalf("pod links after unplug: %v", got)
		}
		ports, err := host.dp.ListPorts(ctx)
		if err != nil || len(ports) != 0 {
			t.Fatalf("ListPorts = %+v, %v", ports, err)
		}
		if err := host.dp.DeleteVPC(ctx, 42); err != nil {
			t.Fatal(err)
		}
		if got := nettest.Links(t, host.ns); !slices.Equal(got, []string{"lo", "kagtu1", "kagtu0"}) {
			t.Fatalf("host links after delete: %v", got)
		}
		if vpcs, err := host.dp.ListVPCs(ctx); err != nil || len(vpcs) != 0 {
			t.Fatalf("ListVPCs = %v, %v", vpcs, err)
		}
	})
}

func TestPlugErrorsLeaveNothing(t *testing.T) {
	testutil.RequireRoot(t)
	ctx := t.Context()
	host := newTestHost(t, "192.0.2.1/24", dummyUnderlay(t))
	if err := host.dp.EnsureVPC(ctx, VPCSpec{VNI: 7, Gateways: []net.IPNet{ipnet(t, "10.7.0.1/24")}}); err != nil {
		t.Fatal(err)
	}
	busy := nettest.NewNS(t, testutil.UniqueName(testPrefix))
	nettest.IP(t, busy, "link", "add", "eth0", "type", "veth", "peer", "name", "eth1")
	for _, tc := range []struct {
		name string
		spec PortSpec
		cat  error
	}{
		{"missing netns", portSpec(t, "p-missing", 7, "/run/netns/"+testutil.UniqueName(testPrefix), "10.7.0.5/24", "10.7.0.1", 1), kerrors.NotFound},
		{"not a netns", portSpec(t, "p-file", 7, "/proc/self/status", "10.7.0.5/24", "10.7.0.1", 1), kerrors.Invalid},
		{"foreign eth0", portSpec(t, "p-busy", 7, busy, "10.7.0.5/24", "10.7.0.1", 1), kerrors.Conflict},
		{"unknown vpc", portSpec(t, "p-novpc", 8, busy, "10.8.0.5/24", "10.8.0.1", 1), kerrors.NotFound},
		{"invalid spec", portSpec(t, "p bad", 7, busy, "10.7.0.5/24", "10.7.0.1", 1), kerrors.Invalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := host.dp.Plug(ctx, tc.spec)
			if !errors.Is(err, tc.cat) {
				t.Fatalf("err = %v, want %v", err, tc.cat)
			}
			if got := nettest.Links(t, host.ns); len(got) != 5 { // lo, underlay pair, bridge, vxlan
				t.Fatalf("host links after failed plug: %v", got)
			}
		})
	}
	if got := nettest.Links(t, busy); !slices.Equal(got, []string{"lo", "eth1", "eth0"}) && !slices.Equal(got, []string{"lo", "eth0", "eth1"}) {
		t.Fatalf("foreign links touched: %v", got)
	}
}

// TestOwnership: listing and removal touch only links whose name and alias
// both prove they are ours.
func TestOwnership(t *testing.T) {
	testutil.RequireRoot(t)
	ctx := t.Context()
	host := newTestHost(t, "192.0.2.1/24", dummyUnderlay(t))
	if err := host.dp.EnsureVPC(ctx, VPCSpec{VNI: 9}); err != nil {
		t.Fatal(err)
	}
	pod := nettest.NewNS(t, testutil.UniqueName(testPrefix))
	if err := host.dp.Plug(ctx, portSpec(t, "ours", 9, pod, "10.9.0.5/24", "", 1)); err != nil {
		t.Fatal(err)
	}
	// A foreign link that carries the name we would give port "theirs",
	// and one that carries our alias format under a foreign name.
	nettest.IP(t, host.ns, "link", "add", host.dp.names.hostVeth("theirs"), "type", "veth", "peer", "name", "kagtx0")
	nettest.IP(t, host.ns, "link", "add", "kagtfake", "type", "veth", "peer", "name", "kagtx1")
	nettest.IP(t, host.ns, "link", "set", "kagtfake", "alias", "kurma-agent:port:ours2")

	ports, err := host.dp.ListPorts(ctx)
	if err != nil || len(ports) != 1 || ports[0].ID != "ours" {
		t.Fatalf("ListPorts = %+v, %v", ports, err)
	}
	if err := host.dp.Unplug(ctx, "theirs"); !errors.Is(err, kerrors.Conflict) {
		t.Fatalf("unplug of a foreign link: %v", err)
	}
	if err := host.dp.Unplug(ctx, "ours"); err != nil {
		t.Fatal(err)
	}
	links := nettest.Links(t, host.ns)
	for _, want := range []string{host.dp.names.hostVeth("theirs"), "kagtfake", "kagtx0", "kagtx1"} {
		if !slices.Contains(links, want) {
			t.Errorf("foreign link %s was removed: %v", want, links)
		}
	}
	// A foreign bridge with our VPC name is a conflict, not adopted.
	nettest.IP(t, host.ns, "link", "add", host.dp.names.bridge(10), "type", "bridge")
	if err := host.dp.EnsureVPC(ctx, VPCSpec{VNI: 10}); !errors.Is(err, kerrors.Conflict) {
		t.Fatalf("EnsureVPC over a foreign bridge: %v", err)
	}
	if vpcs, _ := host.dp.ListVPCs(ctx); !slices.Equal(vpcs, []uint32{9}) {
		t.Fatalf("ListVPCs = %v", vpcs)
	}
}

func TestSetRemotes(t *testing.T) {
	testutil.RequireRoot(t)
	ctx := t.Context()
	host := newTestHost(t, "192.0.2.1/24", dummyUnderlay(t))
	if err := host.dp.EnsureVPC(ctx, VPCSpec{VNI: 11}); err != nil {
		t.Fatal(err)
	}
	r1 := Remote{MAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}, IPs: []net.IP{net.ParseIP("10.11.0.7")}, VTEP: net.ParseIP("192.0.2.2")}
	r2 := Remote{MAC: net.HardwareAddr{2, 0, 0, 0, 0, 2}, IPs: []net.IP{net.ParseIP("10.11.0.8")}, VTEP: net.ParseIP("192.0.2.3")}
	vx := host.dp.names.vxlan(11)
	for _, tc := range []struct {
		name    string
		remotes []Remote
		want    []string // substrings of `bridge fdb show dev vx`
		neigh   []string
	}{
		{"two", []Remote{r1, r2}, []string{"02:00:00:00:00:01 dst 192.0.2.2", "02:00:00:00:00:02 dst 192.0.2.3"}, []string{"10.11.0.7 lladdr 02:00:00:00:00:01", "10.11.0.8 lladdr 02:00:00:00:00:02"}},
		{"same again", []Remote{r1, r2}, []string{"02:00:00:00:00:01 dst 192.0.2.2", "02:00:00:00:00:02 dst 192.0.2.3"}, []string{"10.11.0.7", "10.11.0.8"}},
		{"one moved", []Remote{{MAC: r1.MAC, IPs: r1.IPs, VTEP: net.ParseIP("192.0.2.9")}}, []string{"02:00:00:00:00:01 dst 192.0.2.9"}, []string{"10.11.0.7 lladdr 02:00:00:00:00:01"}},
		{"none", nil, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := host.dp.SetRemotes(ctx, 11, tc.remotes); err != nil {
				t.Fatal(err)
			}
			fdb := testutil.Run(t, "bridge", "-n", nettest.Name(host.ns), "fdb", "show", "dev", vx)
			neigh := nettest.IP(t, host.ns, "neigh", "show", "dev", vx)
			dsts, masters, ns := strings.Count(fdb, " dst "), strings.Count(fdb, "master"), strings.Count(neigh, "lladdr")
			if dsts != len(tc.want) || ns != len(tc.neigh) {
				t.Fatalf("fdb:\n%s\nneigh:\n%s", fdb, neigh)
			}
			for _, w := range tc.want {
				if !strings.Contains(fdb, w) {
					t.Errorf("fdb lacks %q:\n%s", w, fdb)
				}
			}
			for _, w := range tc.neigh {
				if !strings.Contains(neigh, w) {
					t.Errorf("neigh lacks %q:\n%s", w, neigh)
				}
			}
			if strings.Contains(fdb, "00:00:00:00:00:00") {
				t.Errorf("flood entry present:\n%s", fdb)
			}
			_ = masters
		})
	}
	if err := host.dp.SetRemotes(ctx, 99, nil); !errors.Is(err, kerrors.NotFound) {
		t.Fatalf("SetRemotes on a missing VPC: %v", err)
	}
}

// TestInterruptedCreation: links a crash left between creation and
// aliasing are recognised by their signature MAC, adopted or removed;
// look-alikes without the signature are left alone.
func TestInterruptedCreation(t *testing.T) {
	testutil.RequireRoot(t)
	ctx := t.Context()
	host := newTestHost(t, "192.0.2.1/24", dummyUnderlay(t))
	dp := host.dp
	// A bridge created but never aliased is adopted.
	br := dp.names.bridge(99)
	nettest.IP(t, host.ns, "link", "add", br, "address", dp.sigMAC(br).String(), "type", "bridge")
	if err := dp.EnsureVPC(ctx, VPCSpec{VNI: 99}); err != nil {
		t.Fatalf("EnsureVPC over an interrupted bridge: %v", err)
	}
	if vpcs, _ := dp.ListVPCs(ctx); !slices.Equal(vpcs, []uint32{99}) {
		t.Fatalf("ListVPCs = %v", vpcs)
	}
	pod := nettest.NewNS(t, testutil.UniqueName(testPrefix))
	spec := portSpec(t, "cut-short", 99, pod, "10.99.0.5/24", "10.99.0.1", 5)
	hv := dp.names.hostVeth(spec.ID)
	t.Run("veth without aliases", func(t *testing.T) {
		nettest.IP(t, host.ns, "link", "add", hv, "address", dp.sigMAC(hv).String(), "type", "veth", "peer", "name", "eth0", "netns", nettest.Name(pod))
		if err := dp.Plug(ctx, spec); err != nil {
			t.Fatal(err)
		}
		if got := nettest.Links(t, pod); len(got) != 2 {
			t.Fatalf("pod links: %v", got)
		}
	})
	t.Run("container end without alias", func(t *testing.T) {
		l, _ := podLink(t, pod, "eth0")
		nettest.IP(t, pod, "link", "set", "eth0", "alias", "")
		if err := dp.Plug(ctx, spec); err != nil {
			t.Fatal(err)
		}
		l2, _ := podLink(t, pod, "eth0")
		if l.Attrs().Index != l2.Attrs().Index || l2.Attrs().Alias != dp.names.portAlias(spec.ID) {
			t.Fatalf("container end replaced or not re-aliased: %+v", l2.Attrs())
		}
	})
	t.Run("cleanup", func(t *testing.T) {
		left := dp.names.hostVeth("left-behind")
		nettest.IP(t, host.ns, "link", "add", left, "address", dp.sigMAC(left).String(), "type", "veth", "peer", "name", "kagtlp")
		foreign := dp.names.hostVeth("foreign")
		nettest.IP(t, host.ns, "link", "add", foreign, "type", "veth", "peer", "name", "kagtfp")
		if err := dp.Cleanup(ctx); err != nil {
			t.Fatal(err)
		}
		links := nettest.Links(t, host.ns)
		if slices.Contains(links, left) || slices.Contains(links, "kagtlp") {
			t.Errorf("interrupted veth survived cleanup: %v", links)
		}
		for _, want := range []string{foreign, "kagtfp", hv, br} {
			if !slices.Contains(links, want) {
				t.Errorf("cleanup removed %s: %v", want, links)
			}
		}
	})
}

func TestWatchGone(t *testing.T) {
	testutil.RequireRoot(t)
	ctx := t.Context()
	host := newTestHost(t, "192.0.2.1/24", dummyUnderlay(t))
	if err := host.dp.EnsureVPC(ctx, VPCSpec{VNI: 3}); err != nil {
		t.Fatal(err)
	}
	pod := nettest.NewNS(t, testutil.UniqueName(testPrefix))
	if err := host.dp.Plug(ctx, portSpec(t, "watched", 3, pod, "10.3.0.5/24", "", 1)); err != nil {
		t.Fatal(err)
	}
	got := make(chan string, 4)
	if err := host.dp.WatchGone(ctx, func(id string) { got <- id }); err != nil {
		t.Fatal(err)
	}
	nettest.DelNS(nettest.Name(pod))
	select {
	case id := <-got:
		if id != "watched" {
			t.Fatalf("gone(%q), want watched", id)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("no event for a port whose namespace was deleted")
	}
}

// TestPlugDualStack: a port with an IPv4 and an IPv6 address gets both,
// a default route per family, and talks IPv6 across the bridge.
func TestPlugDualStack(t *testing.T) {
	testutil.RequireRoot(t)
	ctx := t.Context()
	host := newTestHost(t, "192.0.2.1/24", dummyUnderlay(t))
	gws := []net.IPNet{ipnet(t, "10.50.0.1/24"), ipnet(t, "fd00:50::1/64")}
	if err := host.dp.EnsureVPC(ctx, VPCSpec{VNI: 50, Gateways: gws}); err != nil {
		t.Fatal(err)
	}
	var pods []string
	for i := range 2 {
		pod := nettest.NewNS(t, testutil.UniqueName(testPrefix))
		spec := portSpec(t, fmt.Sprintf("dual-%d", i), 50, pod, fmt.Sprintf("10.50.0.%d/24", 5+i), "10.50.0.1", byte(5+i))
		spec.Addrs = append(spec.Addrs, PortAddr{Addr: ipnet(t, fmt.Sprintf("fd00:50::%d/64", 5+i)), Gateway: net.ParseIP("fd00:50::1")})
		if err := host.dp.Plug(ctx, spec); err != nil {
			t.Fatal(err)
		}
		pods = append(pods, pod)
	}
	out := nettest.IP(t, pods[0], "-6", "route", "show", "default")
	if !strings.Contains(out, "via fd00:50::1") {
		t.Fatalf("no IPv6 default route: %q", out)
	}
	if out := nettest.IP(t, pods[0], "-4", "route", "show", "default"); !strings.Contains(out, "via 10.50.0.1") {
		t.Fatalf("no IPv4 default route: %q", out)
	}
	nettest.Serve(t, pods[1], "[fd00:50::6]:7002", "v6")
	rctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := nettest.Reach(rctx, pods[0], "[fd00:50::6]:7002", "v6"); err != nil {
		t.Fatal(err)
	}
}

// TestPlugAdminDown: an admin-down port is plugged with both ends down;
// replugging it admin-up brings them up with the default route, without
// a new pair.
func TestPlugAdminDown(t *testing.T) {
	testutil.RequireRoot(t)
	ctx := t.Context()
	host := newTestHost(t, "192.0.2.1/24", dummyUnderlay(t))
	if err := host.dp.EnsureVPC(ctx, VPCSpec{VNI: 4, Gateways: []net.IPNet{ipnet(t, "10.4.0.1/24")}}); err != nil {
		t.Fatal(err)
	}
	pod := nettest.NewNS(t, testutil.UniqueName(testPrefix))
	spec := portSpec(t, "admin", 4, pod, "10.4.0.5/24", "10.4.0.1", 5)
	for _, tc := range []struct {
		name string
		down bool
	}{{"down", true}, {"up", false}, {"down again", true}} {
		t.Run(tc.name, func(t *testing.T) {
			spec.AdminDown = tc.down
			if err := host.dp.Plug(ctx, spec); err != nil {
				t.Fatal(err)
			}
			l, _ := podLink(t, pod, "eth0")
			h, err := host.dp.h.LinkByName(host.dp.names.hostVeth(spec.ID))
			if err != nil {
				t.Fatal(err)
			}
			for _, a := range []*netlink.LinkAttrs{l.Attrs(), h.Attrs()} {
				if up := a.Flags&net.FlagUp != 0; up == tc.down {
					t.Errorf("%s: up=%v, want %v", a.Name, up, !tc.down)
				}
			}
			if ports, _ := host.dp.ListPorts(ctx); len(ports) != 1 {
				t.Fatalf("ports %v", ports)
			}
		})
	}
	if out := nettest.IP(t, pod, "-4", "addr", "show", "eth0"); !strings.Contains(out, "10.4.0.5/24") {
		t.Fatalf("admin-down port lost its address:\n%s", out)
	}
}
