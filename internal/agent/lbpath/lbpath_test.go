package lbpath

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"kurma.dev/kurma/internal/agent/nettest"
	"kurma.dev/kurma/internal/testutil"
)

func webLB(members ...string) LB {
	l := LB{ID: "lb1", Iface: bridge, VIP: addr("10.96.0.1"),
		Listeners: []Listener{{Proto: TCP, Port: 80, TargetPort: 8080}, {Proto: UDP, Port: 53, TargetPort: 5353}}}
	for _, m := range members {
		l.Members = append(l.Members, Member{Addr: addr(m)})
	}
	return l
}

// TestLoadBalancer: a client reaches VIP:port, both members get
// connections (TCP and UDP); a member reaches its own VIP (hairpin);
// removing a member takes effect in one Apply; no members rejects; deleting
// the LB leaves no element and no pick chain.
func TestLoadBalancer(t *testing.T) {
	tp := newTopo(t)
	client := tp.pod(t, "client", "10.0.0.10")
	m1 := tp.pod(t, "m1", "10.0.0.11")
	m2 := tp.pod(t, "m2", "10.0.0.12")
	for name, p := range map[string]string{"m1": m1, "m2": m2} {
		ip := map[string]string{"m1": "10.0.0.11", "m2": "10.0.0.12"}[name]
		serveWho(t, p, ip+":8080", name)
		serveUDP(t, p, ip+":5353", name)
	}
	p := newPath(t, tp, "")
	ctx := t.Context()
	if err := p.Apply(ctx, Changes{LBs: []LB{webLB("10.0.0.11", "10.0.0.12")}}); err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for range 40 {
		name, err := who(client, "10.96.0.1:80")
		if err != nil {
			t.Fatalf("dial VIP: %v", err)
		}
		seen[name]++
	}
	if seen["m1"] == 0 || seen["m2"] == 0 {
		t.Fatalf("both members must get connections: %v", seen)
	}
	useen := map[string]int{}
	for range 40 {
		name, err := dialUDP(client, "10.96.0.1:53", 2*time.Second)
		if err != nil {
			t.Fatalf("udp to VIP: %v", err)
		}
		useen[name]++
	}
	if useen["m1"] == 0 || useen["m2"] == 0 {
		t.Fatalf("udp: both members must answer: %v", useen)
	}
	// Hairpin: m1 reaches its own VIP, whichever member answers.
	for range 10 {
		if _, err := who(m1, "10.96.0.1:80"); err != nil {
			t.Fatalf("hairpin: %v", err)
		}
	}
	out := testutil.Run(t, "ip", "netns", "exec", nettest.Name(tp.host), "nft", "list", "table", "inet", "lbt")
	for _, want := range []string{`"lbtbr0" . 10.96.0.1 . tcp . 80 : 0x00000002`, "2 : goto pick-2", "10.0.0.12 . 8080", "numgen random mod 2"} {
		if !strings.Contains(out, want) {
			t.Errorf("nft list lacks %q:\n%s", want, out)
		}
	}

	// Remove m2: one Apply later every connection goes to m1.
	if err := p.Apply(ctx, Changes{LBs: []LB{webLB("10.0.0.11")}}); err != nil {
		t.Fatal(err)
	}
	for range 20 {
		if name, err := who(client, "10.96.0.1:80"); err != nil || name != "m1" {
			t.Fatalf("after removing m2: got %q, %v", name, err)
		}
	}
	// No members: refused at once, not black-holed.
	if err := p.Apply(ctx, Changes{LBs: []LB{webLB()}}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err := who(client, "10.96.0.1:80")
	if err == nil || !strings.Contains(err.Error(), "refused") || time.Since(start) > time.Second {
		t.Fatalf("no members: want connection refused at once, got %v after %v", err, time.Since(start))
	}
	if _, err := dialUDP(client, "10.96.0.1:53", time.Second); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("no members, udp: want refused (icmp unreachable), got %v", err)
	}
	if err := p.Apply(ctx, Changes{DeleteLBs: []string{"lb1"}}); err != nil {
		t.Fatal(err)
	}
	assertEmpty(t, tp, p)
}

// assertEmpty checks that the table holds no element and no pick chain,
// reading the kernel anew.
func assertEmpty(t *testing.T, tp *topo, p *Path) {
	t.Helper()
	if err := p.Sync(t.Context(), State{}); err != nil {
		t.Fatal(err)
	}
	out := testutil.Run(t, "ip", "netns", "exec", nettest.Name(tp.host), "nft", "list", "table", "inet", "lbt")
	// The only elements left are the skeleton's: class 0 -> empty, and
	// the node addresses.
	want := 1
	if len(p.cfg.NodeAddrs) > 0 {
		want++
	}
	if strings.Count(out, "elements") != want || !strings.Contains(out, ": goto empty }") || strings.Contains(out, "pick-") {
		t.Fatalf("leftovers:\n%s", out)
	}
	routes := nettest.IP(t, tp.host, "route", "show", "table", "local", "proto", "76")
	if strings.TrimSpace(routes) != "" {
		t.Fatalf("leftover routes: %s", routes)
	}
}

// TestAffinity: with source-IP affinity, one client always lands on the
// same member.
func TestAffinity(t *testing.T) {
	tp := newTopo(t)
	client := tp.pod(t, "client", "10.0.0.10")
	for i, ip := range []string{"10.0.0.11", "10.0.0.12", "10.0.0.13"} {
		serveWho(t, tp.pod(t, "m", ip), ip+":8080", fmt.Sprint("m", i))
	}
	p := newPath(t, tp, "")
	l := webLB("10.0.0.11", "10.0.0.12", "10.0.0.13")
	l.Affinity = time.Hour
	if err := p.Apply(t.Context(), Changes{LBs: []LB{l}}); err != nil {
		t.Fatal(err)
	}
	first, err := who(client, "10.96.0.1:80")
	if err != nil {
		t.Fatal(err)
	}
	for range 30 {
		if name, err := who(client, "10.96.0.1:80"); err != nil || name != first {
			t.Fatalf("affinity: got %q (%v), want %q every time", name, err, first)
		}
	}
	if err := p.Apply(t.Context(), Changes{DeleteLBs: []string{"lb1"}}); err != nil {
		t.Fatal(err)
	}
	assertEmpty(t, tp, p)
}

// TestFloatingIP: from outside, a pod answers on its FIP and sees the
// outside's address; its egress to the outside carries the FIP as source;
// a FIP of a load balancer reaches its members; disassociation leaves
// nothing.
func TestFloatingIP(t *testing.T) {
	tp := newTopo(t)
	pod := tp.pod(t, "pod", "10.0.0.20")
	m1 := tp.pod(t, "m1", "10.0.0.11")
	serveWho(t, pod, "10.0.0.20:8080", "pod")
	serveWho(t, m1, "10.0.0.11:8080", "m1")
	serveWho(t, tp.out, "203.0.113.2:9000", "out")
	p := newPath(t, tp, ext)
	ctx := t.Context()
	fip := FIP{ID: "f1", Addr: addr("203.0.113.10"), PortAddr: addr("10.0.0.20")}
	lbFIP := FIP{ID: "f2", Addr: addr("203.0.113.11"), LBID: "lb1"}
	if err := p.Apply(ctx, Changes{LBs: []LB{webLB("10.0.0.11")}, FIPs: []FIP{fip, lbFIP}}); err != nil {
		t.Fatal(err)
	}
	got, err := nettest.Dial(tp.out, "203.0.113.10:8080", 2*time.Second)
	if err != nil || got != "pod from 203.0.113.2" {
		t.Fatalf("outside -> FIP: got %q, %v", got, err)
	}
	got, err = nettest.Dial(pod, "203.0.113.2:9000", 2*time.Second)
	if err != nil || got != "out from 203.0.113.10" {
		t.Fatalf("pod egress: got %q, %v (want the FIP as source)", got, err)
	}
	got, err = nettest.Dial(tp.out, "203.0.113.11:80", 2*time.Second)
	if err != nil || !strings.HasPrefix(got, "m1 from ") {
		t.Fatalf("outside -> LB FIP: got %q, %v", got, err)
	}
	if err := p.Apply(ctx, Changes{DeleteFIP: []string{"f1", "f2"}, DeleteLBs: []string{"lb1"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := nettest.Dial(tp.out, "203.0.113.10:8080", 500*time.Millisecond); err == nil {
		t.Fatal("FIP still answers after its deletion")
	}
	assertEmpty(t, tp, p)
	neigh := nettest.IP(t, tp.host, "neigh", "show", "proxy")
	if strings.TrimSpace(neigh) != "" {
		t.Fatalf("proxy neighbours left: %s", neigh)
	}
}

// TestOnLinkVIP: a VIP inside the pods' subnet is answered (ARP) by the
// host and balanced like any other; deleting it removes its route.
func TestOnLinkVIP(t *testing.T) {
	tp := newTopo(t)
	client := tp.pod(t, "client", "10.0.0.10")
	serveWho(t, tp.pod(t, "m1", "10.0.0.11"), "10.0.0.11:8080", "m1")
	p := newPath(t, tp, "")
	l := webLB("10.0.0.11")
	l.VIP, l.OnLink = addr("10.0.0.100"), true
	if err := p.Apply(t.Context(), Changes{LBs: []LB{l}}); err != nil {
		t.Fatal(err)
	}
	if name, err := who(client, "10.0.0.100:80"); err != nil || name != "m1" {
		t.Fatalf("on-link VIP: got %q, %v", name, err)
	}
	if err := p.Apply(t.Context(), Changes{DeleteLBs: []string{"lb1"}}); err != nil {
		t.Fatal(err)
	}
	assertEmpty(t, tp, p)
}
