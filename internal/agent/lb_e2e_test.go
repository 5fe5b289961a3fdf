package agent_test

import (
	"fmt"
	"io"
	"maps"
	"net"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"kurma.dev/kurma/internal/agent/nettest"
	"kurma.dev/kurma/internal/testutil"
	"kurma.dev/kurma/pkg/controllerapi"
)

// serveWho answers every TCP connection on addr with "name from <client
// address>", and every UDP datagram on the same address with name.
func serveWho(t *testing.T, nsPath, addr, name string) {
	t.Helper()
	var ln net.Listener
	var pc net.PacketConn
	err := ns.WithNetNSPath(nsPath, func(ns.NetNS) error {
		var err error
		if ln, err = net.Listen("tcp", addr); err != nil {
			return err
		}
		pc, err = net.ListenPacket("udp", addr)
		return err
	})
	if err != nil {
		t.Fatalf("listen %s: %v", addr, err)
	}
	testutil.ServeConns(t, ln, func(c net.Conn) {
		h, _, _ := net.SplitHostPort(c.RemoteAddr().String())
		_, _ = io.WriteString(c, name+" from "+h)
	})
	testutil.ServeDatagrams(t, pc, func(net.Addr) []byte { return []byte(name) })
}

// who dials addr (tcp or udp) from nsPath and returns the answering
// server's name.
func who(nsPath, network, addr string) (string, error) {
	if network == "tcp" {
		s, err := nettest.Dial(nsPath, addr, 2*time.Second)
		name, _, _ := strings.Cut(s, " from ")
		return name, err
	}
	var c net.Conn
	err := ns.WithNetNSPath(nsPath, func(ns.NetNS) error {
		var err error
		c, err = net.Dial("udp", addr)
		return err
	})
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("?")); err != nil {
		return "", err
	}
	b := make([]byte, 64)
	n, err := c.Read(b)
	return string(b[:n]), err
}

// until retries f every 50 ms until it returns nil or d passes.
func until(t *testing.T, d time.Duration, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// spread dials addr n times and counts the answering servers.
func spread(nsPath, network, addr string, n int) (map[string]int, error) {
	seen := map[string]int{}
	for range n {
		name, err := who(nsPath, network, addr)
		if err != nil {
			return seen, err
		}
		seen[name]++
	}
	return seen, nil
}

// lbTable is `nft list table inet <the agents' table>` in a host
// namespace: the load balancers share the agent's inet table.
func lbTable(t *testing.T, h *host) string {
	t.Helper()
	// "" while the table does not exist (the caller retries).
	out, err := exec.Command("ip", "netns", "exec", nettest.Name(h.ns), "nft", "list", "table", "inet", h.nftTable).Output()
	if err != nil {
		return ""
	}
	return string(out)
}

// lbElements counts the elements of the services and backends maps and
// the pick chains in a host's load-balancer table.
func lbElements(t *testing.T, h *host) (services, backends, chains int) {
	t.Helper()
	var cur string
	for _, line := range strings.Split(lbTable(t, h), "\n") {
		line = strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(line, "map services-"):
			cur = "s"
		case strings.HasPrefix(line, "map backends-"):
			cur = "b"
		case strings.HasPrefix(line, "map ") || strings.HasPrefix(line, "set ") || strings.HasPrefix(line, "chain "):
			cur = ""
			if strings.HasPrefix(line, "chain pick-") {
				chains++
			}
		}
		if cur == "" || strings.HasPrefix(line, "type ") {
			continue
		}
		// Elements are listed comma-separated, one or more per line.
		n := strings.Count(line, " : ")
		if cur == "s" {
			services += n
		} else {
			backends += n
		}
	}
	return services, backends, chains
}

// TestLoadBalancerE2E: through the real controller and two agents, a
// client reaches VIP:port over TCP and UDP and both members answer (one of
// them on the other host, over VXLAN); affinity pins the client; a member
// replacement takes effect at once; a member reaches its own VIP; a load
// balancer without members refuses; deleting it leaves no element and no
// pick chain on either host.
func TestLoadBalancerE2E(t *testing.T) {
	ctx := t.Context()
	c := newCluster(t, 2)
	pid, sn, svc := c.lbNetwork(ctx, "lb", "10.20.0.0/24")
	client := c.newPod(ctx, t, pid, sn.ID, c.hosts[0])
	m1 := c.newPod(ctx, t, pid, sn.ID, c.hosts[0])
	m2 := c.newPod(ctx, t, pid, sn.ID, c.hosts[1]) // the other host
	pods := []pod{client, m1, m2}
	c.waitUp(ctx, t, pid, pods...)
	client, m1, m2 = pods[0], pods[1], pods[2]
	serveWho(t, m1.ns, m1.ip()+":8080", "m1")
	serveWho(t, m2.ns, m2.ip()+":8080", "m2")

	lb, err := c.c.CreateLoadBalancer(ctx, pid, controllerapi.LoadBalancer{Name: "web", VIPSubnetID: svc.ID,
		Listeners: []controllerapi.Listener{{Protocol: "TCP", Port: 80, TargetPort: 8080}, {Protocol: "UDP", Port: 53, TargetPort: 8080}},
		Members:   []controllerapi.Member{{Address: m1.ip()}, {Address: m2.ip()}}})
	if err != nil {
		t.Fatal(err)
	}
	tcpVIP, udpVIP := lb.VIPAddress+":80", lb.VIPAddress+":53"
	for _, nw := range []struct{ network, addr string }{{"tcp", tcpVIP}, {"udp", udpVIP}} {
		until(t, 10*time.Second, nw.network+": both members answer through the VIP", func() error {
			seen, err := spread(client.ns, nw.network, nw.addr, 30)
			if err != nil || seen["m1"] == 0 || seen["m2"] == 0 {
				return fmt.Errorf("seen %v, err %v", seen, err)
			}
			return nil
		})
	}
	// Another VPC on the same host does not reach this VPC's VIP.
	other := c.network(ctx, pid, "other", "10.21.0.0/24")
	stranger := c.newPod(ctx, t, pid, other.ID, c.hosts[0])
	c.waitUp(ctx, t, pid, stranger)
	if got, err := nettest.Dial(stranger.ns, tcpVIP, 500*time.Millisecond); err == nil {
		t.Fatalf("a pod of another VPC reached the VIP: %q", got)
	}
	// Hairpin: a member reaches its own VIP.
	until(t, 5*time.Second, "hairpin", func() error {
		_, err := spread(m1.ns, "tcp", tcpVIP, 10)
		return err
	})

	// Affinity: the client sticks to one member.
	if _, err := c.c.UpdateLoadBalancer(ctx, pid, lb.ID, controllerapi.LoadBalancerUpdate{
		SessionPersistence: &controllerapi.SessionPersistence{Type: controllerapi.PersistenceSourceIP, Timeout: 600}}); err != nil {
		t.Fatal(err)
	}
	until(t, 10*time.Second, "affinity pins the client", func() error {
		seen, err := spread(client.ns, "tcp", tcpVIP, 20)
		if err != nil || len(seen) != 1 {
			return fmt.Errorf("seen %v, err %v", seen, err)
		}
		return nil
	})

	// Replace the members: only m2 (on the other host) from now on.
	t0 := time.Now()
	if _, err := c.c.SetMembers(ctx, pid, lb.ID, []controllerapi.Member{{Address: m2.ip()}}); err != nil {
		t.Fatal(err)
	}
	until(t, 5*time.Second, "member replacement", func() error {
		seen, err := spread(client.ns, "tcp", tcpVIP, 20)
		if err != nil || seen["m2"] != 20 {
			return fmt.Errorf("seen %v, err %v", seen, err)
		}
		return nil
	})
	t.Logf("member replacement live after %v", time.Since(t0))

	// No members: refused, not black-holed.
	if _, err := c.c.SetMembers(ctx, pid, lb.ID, []controllerapi.Member{}); err != nil {
		t.Fatal(err)
	}
	until(t, 5*time.Second, "no members refuses", func() error {
		_, err := who(client.ns, "tcp", tcpVIP)
		if err == nil || !strings.Contains(err.Error(), "refused") {
			return fmt.Errorf("want connection refused, got %v", err)
		}
		return nil
	})

	if err := c.c.DeleteLoadBalancer(ctx, pid, lb.ID); err != nil {
		t.Fatal(err)
	}
	for _, h := range c.hosts {
		until(t, 5*time.Second, "no nft object left on "+h.id, func() error {
			if lbTable(t, h) == "" {
				return fmt.Errorf("no table to check")
			}
			if s, b, ch := lbElements(t, h); s+b+ch != 0 || strings.Contains(lbTable(t, h), "affinity") && strings.Contains(lbTable(t, h), "expires") {
				return fmt.Errorf("services %d backends %d pick chains %d:\n%s", s, b, ch, lbTable(t, h))
			}
			return nil
		})
	}
}

// fipState counts, on a host, the FIP elements of the load-balancer
// table, our local routes and the proxy neighbour entries.
func fipState(t *testing.T, h *host) (elems, routes, neigh int) {
	t.Helper()
	var cur bool
	for _, line := range strings.Split(lbTable(t, h), "\n") {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "map ") || strings.HasPrefix(line, "set ") || strings.HasPrefix(line, "chain ") {
			cur = strings.Contains(line, " fip-")
		}
		if cur && strings.Contains(line, "203.0.113.") {
			elems += strings.Count(line, "203.0.113.")
		}
	}
	r := strings.TrimSpace(nettest.IP(t, h.ns, "route", "show", "table", "local", "proto", "76"))
	if r != "" {
		routes = len(strings.Split(r, "\n"))
	}
	n := strings.TrimSpace(nettest.IP(t, h.ns, "neigh", "show", "proxy"))
	if n != "" {
		neigh = len(strings.Split(n, "\n"))
	}
	return elems, routes, neigh
}

// TestFloatingIPE2E: from the outside namespace a pod answers on its
// floating IP (explicitly requested, and honored) and its egress shows the
// floating IP as source; a floating IP of a load balancer reaches its
// member; 1,000 allocate/associate/disassociate/delete cycles leave no
// floating IP, no rule element, no route and no neighbour entry.
func TestFloatingIPE2E(t *testing.T) {
	ctx := t.Context()
	c := newClusterOpts(t, 1, clusterOpts{external: true})
	h := c.hosts[0]
	proj, err := c.c.CreateProject(ctx, controllerapi.Project{Name: "fip"})
	if err != nil {
		t.Fatal(err)
	}
	pid := proj.ID
	sn := c.network(ctx, pid, "net", "10.30.0.0/24")
	ext, err := c.c.CreateExternalNetwork(ctx, controllerapi.ExternalNetwork{Name: "outside", CIDR: "203.0.113.0/24", IPVersion: 4,
		AllocationPools: []controllerapi.AllocationPool{{Start: "203.0.113.10", End: "203.0.113.250"}}})
	if err != nil {
		t.Fatal(err)
	}
	pods := []pod{c.newPod(ctx, t, pid, sn.ID, h), c.newPod(ctx, t, pid, sn.ID, h)}
	c.waitUp(ctx, t, pid, pods...)
	p, m := pods[0], pods[1]
	serveWho(t, p.ns, p.ip()+":8080", "pod")
	serveWho(t, m.ns, m.ip()+":8080", "member")
	serveWho(t, c.outside, "203.0.113.2:9000", "out")

	fip, err := c.c.CreateFloatingIP(ctx, pid, controllerapi.FloatingIP{FloatingNetworkID: ext.ID,
		FloatingIPAddress: "203.0.113.50", PortID: p.port.ID})
	if err != nil {
		t.Fatal(err)
	}
	if fip.FloatingIPAddress != "203.0.113.50" {
		t.Fatalf("explicit address not honored: %s", fip.FloatingIPAddress)
	}
	until(t, 10*time.Second, "outside reaches the pod on its FIP", func() error {
		got, err := nettest.Dial(c.outside, "203.0.113.50:8080", time.Second)
		if err != nil || got != "pod from 203.0.113.2" {
			return fmt.Errorf("got %q, %v", got, err)
		}
		return nil
	})
	got, err := nettest.Dial(p.ns, "203.0.113.2:9000", 2*time.Second)
	if err != nil || got != "out from 203.0.113.50" {
		t.Fatalf("pod egress: got %q, %v (want the FIP as source)", got, err)
	}

	// A floating IP of a load balancer.
	lb, err := c.c.CreateLoadBalancer(ctx, pid, controllerapi.LoadBalancer{Name: "web", VIPSubnetID: sn.ID,
		Listeners: []controllerapi.Listener{{Protocol: "TCP", Port: 80, TargetPort: 8080}},
		Members:   []controllerapi.Member{{Address: m.ip()}}})
	if err != nil {
		t.Fatal(err)
	}
	lbFIP, err := c.c.CreateFloatingIP(ctx, pid, controllerapi.FloatingIP{FloatingNetworkID: ext.ID, LoadBalancerID: lb.ID})
	if err != nil {
		t.Fatal(err)
	}
	until(t, 10*time.Second, "outside reaches the load balancer on its FIP", func() error {
		got, err := nettest.Dial(c.outside, lbFIP.FloatingIPAddress+":80", time.Second)
		if err != nil || !strings.HasPrefix(got, "member from ") {
			return fmt.Errorf("got %q, %v", got, err)
		}
		return nil
	})
	// The pod's own VIP: reachable from the pod's subnet (on-link VIP).
	until(t, 10*time.Second, "on-link VIP", func() error {
		name, err := who(p.ns, "tcp", lb.VIPAddress+":80")
		if err != nil || name != "member" {
			return fmt.Errorf("got %q, %v", name, err)
		}
		return nil
	})
	if err := c.c.DeleteLoadBalancer(ctx, pid, lb.ID); err != nil {
		t.Fatal(err)
	}
	if err := c.c.DeleteFloatingIP(ctx, pid, lbFIP.ID); err != nil {
		t.Fatal(err)
	}
	if err := c.c.DeleteFloatingIP(ctx, pid, fip.ID); err != nil {
		t.Fatal(err)
	}

	// 1,000 cycles on the same port.
	const cycles = 1000
	t0 := time.Now()
	for i := range cycles {
		f, err := c.c.CreateFloatingIP(ctx, pid, controllerapi.FloatingIP{FloatingNetworkID: ext.ID})
		if err != nil {
			t.Fatalf("cycle %d: allocate: %v", i, err)
		}
		if _, err := c.c.AssociateFloatingIP(ctx, pid, f.ID, controllerapi.FloatingIPAssociation{PortID: p.port.ID}); err != nil {
			t.Fatalf("cycle %d: associate: %v", i, err)
		}
		if _, err := c.c.DisassociateFloatingIP(ctx, pid, f.ID); err != nil {
			t.Fatalf("cycle %d: disassociate: %v", i, err)
		}
		if err := c.c.DeleteFloatingIP(ctx, pid, f.ID); err != nil {
			t.Fatalf("cycle %d: delete: %v", i, err)
		}
	}
	t.Logf("%d cycles in %v", cycles, time.Since(t0))
	left, err := c.c.ListAllFloatingIPs(ctx)
	if err != nil || len(left) != 0 {
		t.Fatalf("floating IPs left: %v, %v", left, err)
	}
	until(t, 10*time.Second, "nothing left on the host", func() error {
		if lbTable(t, h) == "" {
			return fmt.Errorf("no table to check")
		}
		if e, r, n := fipState(t, h); e+r+n != 0 {
			return fmt.Errorf("fip elements %d, routes %d, proxy neighbours %d:\n%s", e, r, n, lbTable(t, h))
		}
		return nil
	})
	if _, err := nettest.Dial(c.outside, "203.0.113.50:8080", 300*time.Millisecond); err == nil {
		t.Fatal("the deleted FIP still answers")
	}
}

// TestLBAgentKill9Churn: while load balancers are created, deleted, given
// new members and affinity, the agent is killed with SIGKILL and started
// again; its table then converges to exactly the controller's state:
// every VIP and no other, every member, one pick chain per class in use.
func TestLBAgentKill9Churn(t *testing.T) {
	ctx := t.Context()
	c := newCluster(t, 1)
	h := c.hosts[0]
	proj, err := c.c.CreateProject(ctx, controllerapi.Project{Name: "lbchurn"})
	if err != nil {
		t.Fatal(err)
	}
	pid := proj.ID
	sn := c.network(ctx, pid, "net", "10.40.0.0/24")
	svc := c.serviceSubnet(ctx, pid, sn, "10.96.0.0/22")
	anchor := c.newPod(ctx, t, pid, sn.ID, h) // makes the VPC local to h
	c.waitUp(ctx, t, pid, anchor)
	members := func(i int) []controllerapi.Member {
		var ms []controllerapi.Member
		for j := range 1 + i%3 {
			ms = append(ms, controllerapi.Member{Address: fmt.Sprintf("10.40.0.%d", 100+(i+j)%100)})
		}
		return ms
	}
	var ids []string
	const ops = 150
	for i := range ops {
		switch {
		case i%5 == 3 && len(ids) > 0:
			id := ids[i%len(ids)]
			ids = append(ids[:i%len(ids)], ids[i%len(ids)+1:]...)
			if err := c.c.DeleteLoadBalancer(ctx, pid, id); err != nil {
				t.Fatalf("op %d: delete: %v", i, err)
			}
		case i%5 == 4 && len(ids) > 0:
			if _, err := c.c.SetMembers(ctx, pid, ids[(i*7)%len(ids)], members(i+1)); err != nil {
				t.Fatalf("op %d: set members: %v", i, err)
			}
		case i%7 == 6 && len(ids) > 0:
			if _, err := c.c.UpdateLoadBalancer(ctx, pid, ids[(i*3)%len(ids)], controllerapi.LoadBalancerUpdate{
				SessionPersistence: &controllerapi.SessionPersistence{Type: controllerapi.PersistenceSourceIP, Timeout: 60 + i}}); err != nil {
				t.Fatalf("op %d: affinity: %v", i, err)
			}
		default:
			lb, err := c.c.CreateLoadBalancer(ctx, pid, controllerapi.LoadBalancer{VIPSubnetID: svc.ID,
				Listeners: []controllerapi.Listener{{Protocol: "TCP", Port: 80, TargetPort: 8080}}, Members: members(i)})
			if err != nil {
				t.Fatalf("op %d: create: %v", i, err)
			}
			ids = append(ids, lb.ID)
		}
		switch i {
		case ops / 3:
			h.proc.kill9()
		case 2 * ops / 3:
			c.startAgent(h)
		}
	}
	want, err := c.c.ListLoadBalancers(ctx, pid)
	if err != nil {
		t.Fatal(err)
	}
	wantVIPs, wantBackends, classes := map[string]bool{}, 0, map[string]bool{}
	for _, l := range want {
		wantVIPs[l.VIPAddress] = true
		wantBackends += len(l.Members)
		cl := fmt.Sprint(len(l.Members))
		if l.SessionPersistence != nil {
			cl += fmt.Sprintf("-aff-%d", l.SessionPersistence.Timeout)
		}
		classes[cl] = true
	}
	vipRE := regexp.MustCompile(`\. (10\.96\.\d+\.\d+) \. tcp \. 80 :`)
	converged := func() error {
		table := lbTable(t, h)
		got := map[string]bool{}
		for _, m := range vipRE.FindAllStringSubmatch(table, -1) {
			got[m[1]] = true
		}
		s, b, ch := lbElements(t, h)
		if !maps.Equal(got, wantVIPs) || s != len(want) || b != wantBackends || ch != len(classes) {
			return fmt.Errorf("%d VIPs (want %d, same set %v), services %d, backends %d (want %d), pick chains %d (want %d)",
				len(got), len(wantVIPs), maps.Equal(got, wantVIPs), s, b, wantBackends, ch, len(classes))
		}
		return nil
	}
	until(t, 20*time.Second, "agent converges on the controller's state", converged)
	t.Logf("%d load balancers, %d members", len(want), wantBackends)
	// Someone deletes the table: the periodic check notices, a full sync
	// rebuilds it.
	testutil.Run(t, "ip", "netns", "exec", nettest.Name(h.ns), "nft", "delete", "table", "inet", h.nftTable)
	until(t, 20*time.Second, "agent rebuilds a deleted table", converged)
}

// TestNodePortFromHost: a host reaches a node port on its own node
// address, and on the other host's, and both members answer, the one on
// the other host included (the upstream spec "Networking Granular Checks:
// Services should function for node-Service").
func TestNodePortFromHost(t *testing.T) {
	ctx := t.Context()
	c := newCluster(t, 2)
	// As in Kubernetes mode: pods (and the replies of the host's
	// connections to them) leave their VPC through the host.
	c.agentArgs = []string{"--egress"}
	for _, h := range c.hosts {
		h.proc.stop()
		c.startAgent(h)
	}
	pid, sn, svc := c.lbNetwork(ctx, "np", "10.20.0.0/24")
	m1 := c.newPod(ctx, t, pid, sn.ID, c.hosts[0])
	m2 := c.newPod(ctx, t, pid, sn.ID, c.hosts[1])
	p1 := c.newPod(ctx, t, pid, sn.ID, c.hosts[0])
	p2 := c.newPod(ctx, t, pid, sn.ID, c.hosts[1])
	pods := []pod{m1, m2, p1, p2}
	c.waitUp(ctx, t, pid, pods...)
	m1, m2, p1, p2 = pods[0], pods[1], pods[2], pods[3]
	serveWho(t, m1.ns, m1.ip()+":8080", "m1")
	serveWho(t, m2.ns, m2.ip()+":8080", "m2")
	if _, err := c.c.CreateLoadBalancer(ctx, pid, controllerapi.LoadBalancer{Name: "np", VIPSubnetID: svc.ID,
		Listeners: []controllerapi.Listener{{Protocol: "TCP", Port: 80, TargetPort: 8080, NodePort: 30080},
			{Protocol: "UDP", Port: 53, TargetPort: 8080, NodePort: 30080}},
		Members: []controllerapi.Member{{Address: m1.ip()}, {Address: m2.ip()}}}); err != nil {
		t.Fatal(err)
	}
	clients := map[string]string{"host " + c.hosts[0].id: c.hosts[0].ns, "host " + c.hosts[1].id: c.hosts[1].ns,
		"pod on " + c.hosts[0].id: p1.ns, "pod on " + c.hosts[1].id: p2.ns}
	for name, from := range clients {
		for _, to := range c.hosts {
			for _, network := range []string{"tcp", "udp"} {
				addr := to.ip + ":30080"
				until(t, 10*time.Second, network+" from "+name+" to "+addr, func() error {
					seen, err := spread(from, network, addr, 30)
					if err != nil || seen["m1"] == 0 || seen["m2"] == 0 {
						return fmt.Errorf("seen %v, err %v", seen, err)
					}
					return nil
				})
			}
		}
	}
}
