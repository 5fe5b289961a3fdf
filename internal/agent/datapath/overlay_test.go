package datapath

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"kurma.dev/kurma/internal/agent/nettest"
	"kurma.dev/kurma/internal/testutil"
)

// TestOverlayAndIsolation: two hosts joined by a veth underlay; one VPC
// spans both over VXLAN, a second VPC on host 2 must not reach the first
// even though host 2 routes (forwarding on) and has routes to both.
func TestOverlayAndIsolation(t *testing.T) {
	testutil.RequireRoot(t)
	ctx := t.Context()
	h2ns := nettest.NewNS(t, testutil.UniqueName(testPrefix))
	h1 := newTestHost(t, "192.0.2.1/24", func(h1ns string) string {
		nettest.IP(t, h1ns, "link", "add", "kagtu0", "type", "veth", "peer", "name", "kagtu0", "netns", nettest.Name(h2ns))
		return "kagtu0"
	})
	nettest.IP(t, h2ns, "addr", "add", "192.0.2.2/24", "dev", "kagtu0")
	nettest.IP(t, h2ns, "link", "set", "kagtu0", "up")
	dp2, err := New(ctx, Config{HostNS: h2ns, Prefix: testPrefix, UnderlayIP: net.ParseIP("192.0.2.2"),
		UnderlayDev: "kagtu0", NFTTable: testutil.UniqueName(testPrefix), Forwarding: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dp2.Close() })
	h2 := &testHost{ns: h2ns, dp: dp2}

	gw42 := []net.IPNet{ipnet(t, "10.42.0.1/24")}
	for _, h := range []*testHost{h1, h2} {
		if err := h.dp.EnsureVPC(ctx, VPCSpec{VNI: 42, Gateways: gw42}); err != nil {
			t.Fatal(err)
		}
	}
	if err := h2.dp.EnsureVPC(ctx, VPCSpec{VNI: 43, Gateways: []net.IPNet{ipnet(t, "10.43.0.1/24")}}); err != nil {
		t.Fatal(err)
	}
	podA := nettest.NewNS(t, testutil.UniqueName(testPrefix))
	podB := nettest.NewNS(t, testutil.UniqueName(testPrefix))
	podC := nettest.NewNS(t, testutil.UniqueName(testPrefix))
	pa := portSpec(t, "port-a", 42, podA, "10.42.0.5/24", "10.42.0.1", 5)
	pb := portSpec(t, "port-b", 42, podB, "10.42.0.6/24", "10.42.0.1", 6)
	pc := portSpec(t, "port-c", 43, podC, "10.43.0.5/24", "10.43.0.1", 5)
	for _, x := range []struct {
		h *testHost
		p PortSpec
	}{{h1, pa}, {h2, pb}, {h2, pc}} {
		if err := x.h.dp.Plug(ctx, x.p); err != nil {
			t.Fatal(err)
		}
	}
	remote := func(p PortSpec, vtep string) []Remote {
		return []Remote{{MAC: p.MAC, IPs: []net.IP{p.Addrs[0].Addr.IP}, VTEP: net.ParseIP(vtep)}}
	}
	if err := h1.dp.SetRemotes(ctx, 42, remote(pb, "192.0.2.2")); err != nil {
		t.Fatal(err)
	}
	if err := h2.dp.SetRemotes(ctx, 42, remote(pa, "192.0.2.1")); err != nil {
		t.Fatal(err)
	}
	nettest.Serve(t, podA, "10.42.0.5:7000", "a")
	nettest.Serve(t, podB, "10.42.0.6:7000", "b")

	t.Run("same vpc across hosts", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		defer cancel()
		if err := nettest.Reach(ctx, podA, "10.42.0.6:7000", "b"); err != nil {
			t.Fatal(err)
		}
		if err := nettest.Reach(ctx, podB, "10.42.0.5:7000", "a"); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("gateway arp stays local", func(t *testing.T) {
		// Each pod resolved the gateway to its own host's bridge.
		for _, x := range []struct {
			pod string
			h   *testHost
		}{{podA, h1}, {podB, h2}} {
			br, err := x.h.dp.h.LinkByName(x.h.dp.names.bridge(42))
			if err != nil {
				t.Fatal(err)
			}
			var got string
			for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
				// A refused connection to the gateway resolves its MAC.
				_, _ = nettest.Dial(x.pod, "10.42.0.1:9", 500*time.Millisecond)
				got = nettest.IP(t, x.pod, "neigh", "show", "10.42.0.1")
				if strings.Contains(got, "lladdr") {
					break
				}
			}
			if !strings.Contains(got, br.Attrs().HardwareAddr.String()) {
				t.Fatalf("gateway resolved to %q, want local bridge %s", got, br.Attrs().HardwareAddr)
			}
		}
	})
	t.Run("other vpc isolated", func(t *testing.T) {
		for _, dst := range []string{"10.42.0.6:7000", "10.42.0.5:7000"} {
			if got, err := nettest.Dial(podC, dst, 700*time.Millisecond); err == nil {
				t.Fatalf("vpc 43 reached %s: %q", dst, got)
			}
		}
	})
	t.Run("isolation is the nft rules", func(t *testing.T) {
		// Proof the previous subtest can fail: without our table, host 2
		// routes between the VPC bridges.
		testutil.Run(t, "ip", "netns", "exec", nettest.Name(h2ns), "nft", "delete", "table", "inet", dp2.cfg.NFTTable)
		ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		defer cancel()
		if err := nettest.Reach(ctx, podC, "10.42.0.6:7000", "b"); err != nil {
			t.Fatalf("without isolation rules: %v", err)
		}
		if err := dp2.syncIsolation(ctx); err != nil {
			t.Fatal(err)
		}
		if got, err := nettest.Dial(podC, "10.42.0.6:7000", 700*time.Millisecond); err == nil {
			t.Fatalf("rules restored but vpc 43 still reaches vpc 42: %q", got)
		}
	})
}

// TestOverlappingVPCs: two VPCs on one host with the same CIDR and
// gateway. Traffic inside a VPC is bridged, so a pod reaches the pod of
// its own VPC that holds an address, never the other VPC's pod with the
// same address.
func TestOverlappingVPCs(t *testing.T) {
	testutil.RequireRoot(t)
	ctx := t.Context()
	host := newTestHost(t, "192.0.2.1/24", dummyUnderlay(t))
	gw := []net.IPNet{ipnet(t, "10.60.0.1/24")}
	for _, vni := range []uint32{60, 61} {
		if err := host.dp.EnsureVPC(ctx, VPCSpec{VNI: vni, Gateways: gw}); err != nil {
			t.Fatal(err)
		}
	}
	x := nettest.NewNS(t, testutil.UniqueName(testPrefix))
	y := nettest.NewNS(t, testutil.UniqueName(testPrefix))
	z := nettest.NewNS(t, testutil.UniqueName(testPrefix))
	for _, p := range []PortSpec{
		portSpec(t, "x", 60, x, "10.60.0.5/24", "10.60.0.1", 5),
		portSpec(t, "y", 61, y, "10.60.0.6/24", "10.60.0.1", 6),
		portSpec(t, "z", 61, z, "10.60.0.5/24", "10.60.0.1", 7),
	} {
		if err := host.dp.Plug(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	nettest.Serve(t, x, "10.60.0.5:7003", "x")
	nettest.Serve(t, z, "10.60.0.5:7003", "z")
	for i := range 5 {
		got, err := nettest.Dial(y, "10.60.0.5:7003", 5*time.Second)
		if err != nil || got != "z" {
			t.Fatalf("dial %d from vpc 61: %q, %v (want z)", i, got, err)
		}
	}
}
