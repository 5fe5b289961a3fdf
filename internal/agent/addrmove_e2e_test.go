package agent_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"kurma.dev/kurma/internal/agent/nettest"
	"kurma.dev/kurma/internal/testutil"
	"kurma.dev/kurma/pkg/controllerapi"
)

// TestAddressMovesBetweenHosts: a subnet deleted and created again with
// the same CIDR hands its first address to a new pod at once, on this
// host or the other, as Kubernetes test namespaces come and go. Host 2
// routes to that address for a pod of another subnet (as it routes a
// clusterIP DNATed to it), and its neighbour entry for the address
// still names the old owner's MAC: the kernel keeps a confirmed entry
// for up to one and a half base_reachable_time before it probes again
// (set to 10 minutes here, so the old entry cannot expire within the
// test). The agent removes that entry when the address gets its new
// owner, and host 2 reaches the new pod within seconds, in every
// direction of the move.
func TestAddressMovesBetweenHosts(t *testing.T) {
	c := newCluster(t, 2)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	proj, err := c.c.CreateProject(ctx, controllerapi.Project{Name: "addr-move"})
	if err != nil {
		t.Fatal(err)
	}
	pid := proj.ID
	// The clients: one pod per host in a subnet of their own, which keep
	// the VPC on both hosts throughout (as long-lived pods do).
	clients := c.network(ctx, pid, "vpc-move", "10.37.0.0/24")
	anchors := []pod{c.newPod(ctx, t, pid, clients.ID, c.hosts[0]), c.newPod(ctx, t, pid, clients.ID, c.hosts[1])}
	c.waitUp(ctx, t, pid, anchors...)
	client := anchors[1] // on host 2
	h2 := c.hosts[1]
	br := vpcBridge(t, h2.ns)
	testutil.Run(t, "ip", "netns", "exec", nettest.Name(h2.ns), "sysctl", "-q", "-w",
		"net.ipv4.neigh."+br.Attrs().Name+".base_reachable_time_ms=600000")

	for _, tc := range []struct {
		name     string
		from, to int    // host index of the address's old and new owner
		cidr     string // one per case: a failed case leaves nothing in the way of the next
	}{
		{"local to local", 1, 1, "10.36.1.0/24"},
		{"remote to local", 0, 1, "10.36.2.0/24"},
		{"local to remote", 1, 0, "10.36.3.0/24"},
		{"remote to remote", 0, 0, "10.36.4.0/24"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sn := c.subnet(t, ctx, pid, clients.NetworkID, "move-old", tc.cidr)
			old := c.newPod(ctx, t, pid, sn.ID, c.hosts[tc.from])
			t.Cleanup(func() { _ = c.c.DeletePort(context.Background(), pid, old.port.ID) })
			c.waitUp(ctx, t, pid, old)
			addr := old.ip() + ":8000"
			nettest.Serve(t, old.ns, addr, "old")
			rctx, cancel := context.WithTimeout(ctx, 15*time.Second)
			defer cancel()
			if err := nettest.Reach(rctx, client.ns, addr, "old"); err != nil {
				t.Fatalf("before the move: %v", err)
			}
			if got := neighMAC(t, h2.ns, br.Attrs().Index, old.ip()); got != old.port.MACAddress {
				t.Fatalf("host 2 resolved %s to %q, want the old owner's %s", old.ip(), got, old.port.MACAddress)
			}

			if err := c.c.DeletePort(ctx, pid, old.port.ID); err != nil {
				t.Fatal(err)
			}
			if err := c.c.DeleteSubnet(ctx, pid, sn.ID); err != nil {
				t.Fatal(err)
			}
			sn = c.subnet(t, ctx, pid, clients.NetworkID, "move-new", tc.cidr)
			moved := c.newPod(ctx, t, pid, sn.ID, c.hosts[tc.to])
			t.Cleanup(func() { _ = c.c.DeletePort(context.Background(), pid, moved.port.ID) })
			if moved.ip() != old.ip() || moved.port.MACAddress == old.port.MACAddress {
				t.Fatalf("new pod has %s (%s), want the old pod's address %s with another MAC than %s",
					moved.ip(), moved.port.MACAddress, old.ip(), old.port.MACAddress)
			}
			c.waitUp(ctx, t, pid, moved)
			nettest.Serve(t, moved.ns, addr, "new")
			rctx, cancel = context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			if err := nettest.Reach(rctx, client.ns, addr, "new"); err != nil {
				t.Fatalf("after the move (host 2's entry: %q): %v",
					nettest.IP(t, h2.ns, "neigh", "show", old.ip()), err)
			}
			if got := neighMAC(t, h2.ns, br.Attrs().Index, old.ip()); got != moved.port.MACAddress {
				t.Fatalf("host 2 resolves %s to %q, want the new owner's %s", old.ip(), got, moved.port.MACAddress)
			}
		})
	}
}

// subnet adds subnet name (cidr) to VPC vpcID, deleted when t ends
// unless it is gone by then.
func (c *cluster) subnet(t *testing.T, ctx context.Context, pid, vpcID, name, cidr string) *controllerapi.Subnet {
	t.Helper()
	sn, err := c.c.CreateSubnet(ctx, pid, controllerapi.Subnet{Name: name, NetworkID: vpcID, CIDR: cidr, IPVersion: 4})
	if err != nil {
		t.Fatalf("create subnet %s: %v", cidr, err)
	}
	t.Cleanup(func() { _ = c.c.DeleteSubnet(context.Background(), pid, sn.ID) })
	return sn
}

// vpcBridge returns the one VPC bridge of a host namespace.
func vpcBridge(t *testing.T, hostNS string) netlink.Link {
	t.Helper()
	links, err := nettest.Handle(t, hostNS).LinkList()
	if err != nil {
		t.Fatal(err)
	}
	var out netlink.Link
	for _, l := range links {
		if l.Type() == "bridge" && strings.HasPrefix(l.Attrs().Alias, "kurma-agent:vpc:") {
			if out != nil {
				t.Fatalf("two vpc bridges in %s: %s and %s", hostNS, out.Attrs().Name, l.Attrs().Name)
			}
			out = l
		}
	}
	if out == nil {
		t.Fatalf("no vpc bridge in %s", hostNS)
	}
	return out
}

// neighMAC is the MAC of the neighbour entry for ip on link ix of a host
// namespace ("" when there is none, or it has no address yet).
func neighMAC(t *testing.T, hostNS string, ix int, ip string) string {
	t.Helper()
	ns, err := nettest.Handle(t, hostNS).NeighList(ix, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range ns {
		if n.IP.String() == ip {
			return n.HardwareAddr.String()
		}
	}
	return ""
}
