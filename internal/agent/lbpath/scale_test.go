package lbpath

import (
	"errors"
	"math"
	"net/netip"
	"slices"
	"strconv"
	"testing"
	"time"

	"kurma.dev/kurma/internal/agent/nettest"
	"kurma.dev/kurma/internal/testutil"
)

func manyLBs(n int) State {
	var st State
	for i := range n {
		st.LBs = append(st.LBs, LB{ID: "lb" + strconv.Itoa(i), Iface: bridge,
			VIP:       netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}),
			Listeners: []Listener{{Proto: TCP, Port: 80}},
			Members:   []Member{{Addr: addr("10.0.0.11")}, {Addr: addr("10.0.0.12")}}})
	}
	return st
}

// TestSyncConverges: Sync grows and shrinks the table to exactly the given
// state (transactions larger than one netlink attribute included), and a
// fresh Path, as after a restart or kill -9, removes what its predecessor
// left and the new state lacks.
func TestSyncConverges(t *testing.T) {
	tp := newTopo(t)
	p := newPath(t, tp, "")
	check := func(p *Path, n int) {
		t.Helper()
		c := p.Counts()
		if c["services"] != n || c["backends"] != 2*n || c["hairpin"] != min(n, 1)*2 {
			t.Fatalf("after sync of %d: %v", n, c)
		}
	}
	for _, n := range []int{10, 3000, 7} {
		if err := p.Sync(t.Context(), manyLBs(n)); err != nil {
			t.Fatalf("%d: %v", n, err)
		}
		check(p, n)
	}
	if err := p.Sync(t.Context(), manyLBs(2000)); err != nil {
		t.Fatal(err)
	}
	// "Restart": a new Path that knows nothing, given a smaller state with
	// one load balancer changed.
	_ = p.Close()
	p2 := newPath(t, tp, "")
	st := manyLBs(500)
	st.LBs[3].Members = st.LBs[3].Members[:1]
	if err := p2.Sync(t.Context(), st); err != nil {
		t.Fatal(err)
	}
	c := p2.Counts()
	if c["services"] != 500 || c["backends"] != 999 || c["chains"] != 2 {
		t.Fatalf("after restart sync: %v", c)
	}
	// Counts are p2's record of what it wrote; read the kernel back
	// through a third Path.
	p3 := newPath(t, tp, "")
	if err := p3.readKernelLocked(t.Context()); err != nil {
		t.Fatal(err)
	}
	if c3 := p3.Counts(); c3["services"] != 500 || c3["backends"] != 999 || c3["chains"] != 2 {
		t.Fatalf("kernel holds %v", c3)
	}
}

// TestCheckDrift: Check notices a table deleted behind our back, and Sync
// rebuilds it.
func TestCheckDrift(t *testing.T) {
	tp := newTopo(t)
	client := tp.pod(t, "client", "10.0.0.10")
	serveWho(t, tp.pod(t, "m1", "10.0.0.11"), "10.0.0.11:8080", "m1")
	p := newPath(t, tp, "")
	st := State{LBs: []LB{webLB("10.0.0.11")}}
	if err := p.Sync(t.Context(), st); err != nil {
		t.Fatal(err)
	}
	if err := p.Check(t.Context()); err != nil {
		t.Fatalf("no drift yet: %v", err)
	}
	before := p.SetName("services")
	testutil.Run(t, "ip", "netns", "exec", nettest.Name(tp.host), "nft", "delete", "table", "inet", "lbt")
	if err := p.Check(t.Context()); !errors.Is(err, ErrDrift) {
		t.Fatalf("want ErrDrift, got %v", err)
	}
	if err := p.Sync(t.Context(), st); err != nil {
		t.Fatal(err)
	}
	// The sets could not be read back: Sync rebuilt them in the other
	// generation (nfthost.Generations) and switched to it.
	if after := p.SetName("services"); after == before {
		t.Fatalf("services set %s after the rebuild, %s before: want the other generation", after, before)
	}
	if err := p.Check(t.Context()); err != nil {
		t.Fatalf("after sync: %v", err)
	}
	if name, err := who(client, "10.96.0.1:80"); err != nil || name != "m1" {
		t.Fatalf("after repair: %q, %v", name, err)
	}
}

// TestRestartRewritesNothing: a fresh Path (a restarted agent) synced to
// the state its predecessor left changes nothing in the kernel: the same
// rules with the same handles, the same sets (no generation switch), the
// same elements (nothing flushed and refilled).
func TestRestartRewritesNothing(t *testing.T) {
	tp := newTopo(t)
	p := newPath(t, tp, ext)
	st := manyLBs(50)
	st.LBs[0].OnLink = true
	st.FIPs = []FIP{{ID: "f1", Addr: addr("203.0.113.50"), PortAddr: addr("10.0.0.20")}}
	if err := p.Sync(t.Context(), st); err != nil {
		t.Fatal(err)
	}
	table := func() string {
		return testutil.Run(t, "ip", "netns", "exec", nettest.Name(tp.host), "nft", "-a", "list", "table", "inet", "lbt")
	}
	routes := func() string { return nettest.IP(t, tp.host, "-4", "route", "show", "table", "all") }
	before, routesBefore := table(), routes()
	_ = p.Close()
	p2 := newPath(t, tp, ext)
	if err := p2.Sync(t.Context(), st); err != nil {
		t.Fatal(err)
	}
	if after := table(); after != before {
		t.Errorf("the table changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if after := routes(); after != routesBefore {
		t.Errorf("the routes changed:\nbefore:\n%s\nafter:\n%s", routesBefore, after)
	}
}

// BenchmarkAddByKind: one load balancer added beside 30,000 others, as
// Kubernetes' Services ask (HostAccess, two members), a ClusterIP and a
// NodePort one after the other in each iteration (so that both see the
// same load), Apply call to return (the kernel's commit included). It
// reports each kind's mean and p99 and the ratio of the p99s: the
// datapath's share of a NodePort add's tail in bench/k8s/services.
func BenchmarkAddByKind(b *testing.B) {
	tp := newTopo(b)
	p := newPath(b, tp, "")
	const others = 30000
	lb := func(i int, nodePort uint16) LB {
		l := LB{ID: "lb" + strconv.Itoa(i), Iface: bridge, HostAccess: true,
			VIP:       netip.AddrFrom4([4]byte{10, byte(96 + i>>16), byte(i >> 8), byte(i)}),
			Listeners: []Listener{{Proto: TCP, Port: 80, TargetPort: 8080, NodePort: nodePort}},
			Members: []Member{{Addr: netip.AddrFrom4([4]byte{10, 40, byte(i >> 8), byte(i)}), Local: true},
				{Addr: netip.AddrFrom4([4]byte{10, 41, byte(i >> 8), byte(i)}), Local: true}}}
		return l
	}
	var st State
	for i := range others {
		st.LBs = append(st.LBs, lb(i, 0))
	}
	if err := p.Sync(b.Context(), st); err != nil {
		b.Fatal(err)
	}
	var ip, np []time.Duration
	i := others
	for b.Loop() {
		for _, nodePort := range []uint16{0, uint16(30000 + len(np)%2768)} {
			t0 := time.Now()
			if err := p.Apply(b.Context(), Changes{LBs: []LB{lb(i, nodePort)}}); err != nil {
				b.Fatal(err)
			}
			d := time.Since(t0)
			i++
			if nodePort == 0 {
				ip = append(ip, d)
			} else {
				np = append(np, d)
			}
		}
	}
	mean := func(s []time.Duration) float64 {
		var sum time.Duration
		for _, d := range s {
			sum += d
		}
		return float64(sum) / float64(len(s)) / 1e3
	}
	p99 := func(s []time.Duration) float64 {
		s = slices.Clone(s)
		slices.Sort(s)
		return float64(s[min(len(s)-1, int(math.Ceil(0.99*float64(len(s))))-1)]) / 1e3
	}
	b.ReportMetric(mean(ip), "clusterip-µs/add")
	b.ReportMetric(mean(np), "nodeport-µs/add")
	b.ReportMetric(p99(ip), "clusterip-p99-µs")
	b.ReportMetric(p99(np), "nodeport-p99-µs")
	b.ReportMetric(p99(np)/p99(ip), "p99-ratio")
}
