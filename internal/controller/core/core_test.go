package core

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"path/filepath"
	"slices"
	"testing"

	"kurma.dev/kurma/internal/controller/store/boltstore"
	capi "kurma.dev/kurma/pkg/controllerapi"
	"kurma.dev/kurma/pkg/kerrors"
)

// testCore is a core over a real bbolt store in the test's temp dir.
func testCore(t *testing.T) *Core {
	t.Helper()
	st, err := boltstore.Open(filepath.Join(t.TempDir(), "kurma.db"), boltstore.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	c, err := New(Config{Store: st, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// must fails the test on err.
func must[T any](t *testing.T) func(v T, err error) T {
	return func(v T, err error) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

// wantKind checks that err is of kerrors category kind (nil: no error).
func wantKind(t *testing.T, what string, err error, kind error) {
	t.Helper()
	switch {
	case kind == nil && err != nil:
		t.Fatalf("%s: %v, want success", what, err)
	case kind != nil && !errors.Is(err, kind):
		t.Fatalf("%s: %v, want %v", what, err, kind)
	}
}

// network makes project p, VPC v (10.0.0.0/16) and subnet s
// (10.0.1.0/24) in it.
func network(t *testing.T, c *Core) {
	t.Helper()
	ctx := context.Background()
	must[capi.Project](t)(c.CreateProject(ctx, capi.Project{ID: "p"}))
	must[capi.VPC](t)(c.CreateVPC(ctx, "p", capi.VPC{ID: "v", CIDR: "10.0.0.0/16"}))
	must[capi.Subnet](t)(c.CreateSubnet(ctx, "p", capi.Subnet{ID: "s", NetworkID: "v", CIDR: "10.0.1.0/24"}))
}

func TestProjectsVPCsSubnets(t *testing.T) {
	c := testCore(t)
	ctx := context.Background()
	_, err := c.CreateVPC(ctx, "p", capi.VPC{ID: "v"})
	wantKind(t, "vpc in a missing project", err, kerrors.NotFound)
	network(t, c)
	_, err = c.CreateProject(ctx, capi.Project{ID: "p"})
	wantKind(t, "project again", err, kerrors.Conflict)

	for _, tc := range []struct {
		name string
		vpc  capi.VPC
		want error
	}{
		{"again", capi.VPC{ID: "v"}, kerrors.Conflict},
		{"cidr not a network", capi.VPC{ID: "v2", CIDR: "10.0.0.1/16"}, kerrors.Invalid},
		{"cidr garbage", capi.VPC{ID: "v2", CIDR: "ten"}, kerrors.Invalid},
		{"bad id", capi.VPC{ID: "a/b"}, kerrors.Invalid},
		{"other project_id", capi.VPC{ID: "v2", ProjectID: "q"}, kerrors.Invalid},
	} {
		t.Run("vpc "+tc.name, func(t *testing.T) {
			_, err := c.CreateVPC(ctx, "p", tc.vpc)
			wantKind(t, "CreateVPC", err, tc.want)
		})
	}
	for _, tc := range []struct {
		name string
		sn   capi.Subnet
		want error
	}{
		{"again", capi.Subnet{ID: "s", NetworkID: "v", CIDR: "10.0.9.0/24"}, kerrors.Conflict},
		{"no vpc", capi.Subnet{ID: "s2", CIDR: "10.0.2.0/24"}, kerrors.Invalid},
		{"missing vpc", capi.Subnet{ID: "s2", NetworkID: "nope", CIDR: "10.0.2.0/24"}, kerrors.NotFound},
		{"outside the vpc", capi.Subnet{ID: "s2", NetworkID: "v", CIDR: "10.1.0.0/24"}, kerrors.Invalid},
		{"wider than the vpc", capi.Subnet{ID: "s2", NetworkID: "v", CIDR: "10.0.0.0/8"}, kerrors.Invalid},
		{"overlapping", capi.Subnet{ID: "s2", NetworkID: "v", CIDR: "10.0.1.128/25"}, kerrors.Conflict},
		{"bad purpose", capi.Subnet{ID: "s2", NetworkID: "v", CIDR: "10.0.2.0/24", Purpose: "x"}, kerrors.Invalid},
		{"bad nameserver", capi.Subnet{ID: "s2", NetworkID: "v", CIDR: "10.0.2.0/24", DNSNameservers: []string{"dns"}}, kerrors.Invalid},
		{"bad cidr", capi.Subnet{ID: "s2", NetworkID: "v", CIDR: "10.0.2.0/33"}, kerrors.Invalid},
		{"gateway outside", capi.Subnet{ID: "s2", NetworkID: "v", CIDR: "10.0.2.0/24", GatewayIP: "10.0.3.1"}, kerrors.Invalid},
		{"ok", capi.Subnet{ID: "s2", NetworkID: "v", CIDR: "10.0.2.0/24"}, nil},
		{"service subnet outside the vpc", capi.Subnet{ID: "svc", NetworkID: "v", CIDR: "10.96.0.0/16", Purpose: capi.SubnetPurposeService}, nil},
	} {
		t.Run("subnet "+tc.name, func(t *testing.T) {
			_, err := c.CreateSubnet(ctx, "p", tc.sn)
			wantKind(t, "CreateSubnet", err, tc.want)
		})
	}
	sn := must[capi.Subnet](t)(c.GetSubnet(ctx, "p", "s2"))
	if sn.GatewayIP != "10.0.2.1" || sn.IPVersion != 4 || sn.ProjectID != "p" || sn.RevisionNumber == 0 {
		t.Fatalf("subnet defaults: %+v", sn)
	}
	subs := must[[]capi.Subnet](t)(c.ListSubnets(ctx, "p", "v"))
	if len(subs) != 3 {
		t.Fatalf("%d subnets, want 3", len(subs))
	}
	wantKind(t, "delete a vpc with subnets", c.DeleteVPC(ctx, "p", "v"), kerrors.Conflict)
	wantKind(t, "delete a project with a vpc", c.DeleteProject(ctx, "p"), kerrors.Conflict)
	for _, id := range []string{"s", "s2", "svc"} {
		wantKind(t, "delete subnet "+id, c.DeleteSubnet(ctx, "p", id), nil)
	}
	wantKind(t, "delete subnet again", c.DeleteSubnet(ctx, "p", "s"), kerrors.NotFound)
	wantKind(t, "delete vpc", c.DeleteVPC(ctx, "p", "v"), nil)
	wantKind(t, "delete project", c.DeleteProject(ctx, "p"), nil)
	_, err = c.GetProject(ctx, "p")
	wantKind(t, "get deleted project", err, kerrors.NotFound)
}

func TestPorts(t *testing.T) {
	c := testCore(t)
	ctx := context.Background()
	network(t, c)
	port := func(id string, ip string) capi.Port {
		p := capi.Port{ID: id, NetworkID: "s", DeviceID: "dev-" + id, DeviceOwner: "test", BindingHostID: "h1"}
		if ip != "" {
			p.FixedIPs = []capi.FixedIP{{IPAddress: ip}}
		}
		return p
	}
	got := must[[]capi.Port](t)(c.CreatePorts(ctx, "p", []capi.Port{port("a", ""), port("b", ""), port("c", "10.0.1.77")}))
	seenIP, seenMAC := map[string]bool{}, map[string]bool{}
	for _, p := range got {
		ip := netip.MustParseAddr(p.FixedIPs[0].IPAddress)
		if !netip.MustParsePrefix("10.0.1.0/24").Contains(ip) || ip.String() == "10.0.1.1" || seenIP[ip.String()] ||
			p.MACAddress == "" || seenMAC[p.MACAddress] || p.VPCID != "v" || p.Status != capi.StatusPending {
			t.Fatalf("port %+v", p)
		}
		seenIP[ip.String()], seenMAC[p.MACAddress] = true, true
	}
	if got[2].FixedIPs[0].IPAddress != "10.0.1.77" {
		t.Fatalf("requested address not given: %+v", got[2].FixedIPs)
	}
	for _, tc := range []struct {
		name  string
		ports []capi.Port
		want  error
	}{
		{"id taken", []capi.Port{port("a", "")}, kerrors.Conflict},
		{"address taken", []capi.Port{port("d", "10.0.1.77")}, kerrors.Conflict},
		{"the gateway", []capi.Port{port("d", "10.0.1.1")}, kerrors.Conflict},
		{"address outside the subnet", []capi.Port{port("d", "10.0.2.5")}, kerrors.Invalid},
		{"address garbage", []capi.Port{port("d", "ten")}, kerrors.Invalid},
		{"id twice in the request", []capi.Port{port("d", ""), port("d", "")}, kerrors.Invalid},
		{"subnet missing", []capi.Port{{ID: "d", NetworkID: "nope"}}, kerrors.NotFound},
		{"all or nothing", []capi.Port{port("d", ""), port("e", "10.0.1.77")}, kerrors.Conflict},
		{"mac taken", []capi.Port{{ID: "d", NetworkID: "s", MACAddress: got[0].MACAddress}}, kerrors.Conflict},
		{"mac garbage", []capi.Port{{ID: "d", NetworkID: "s", MACAddress: "zz"}}, kerrors.Invalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.CreatePorts(ctx, "p", tc.ports)
			wantKind(t, "CreatePorts", err, tc.want)
			if _, err := c.GetPort(ctx, "p", "d"); !errors.Is(err, kerrors.NotFound) {
				t.Fatalf("a refused request left port d: %v", err)
			}
		})
	}
	// Filters.
	for _, tc := range []struct {
		f    capi.PortFilter
		want []string
	}{
		{capi.PortFilter{}, []string{"a", "b", "c"}},
		{capi.PortFilter{DeviceID: "dev-b"}, []string{"b"}},
		{capi.PortFilter{HostID: "h1"}, []string{"a", "b", "c"}},
		{capi.PortFilter{HostID: "h2"}, nil},
		{capi.PortFilter{NetworkID: "s"}, []string{"a", "b", "c"}},
	} {
		ps := must[[]capi.Port](t)(c.ListPorts(ctx, "p", tc.f))
		var ids []string
		for _, p := range ps {
			ids = append(ids, p.ID)
		}
		slices.Sort(ids)
		if !slices.Equal(ids, tc.want) {
			t.Fatalf("ListPorts(%+v) = %v, want %v", tc.f, ids, tc.want)
		}
	}
	// Status.
	up := must[capi.Port](t)(c.SetPortStatus(ctx, "p", "a", capi.PortStatusUpdate{Status: capi.StatusUp}))
	if up.Status != capi.StatusUp {
		t.Fatalf("status %q", up.Status)
	}
	_, err := c.SetPortStatus(ctx, "p", "a", capi.PortStatusUpdate{Status: "SIDEWAYS"})
	wantKind(t, "bad status", err, kerrors.Invalid)
	_, err = c.SetPortStatus(ctx, "p", "zz", capi.PortStatusUpdate{Status: capi.StatusUp})
	wantKind(t, "status of a missing port", err, kerrors.NotFound)
	// A deleted port's address and MAC are free again; its subnet can go
	// once it has no port.
	wantKind(t, "delete a subnet with ports", c.DeleteSubnet(ctx, "p", "s"), kerrors.Conflict)
	wantKind(t, "delete port c", c.DeletePort(ctx, "p", "c"), nil)
	wantKind(t, "delete port c again", c.DeletePort(ctx, "p", "c"), kerrors.NotFound)
	again := must[[]capi.Port](t)(c.CreatePorts(ctx, "p", []capi.Port{{ID: "c2", NetworkID: "s",
		MACAddress: got[2].MACAddress, FixedIPs: []capi.FixedIP{{IPAddress: "10.0.1.77"}}}}))
	if again[0].FixedIPs[0].IPAddress != "10.0.1.77" {
		t.Fatalf("reused address: %+v", again[0])
	}
	for _, id := range []string{"a", "b", "c2"} {
		wantKind(t, "delete port "+id, c.DeletePort(ctx, "p", id), nil)
	}
	wantKind(t, "delete the empty subnet", c.DeleteSubnet(ctx, "p", "s"), nil)
}

// TestPortsExhausted: a /29 has 5 addresses for ports (network,
// gateway and broadcast excluded); the sixth port is refused as
// Exhausted, and a deleted port makes room.
func TestPortsExhausted(t *testing.T) {
	c := testCore(t)
	ctx := context.Background()
	must[capi.Project](t)(c.CreateProject(ctx, capi.Project{ID: "p"}))
	must[capi.VPC](t)(c.CreateVPC(ctx, "p", capi.VPC{ID: "v"}))
	must[capi.Subnet](t)(c.CreateSubnet(ctx, "p", capi.Subnet{ID: "s", NetworkID: "v", CIDR: "10.0.0.0/29"}))
	for i := range 5 {
		must[[]capi.Port](t)(c.CreatePorts(ctx, "p", []capi.Port{{ID: fmt.Sprint("p", i), NetworkID: "s"}}))
	}
	_, err := c.CreatePorts(ctx, "p", []capi.Port{{ID: "p5", NetworkID: "s"}})
	wantKind(t, "sixth port", err, kerrors.Exhausted)
	wantKind(t, "delete", c.DeletePort(ctx, "p", "p2"), nil)
	must[[]capi.Port](t)(c.CreatePorts(ctx, "p", []capi.Port{{ID: "p5", NetworkID: "s"}}))
}

func lbNetwork(t *testing.T, c *Core) {
	t.Helper()
	network(t, c)
	must[capi.Subnet](t)(c.CreateSubnet(context.Background(), "p",
		capi.Subnet{ID: "svc", NetworkID: "v", CIDR: "10.96.0.0/24", Purpose: capi.SubnetPurposeService}))
}

func TestLoadBalancers(t *testing.T) {
	c := testCore(t)
	ctx := context.Background()
	lbNetwork(t, c)
	tcp80 := []capi.Listener{{Protocol: "TCP", Port: 80, TargetPort: 8080}}
	lb := func(id, vip string, members ...capi.Member) capi.LoadBalancer {
		return capi.LoadBalancer{ID: id, VIPSubnetID: "svc", VIPAddress: vip, Listeners: tcp80, Members: members}
	}
	m := func(a string) capi.Member { return capi.Member{Address: a} }
	made := must[[]capi.LoadBalancer](t)(c.CreateLoadBalancers(ctx, "p", []capi.LoadBalancer{
		lb("a", "10.96.0.10", m("10.0.1.5"), m("10.0.1.6")), lb("b", "")}))
	if made[0].VIPAddress != "10.96.0.10" || made[1].VIPAddress == "" || made[0].VPCID != "v" ||
		made[0].OperatingStatus != capi.OperatingOnline || made[1].OperatingStatus != capi.OperatingOffline {
		t.Fatalf("load balancers %+v", made)
	}
	many := make([]capi.Member, 5001)
	for i := range many {
		many[i] = m(netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)}).String())
	}
	for _, tc := range []struct {
		name string
		lb   capi.LoadBalancer
		want error
	}{
		{"id taken", lb("a", ""), kerrors.Conflict},
		{"vip taken", lb("c", "10.96.0.10"), kerrors.Conflict},
		{"vip outside its subnet", lb("c", "10.97.0.10"), kerrors.Invalid},
		{"no vip subnet", capi.LoadBalancer{ID: "c", Listeners: tcp80}, kerrors.Invalid},
		{"vip subnet missing", capi.LoadBalancer{ID: "c", VIPSubnetID: "nope", Listeners: tcp80}, kerrors.NotFound},
		{"member outside the vpc", lb("c", "", m("192.168.0.1")), kerrors.Invalid},
		{"listener port 0", capi.LoadBalancer{ID: "c", VIPSubnetID: "svc", Listeners: []capi.Listener{{Protocol: "TCP"}}}, kerrors.Invalid},
		{"listener protocol", capi.LoadBalancer{ID: "c", VIPSubnetID: "svc", Listeners: []capi.Listener{{Protocol: "ICMP", Port: 1}}}, kerrors.Invalid},
		{"member address garbage", lb("c", "", m("ten")), kerrors.Invalid},
		{"member of an unknown listener", lb("c", "", capi.Member{Address: "10.0.1.5", Listeners: []string{"UDP/53"}}), kerrors.Invalid},
		{"too many members", lb("c", "", many...), kerrors.Invalid},
		{"persistence type", capi.LoadBalancer{ID: "c", VIPSubnetID: "svc", Listeners: tcp80,
			SessionPersistence: &capi.SessionPersistence{Type: "COOKIE"}}, kerrors.Invalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.CreateLoadBalancers(ctx, "p", []capi.LoadBalancer{tc.lb})
			wantKind(t, "CreateLoadBalancers", err, tc.want)
			if _, err := c.GetLoadBalancer(ctx, "p", "c"); !errors.Is(err, kerrors.NotFound) {
				t.Fatalf("refused request left load balancer c: %v", err)
			}
		})
	}
	ext := capi.Member{Address: "192.168.0.1", External: true}
	got := must[capi.LoadBalancer](t)(c.SetMembers(ctx, "p", "b", []capi.Member{m("10.0.1.9"), ext}))
	if len(got.Members) != 2 || got.OperatingStatus != capi.OperatingOnline {
		t.Fatalf("after SetMembers: %+v", got)
	}
	_, err := c.SetMembers(ctx, "p", "b", []capi.Member{m("192.168.0.2")})
	wantKind(t, "SetMembers outside the vpc", err, kerrors.Invalid)
	_, err = c.SetMembers(ctx, "p", "zz", nil)
	wantKind(t, "SetMembers of a missing lb", err, kerrors.NotFound)
	udp := []capi.Listener{{Protocol: "UDP", Port: 53}}
	got = must[capi.LoadBalancer](t)(c.UpdateLoadBalancer(ctx, "p", "a", capi.LoadBalancerUpdate{Listeners: &udp,
		SessionPersistence: &capi.SessionPersistence{Type: "SOURCE_IP"}}))
	if len(got.Listeners) != 1 || got.Listeners[0].Protocol != "UDP" || got.SessionPersistence == nil ||
		got.SessionPersistence.Timeout != 10800 || got.VIPAddress != "10.96.0.10" || len(got.Members) != 2 {
		t.Fatalf("after update: %+v", got)
	}
	got = must[capi.LoadBalancer](t)(c.UpdateLoadBalancer(ctx, "p", "a", capi.LoadBalancerUpdate{ClearSessionPersistence: true}))
	if got.SessionPersistence != nil {
		t.Fatalf("persistence not cleared: %+v", got.SessionPersistence)
	}
	lbs := must[[]capi.LoadBalancer](t)(c.ListLoadBalancers(ctx, "p"))
	if len(lbs) != 2 {
		t.Fatalf("%d load balancers", len(lbs))
	}
	// A deleted load balancer's VIP can be taken again.
	wantKind(t, "delete a", c.DeleteLoadBalancer(ctx, "p", "a"), nil)
	wantKind(t, "delete a again", c.DeleteLoadBalancer(ctx, "p", "a"), kerrors.NotFound)
	must[[]capi.LoadBalancer](t)(c.CreateLoadBalancers(ctx, "p", []capi.LoadBalancer{lb("c", "10.96.0.10")}))
}

func TestFloatingIPs(t *testing.T) {
	c := testCore(t)
	ctx := context.Background()
	lbNetwork(t, c)
	must[capi.ExternalNetwork](t)(c.CreateExternalNetwork(ctx, capi.ExternalNetwork{ID: "pub", CIDR: "192.0.2.0/29"}))
	_, err := c.CreateExternalNetwork(ctx, capi.ExternalNetwork{ID: "pub2", CIDR: "192.0.2.4/30"})
	wantKind(t, "overlapping external network", err, kerrors.Conflict)
	must[[]capi.LoadBalancer](t)(c.CreateLoadBalancers(ctx, "p", []capi.LoadBalancer{
		{ID: "lb1", VIPSubnetID: "svc", Listeners: []capi.Listener{{Protocol: "TCP", Port: 80}}}}))
	port := must[[]capi.Port](t)(c.CreatePorts(ctx, "p", []capi.Port{{ID: "port1", NetworkID: "s"}}))[0]

	f1 := must[capi.FloatingIP](t)(c.CreateFloatingIP(ctx, "p", capi.FloatingIP{ID: "f1", FloatingNetworkID: "pub", LoadBalancerID: "lb1"}))
	if !netip.MustParsePrefix("192.0.2.0/29").Contains(netip.MustParseAddr(f1.FloatingIPAddress)) || f1.LoadBalancerID != "lb1" || f1.VPCID != "v" {
		t.Fatalf("floating ip %+v", f1)
	}
	for _, tc := range []struct {
		name string
		f    capi.FloatingIP
		want error
	}{
		{"id taken", capi.FloatingIP{ID: "f1", FloatingNetworkID: "pub"}, kerrors.Conflict},
		{"address taken", capi.FloatingIP{ID: "f9", FloatingNetworkID: "pub", FloatingIPAddress: f1.FloatingIPAddress}, kerrors.Conflict},
		{"address outside", capi.FloatingIP{ID: "f9", FloatingNetworkID: "pub", FloatingIPAddress: "198.51.100.1"}, kerrors.Invalid},
		{"network missing", capi.FloatingIP{ID: "f9", FloatingNetworkID: "nope"}, kerrors.NotFound},
		{"lb already has one", capi.FloatingIP{ID: "f9", FloatingNetworkID: "pub", LoadBalancerID: "lb1"}, kerrors.Conflict},
		{"lb missing", capi.FloatingIP{ID: "f9", FloatingNetworkID: "pub", LoadBalancerID: "nope"}, kerrors.NotFound},
		{"both port and lb", capi.FloatingIP{ID: "f9", FloatingNetworkID: "pub", LoadBalancerID: "lb1", PortID: "port1"}, kerrors.Invalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.CreateFloatingIP(ctx, "p", tc.f)
			wantKind(t, "CreateFloatingIP", err, tc.want)
			if _, err := c.GetFloatingIP(ctx, "p", "f9"); !errors.Is(err, kerrors.NotFound) {
				t.Fatalf("refused request left f9: %v", err)
			}
		})
	}
	// Move f1 to the port, then take the rest of the range.
	f1 = must[capi.FloatingIP](t)(c.AssociateFloatingIP(ctx, "p", "f1", capi.FloatingIPAssociation{PortID: port.ID}))
	if f1.PortID != "port1" || f1.LoadBalancerID != "" || f1.FixedIPAddress != port.FixedIPs[0].IPAddress {
		t.Fatalf("after associate: %+v", f1)
	}
	_, err = c.AssociateFloatingIP(ctx, "p", "zz", capi.FloatingIPAssociation{PortID: port.ID})
	wantKind(t, "associate a missing floating ip", err, kerrors.NotFound)
	n := 1
	for ; ; n++ {
		_, err := c.CreateFloatingIP(ctx, "p", capi.FloatingIP{ID: fmt.Sprint("g", n), FloatingNetworkID: "pub"})
		if errors.Is(err, kerrors.Exhausted) {
			break
		}
		if err != nil || n > 8 {
			t.Fatalf("floating ip %d: %v", n, err)
		}
	}
	if n != 5 { // a /29 has 5 addresses besides network, gateway, broadcast; f1 holds one
		t.Fatalf("exhausted at %d, want 5", n)
	}
	wantKind(t, "delete the external network while in use", c.DeleteExternalNetwork(ctx, "pub"), kerrors.Conflict)
	wantKind(t, "delete the project while it holds floating ips", c.DeleteProject(ctx, "p"), kerrors.Conflict)
	fips := must[[]capi.FloatingIP](t)(c.ListFloatingIPs(ctx, "p"))
	for _, f := range fips {
		wantKind(t, "delete "+f.ID, c.DeleteFloatingIP(ctx, "p", f.ID), nil)
	}
	wantKind(t, "delete a missing floating ip", c.DeleteFloatingIP(ctx, "p", "f1"), kerrors.NotFound)
	wantKind(t, "delete the external network", c.DeleteExternalNetwork(ctx, "pub"), nil)
}

// TestNormalize: the request normalisers refuse bad input with Invalid
// and fill defaults, without a store.
func TestNormalize(t *testing.T) {
	for _, tc := range []struct {
		name string
		p    capi.Port
		want error
	}{
		{"ok", capi.Port{ID: "a", NetworkID: "s"}, nil},
		{"new id", capi.Port{NetworkID: "s"}, nil},
		{"bad id", capi.Port{ID: "../a", NetworkID: "s"}, kerrors.Invalid},
		{"other project", capi.Port{ID: "a", NetworkID: "s", ProjectID: "q"}, kerrors.Invalid},
		{"no subnet", capi.Port{ID: "a"}, kerrors.Invalid},
		{"two addresses", capi.Port{ID: "a", NetworkID: "s", FixedIPs: []capi.FixedIP{{IPAddress: "10.0.1.5"}, {IPAddress: "10.0.1.6"}}}, kerrors.Invalid},
	} {
		t.Run("port "+tc.name, func(t *testing.T) {
			p := tc.p
			err := NormalizePort("p", &p)
			wantKind(t, "NormalizePort", err, tc.want)
			if err == nil && (p.ID == "" || p.ProjectID != "p") {
				t.Fatalf("normalised %+v", p)
			}
		})
	}
	for _, tc := range []struct {
		name string
		u    capi.PortStatusUpdate
		want error
	}{
		{"up", capi.PortStatusUpdate{Status: capi.StatusUp}, nil},
		{"down with reason", capi.PortStatusUpdate{Status: capi.StatusDown, StatusReason: "unplugged"}, nil},
		{"unknown", capi.PortStatusUpdate{Status: "up"}, kerrors.Invalid},
	} {
		t.Run("status "+tc.name, func(t *testing.T) {
			wantKind(t, "ValidStatus", ValidStatus(tc.u), tc.want)
		})
	}
}
