package datapath

import (
	"context"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"kurma.dev/kurma/internal/agent/nettest"
	"kurma.dev/kurma/internal/testutil"
)

// TestPortGuard: with a guard, a pod reaches its neighbour from its own
// MAC and address only; a spoofed source address or MAC is dropped. The
// same spoofing works without guards, so the test can fail.
func TestPortGuard(t *testing.T) {
	testutil.RequireRoot(t)
	ctx := t.Context()
	h := newTestHost(t, "192.0.2.1/24", dummyUnderlay(t))
	if err := h.dp.EnsureVPC(ctx, VPCSpec{VNI: 42, Gateways: []net.IPNet{ipnet(t, "10.42.0.1/24")}}); err != nil {
		t.Fatal(err)
	}
	podA := nettest.NewNS(t, testutil.UniqueName(testPrefix))
	podB := nettest.NewNS(t, testutil.UniqueName(testPrefix))
	pa := portSpec(t, "port-a", 42, podA, "10.42.0.5/24", "10.42.0.1", 5)
	pb := portSpec(t, "port-b", 42, podB, "10.42.0.6/24", "10.42.0.1", 6)
	for _, p := range []PortSpec{pa, pb} {
		if err := h.dp.Plug(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	// A second address in pod A that the port does not own.
	nettest.IP(t, podA, "addr", "add", "10.42.0.99/24", "dev", "eth0")
	nettest.Serve(t, podB, "10.42.0.6:7000", "b")
	guardA := Guard{PortID: "port-a", MAC: pa.MAC, IPs: []net.IP{pa.Addrs[0].Addr.IP}}
	setMAC := func(mac string) {
		nettest.IP(t, podA, "link", "set", "eth0", "address", mac)
		nettest.IP(t, podA, "neigh", "flush", "all")
		nettest.IP(t, podB, "neigh", "flush", "all")
	}

	tests := []struct {
		name   string
		guards []Guard
		mac    string // pod A's MAC for the attempt
		src    string
		want   bool
	}{
		{"own address, no guard", nil, pa.MAC.String(), "10.42.0.5", true},
		{"spoofed address, no guard", nil, pa.MAC.String(), "10.42.0.99", true},
		{"own address, guarded", []Guard{guardA}, pa.MAC.String(), "10.42.0.5", true},
		{"spoofed address, guarded", []Guard{guardA}, pa.MAC.String(), "10.42.0.99", false},
		{"spoofed mac, guarded", []Guard{guardA}, "02:42:00:00:2a:77", "10.42.0.5", false},
		{"spoofed mac, no guard", nil, "02:42:00:00:2a:77", "10.42.0.5", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := h.dp.SetGuards(ctx, tc.guards); err != nil {
				t.Fatal(err)
			}
			setMAC(tc.mac)
			t.Cleanup(func() { setMAC(pa.MAC.String()) })
			var got string
			var err error
			deadline := time.Now().Add(5 * time.Second)
			for {
				got, err = nettest.DialFrom(podA, tc.src, "10.42.0.6:7000", 700*time.Millisecond)
				if (err == nil && got == "b") || !tc.want || time.Now().After(deadline) {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			if reached := err == nil && got == "b"; reached != tc.want {
				t.Fatalf("from %s (%s): reached=%v (%q, %v), want %v", tc.src, tc.mac, reached, got, err, tc.want)
			}
		})
	}
	t.Run("bad guards are refused", func(t *testing.T) {
		for _, g := range []Guard{
			{PortID: "port-a", MAC: nil},
			{PortID: "bad id", MAC: pa.MAC},
			{PortID: "port-a", MAC: pa.MAC, IPs: []net.IP{net.IPv4zero}},
		} {
			if err := h.dp.SetGuards(context.Background(), []Guard{g}); err == nil {
				t.Errorf("SetGuards(%+v) accepted", g)
			}
		}
	})
}

// TestGuardRulesLongID: a 200-character port id with a quote still makes
// a valid transaction (comments carry the veth name).
func TestGuardRulesLongID(t *testing.T) {
	testutil.RequireRoot(t)
	h := newTestHost(t, "192.0.2.1/24", dummyUnderlay(t))
	id := `q"` + strings.Repeat("x", 198)
	g := Guard{PortID: id, MAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}, IPs: []net.IP{net.ParseIP("10.1.0.2"), net.ParseIP("fd00::2")}}
	if err := h.dp.SetGuards(t.Context(), []Guard{g}); err != nil {
		t.Fatal(err)
	}
	out := testutil.Run(t, "ip", "netns", "exec", nettest.Name(h.ns), "nft", "list", "table", "bridge", h.dp.cfg.NFTTable)
	if !strings.Contains(out, "10.1.0.2") || !strings.Contains(out, "fd00::2") {
		t.Fatalf("guard rules missing addresses:\n%s", out)
	}
	if err := h.dp.SetGuards(t.Context(), nil); err != nil {
		t.Fatal(err)
	}
	out = testutil.Run(t, "ip", "netns", "exec", nettest.Name(h.ns), "nft", "list", "table", "bridge", h.dp.cfg.NFTTable)
	if strings.Contains(out, "10.1.0.2") {
		t.Fatalf("SetGuards(nil) left rules:\n%s", out)
	}
}

// TestGuardElements: after the first SetGuards (the whole table, one nft
// transaction), a guard added or removed changes exactly its elements,
// through netlink; an element removed behind the datapath's back fails
// the next change, and the retry rewrites the table whole.
func TestGuardElements(t *testing.T) {
	testutil.RequireRoot(t)
	ctx := t.Context()
	h := newTestHost(t, "192.0.2.1/24", dummyUnderlay(t))
	ga := Guard{PortID: "port-a", MAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}, IPs: []net.IP{net.ParseIP("10.1.0.2").To4(), net.ParseIP("fd00::2")}}
	gb := Guard{PortID: "port-b", MAC: net.HardwareAddr{2, 0, 0, 0, 0, 2}, IPs: []net.IP{net.ParseIP("10.1.0.3").To4()}}
	va := h.dp.names.hostVeth("port-a")
	// kernel lists each guard set's elements as "ifname[/rest]".
	kernel := func() map[string][]string {
		t.Helper()
		out := map[string][]string{}
		for i, s := range h.dp.gsets {
			els, err := h.dp.gconn.GetSetElements(s)
			if err != nil {
				t.Fatalf("list %s: %v", s.Name, err)
			}
			for _, e := range els {
				ifn := strings.TrimRight(string(e.Key[:ifNameSize]), "\x00")
				rest := e.Key[ifNameSize:]
				switch i {
				case gsMAC:
					ifn += "/" + net.HardwareAddr(rest[:6]).String()
				case gsARP, gsV4, gsV6:
					ifn += "/" + net.IP(rest).String()
				}
				out[s.Name] = append(out[s.Name], ifn)
			}
			slices.Sort(out[s.Name])
		}
		return out
	}
	want := func(gs ...Guard) map[string][]string {
		out := map[string][]string{}
		for _, g := range gs {
			for _, e := range guardElems(g, h.dp.names.hostVeth(g.PortID)) {
				k := e.ifn
				if e.rest != "" {
					k += "/" + e.rest
				}
				out[guardSets[e.set].name] = append(out[guardSets[e.set].name], k)
			}
		}
		for _, v := range out {
			slices.Sort(v)
		}
		return out
	}
	steps := []struct {
		name   string
		guards []Guard
	}{
		{"first (whole table)", []Guard{ga}},
		{"one added", []Guard{ga, gb}},
		{"one removed", []Guard{gb}},
		{"address changed", []Guard{{PortID: "port-b", MAC: gb.MAC, IPs: []net.IP{net.ParseIP("10.1.0.9").To4()}}}},
		{"none", nil},
		{"both again", []Guard{ga, gb}},
	}
	for _, st := range steps {
		if err := h.dp.SetGuards(ctx, st.guards); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if got, w := kernel(), want(st.guards...); !maps.EqualFunc(got, w, slices.Equal) {
			t.Fatalf("%s: kernel has\n%v\nwant\n%v", st.name, got, w)
		}
		if h.dp.gin == nil {
			t.Fatalf("%s: the datapath forgot what it wrote", st.name)
		}
	}
	// Someone removes port-a's MAC element: the removal of port-a fails
	// (the element is not there), and the retry converges.
	testutil.Run(t, "ip", "netns", "exec", nettest.Name(h.ns), "nft", "delete", "element", "bridge", h.dp.cfg.NFTTable,
		guardSets[gsMAC].name, "{", strconv.Quote(va)+" . "+ga.MAC.String(), "}")
	if err := h.dp.SetGuards(ctx, []Guard{gb}); err == nil {
		t.Fatal("removing an element that is gone succeeded")
	}
	if err := h.dp.SetGuards(ctx, []Guard{gb}); err != nil {
		t.Fatalf("retry: %v", err)
	}
	if got, w := kernel(), want(gb); !maps.EqualFunc(got, w, slices.Equal) {
		t.Fatalf("after the retry: kernel has\n%v\nwant\n%v", got, w)
	}
}
