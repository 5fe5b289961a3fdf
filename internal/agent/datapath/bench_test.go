package datapath

import (
	"fmt"
	"net"
	"testing"

	"kurma.dev/kurma/internal/agent/nettest"
	"kurma.dev/kurma/internal/testutil"
)

// BenchmarkPlug measures Plug of a fresh port (then Unplug, untimed).
func BenchmarkPlug(b *testing.B) {
	testutil.RequireRoot(b)
	hostNS := nettest.NewNS(b, testutil.UniqueName(testPrefix))
	nettest.IP(b, hostNS, "link", "add", "kagtu0", "type", "veth", "peer", "name", "kagtu1")
	dp, err := New(b.Context(), Config{HostNS: hostNS, Prefix: testPrefix, UnderlayIP: net.ParseIP("192.0.2.1"),
		UnderlayDev: "kagtu0", NFTTable: testutil.UniqueName(testPrefix)})
	if err != nil {
		b.Fatal(err)
	}
	defer dp.Close()
	if err := dp.EnsureVPC(b.Context(), VPCSpec{VNI: 5, Gateways: []net.IPNet{{IP: net.IPv4(10, 5, 0, 1).To4(), Mask: net.CIDRMask(16, 32)}}}); err != nil {
		b.Fatal(err)
	}
	pod := nettest.NewNS(b, testutil.UniqueName(testPrefix))
	b.ResetTimer()
	for i := range b.N {
		spec := PortSpec{ID: fmt.Sprintf("bench-%d", i), VNI: 5, NetNS: pod, IfName: "eth0",
			MAC:   net.HardwareAddr{2, 0, 0, 0, byte(i >> 8), byte(i)},
			Addrs: []PortAddr{{Addr: net.IPNet{IP: net.IPv4(10, 5, byte(i>>8), byte(i)).To4(), Mask: net.CIDRMask(16, 32)}, Gateway: net.IPv4(10, 5, 0, 1).To4()}}}
		if err := dp.Plug(b.Context(), spec); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if err := dp.Unplug(b.Context(), spec.ID); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}

// BenchmarkSetGuards100 measures one SetGuards with 100 ports guarded
// that adds or removes the guard of a 101st (a port's arrival or
// departure).
func BenchmarkSetGuards100(b *testing.B) {
	testutil.RequireRoot(b)
	hostNS := nettest.NewNS(b, testutil.UniqueName(testPrefix))
	nettest.IP(b, hostNS, "link", "add", "kagtu0", "type", "veth", "peer", "name", "kagtu1")
	dp, err := New(b.Context(), Config{HostNS: hostNS, Prefix: testPrefix, UnderlayIP: net.ParseIP("192.0.2.1"),
		UnderlayDev: "kagtu0", NFTTable: testutil.UniqueName(testPrefix)})
	if err != nil {
		b.Fatal(err)
	}
	defer dp.Close()
	var gs []Guard
	for i := range 101 {
		gs = append(gs, Guard{PortID: fmt.Sprintf("pod-%d", i), MAC: net.HardwareAddr{2, 0, 0, 0, 0, byte(i)},
			IPs: []net.IP{net.IPv4(10, 5, 0, byte(i)).To4()}})
	}
	if err := dp.SetGuards(b.Context(), gs[:100]); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := range b.N {
		if err := dp.SetGuards(b.Context(), gs[:100+(i+1)%2]); err != nil {
			b.Fatal(err)
		}
	}
}
