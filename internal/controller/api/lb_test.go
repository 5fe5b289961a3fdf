package api_test

import (
	"errors"
	"fmt"
	"iter"
	"net/http"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"

	"kurma.dev/kurma/internal/controller/store/boltstore"
	capi "kurma.dev/kurma/pkg/controllerapi"
	"kurma.dev/kurma/pkg/kerrors"
)

// lbEnv is newEnv (project p1, VPC v1 with cidr 10.20.0.0/16, subnet s1
// 10.20.0.0/24) plus a service subnet "svc" (10.96.0.0/24) and an
// external network "ext" (192.0.2.0/28).
func lbEnv(t *testing.T) *env {
	t.Helper()
	e := newServer(t, boltStore(t), "")
	lbSetup(t, e)
	return e
}

func lbSetup(t *testing.T, e *env) {
	t.Helper()
	ctx := t.Context()
	if _, err := e.cli.CreateProject(ctx, capi.Project{ID: "p1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.cli.CreateVPC(ctx, "p1", capi.VPC{ID: "v1", CIDR: "10.20.0.0/16"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.cli.CreateSubnet(ctx, "p1", capi.Subnet{ID: "s1", NetworkID: "v1", CIDR: "10.20.0.0/24"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.cli.CreateSubnet(ctx, "p1", capi.Subnet{ID: "svc", NetworkID: "v1", CIDR: "10.96.0.0/24", Purpose: capi.SubnetPurposeService}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.cli.CreateExternalNetwork(ctx, capi.ExternalNetwork{ID: "ext", CIDR: "192.0.2.0/28"}); err != nil {
		t.Fatal(err)
	}
	e.pid = "p1"
}

func web(id string) capi.LoadBalancer {
	return capi.LoadBalancer{ID: id, VIPSubnetID: "svc",
		Listeners: []capi.Listener{{Protocol: "TCP", Port: 80, TargetPort: 8080}, {Protocol: "UDP", Port: 53}},
		Members:   []capi.Member{{Address: "10.20.0.5"}, {Address: "10.20.0.6", Port: 9090}}}
}

func TestLoadBalancerLifecycle(t *testing.T) {
	e := lbEnv(t)
	ctx := t.Context()
	lb, err := e.cli.CreateLoadBalancer(ctx, "p1", web("web"))
	if err != nil {
		t.Fatal(err)
	}
	if lb.VIPAddress != "10.96.0.2" || lb.VPCID != "v1" || lb.VNI == 0 || lb.ProvisioningStatus != capi.ProvisioningActive ||
		lb.OperatingStatus != capi.OperatingOnline || lb.Listeners[1].TargetPort != 53 || lb.RevisionNumber == 0 {
		t.Fatalf("created %+v", lb)
	}
	// Explicit VIP: honoured; taken: 409; outside the subnet: 400.
	x := web("x")
	x.VIPAddress = "10.96.0.50"
	if got, err := e.cli.CreateLoadBalancer(ctx, "p1", x); err != nil || got.VIPAddress != "10.96.0.50" {
		t.Fatalf("explicit vip: %+v, %v", got, err)
	}
	y := web("y")
	y.VIPAddress = "10.96.0.50"
	if _, err := e.cli.CreateLoadBalancer(ctx, "p1", y); !errors.Is(err, kerrors.Conflict) {
		t.Fatalf("taken vip: %v, want Conflict", err)
	}
	y.VIPAddress = "10.97.0.1"
	if _, err := e.cli.CreateLoadBalancer(ctx, "p1", y); !errors.Is(err, kerrors.Invalid) {
		t.Fatalf("vip outside subnet: %v, want Invalid", err)
	}
	// A VIP from the VPC's subnet of ports works too.
	z := web("z")
	z.VIPSubnetID = "s1"
	if got, err := e.cli.CreateLoadBalancer(ctx, "p1", z); err != nil || !strings.HasPrefix(got.VIPAddress, "10.20.0.") {
		t.Fatalf("vip from port subnet: %+v, %v", got, err)
	}
	// No port in a service subnet.
	if _, err := e.cli.CreatePort(ctx, "p1", capi.Port{NetworkID: "svc"}); !errors.Is(err, kerrors.Invalid) {
		t.Fatalf("port in service subnet: %v, want Invalid", err)
	}

	// Replace the members; an empty set makes it OFFLINE.
	got, err := e.cli.SetMembers(ctx, "p1", "web", []capi.Member{{Address: "10.20.0.9", Port: 81, PortID: "pod-9"}})
	if err != nil || len(got.Members) != 1 || got.Members[0].Address != "10.20.0.9" || got.RevisionNumber <= lb.RevisionNumber {
		t.Fatalf("set members: %+v, %v", got, err)
	}
	if got, err = e.cli.SetMembers(ctx, "p1", "web", nil); err != nil || len(got.Members) != 0 || got.OperatingStatus != capi.OperatingOffline {
		t.Fatalf("empty members: %+v, %v", got, err)
	}
	if _, err := e.cli.SetMembers(ctx, "p1", "web", []capi.Member{{Address: "10.30.0.1"}}); !errors.Is(err, kerrors.Invalid) || !strings.Contains(err.Error(), "members[0].address") {
		t.Fatalf("member outside vpc: %v, want Invalid naming members[0].address", err)
	}
	// Update listeners and persistence.
	name := "front"
	got, err = e.cli.UpdateLoadBalancer(ctx, "p1", "web", capi.LoadBalancerUpdate{Name: &name,
		Listeners:          &[]capi.Listener{{Protocol: "sctp", Port: 9}},
		SessionPersistence: &capi.SessionPersistence{Type: "SOURCE_IP"}})
	if err != nil || got.Name != "front" || got.Listeners[0].Protocol != "SCTP" || got.SessionPersistence.Timeout != 10800 || got.VIPAddress != lb.VIPAddress {
		t.Fatalf("update: %+v, %v", got, err)
	}
	if got, err = e.cli.UpdateLoadBalancer(ctx, "p1", "web", capi.LoadBalancerUpdate{ClearSessionPersistence: true}); err != nil || got.SessionPersistence != nil {
		t.Fatalf("clear persistence: %+v, %v", got, err)
	}

	all, err := e.cli.ListAllLoadBalancers(ctx)
	if err != nil || len(all) != 3 {
		t.Fatalf("list all: %d, %v", len(all), err)
	}
	// Delete frees the VIP: the next create gets it again.
	if err := e.cli.DeleteLoadBalancer(ctx, "p1", "web"); err != nil {
		t.Fatal(err)
	}
	if err := e.cli.DeleteLoadBalancer(ctx, "p1", "web"); !errors.Is(err, kerrors.NotFound) {
		t.Fatalf("second delete: %v, want NotFound", err)
	}
	again := web("web2")
	again.VIPAddress = lb.VIPAddress
	if got, err := e.cli.CreateLoadBalancer(ctx, "p1", again); err != nil || got.VIPAddress != lb.VIPAddress {
		t.Fatalf("freed vip not available: %+v, %v", got, err)
	}
	gw := web("gw")
	gw.VIPAddress = "10.96.0.1"
	if _, err := e.cli.CreateLoadBalancer(ctx, "p1", gw); !errors.Is(err, kerrors.Conflict) {
		t.Fatalf("gateway as vip: %v, want Conflict", err)
	}
	// A subnet holding VIPs cannot be deleted.
	if err := e.cli.DeleteSubnet(ctx, "p1", "svc"); !errors.Is(err, kerrors.Conflict) {
		t.Fatalf("delete svc subnet with VIPs: %v, want Conflict", err)
	}
}

func TestLoadBalancerBadInput(t *testing.T) {
	e := lbEnv(t)
	url := e.url + "/project/p1/loadbalancers"
	tests := []struct {
		name, body, field string
	}{
		{"unknown field", `{"loadbalancer":{"vip_subnet_id":"svc","bogus":1}}`, "bogus"},
		{"unknown field in listener", `{"loadbalancer":{"vip_subnet_id":"svc","listeners":[{"protocol":"TCP","port":1,"weight":3}]}}`, "weight"},
		{"no subnet", `{"loadbalancer":{}}`, "vip_subnet_id"},
		{"bad vip", `{"loadbalancer":{"vip_subnet_id":"svc","vip_address":"10.96.0.300"}}`, "vip_address"},
		{"vip is the network address", `{"loadbalancer":{"vip_subnet_id":"svc","vip_address":"10.96.0.0"}}`, "vip_address"},
		{"bad protocol", `{"loadbalancer":{"vip_subnet_id":"svc","listeners":[{"protocol":"ICMP","port":1}]}}`, "listeners[0].protocol"},
		{"port 0", `{"loadbalancer":{"vip_subnet_id":"svc","listeners":[{"protocol":"TCP","port":0}]}}`, "listeners[0].port"},
		{"port too big", `{"loadbalancer":{"vip_subnet_id":"svc","listeners":[{"protocol":"TCP","port":80,"target_port":70000}]}}`, "listeners[0].target_port"},
		{"duplicate listener", `{"loadbalancer":{"vip_subnet_id":"svc","listeners":[{"protocol":"TCP","port":80},{"protocol":"tcp","port":80}]}}`, "listeners[1]"},
		{"bad member", `{"loadbalancer":{"vip_subnet_id":"svc","members":[{"address":"x"}]}}`, "members[0].address"},
		{"member outside vpc", `{"loadbalancer":{"vip_subnet_id":"svc","members":[{"address":"10.20.0.5"},{"address":"10.21.0.0"}]}}`, "members[1].address"},
		{"member port", `{"loadbalancer":{"vip_subnet_id":"svc","members":[{"address":"10.20.0.5","port":-1}]}}`, "members[0].port"},
		{"duplicate member", `{"loadbalancer":{"vip_subnet_id":"svc","members":[{"address":"10.20.0.5"},{"address":"10.20.0.5"}]}}`, "members[1]"},
		{"persistence type", `{"loadbalancer":{"vip_subnet_id":"svc","session_persistence":{"type":"COOKIE"}}}`, "session_persistence.type"},
		{"persistence timeout", `{"loadbalancer":{"vip_subnet_id":"svc","session_persistence":{"type":"SOURCE_IP","timeout":100000}}}`, "session_persistence.timeout"},
		{"wrong type", `{"loadbalancer":{"vip_subnet_id":"svc","listeners":[{"protocol":"TCP","port":"80"}]}}`, "loadbalancer.listeners.port"},
		{"bulk with one bad", `{"loadbalancers":[{"id":"ok","vip_subnet_id":"svc"},{"vip_subnet_id":"svc","listeners":[{"protocol":"TCP","port":99999}]}]}`, "listeners[0].port"},
		{"bad id", `{"loadbalancer":{"id":"a/b","vip_subnet_id":"svc"}}`, "loadbalancer id"},
		{"ipv6 vip", `{"loadbalancer":{"vip_subnet_id":"svc","vip_address":"fd00::1"}}`, "only IPv4"},
		{"ipv6 member", `{"loadbalancer":{"vip_subnet_id":"svc","members":[{"address":"fd00::5","external":true}]}}`, "members[0].address"},
		{"loopback external member", `{"loadbalancer":{"vip_subnet_id":"svc","members":[{"address":"127.0.0.1","external":true}]}}`, "members[0].address"},
		{"member of a missing listener", `{"loadbalancer":{"vip_subnet_id":"svc","listeners":[{"protocol":"TCP","port":80}],"members":[{"address":"10.20.0.5","listeners":["TCP/81"]}]}}`, "TCP/81"},
		{"bad listener name", `{"loadbalancer":{"vip_subnet_id":"svc","listeners":[{"protocol":"TCP","port":80}],"members":[{"address":"10.20.0.5","listeners":["TCP:80"]}]}}`, "members[0].listeners[0]"},
		{"member twice for one listener", `{"loadbalancer":{"vip_subnet_id":"svc","listeners":[{"protocol":"TCP","port":80},{"protocol":"TCP","port":81}],"members":[{"address":"10.20.0.5","listeners":["TCP/80","TCP/81"]},{"address":"10.20.0.5","listeners":["TCP/81"]}]}}`, "members[1]"},
		{"node port twice", `{"loadbalancer":{"vip_subnet_id":"svc","listeners":[{"protocol":"TCP","port":80,"node_port":30000},{"protocol":"TCP","port":81,"node_port":30000}]}}`, "listeners[1].node_port"},
		{"node port range", `{"loadbalancer":{"vip_subnet_id":"svc","listeners":[{"protocol":"TCP","port":80,"node_port":65536}]}}`, "listeners[0].node_port"},
		{"external address", `{"loadbalancer":{"vip_subnet_id":"svc","external_addresses":["224.0.0.1"]}}`, "external_addresses[0]"},
		{"health check without local", `{"loadbalancer":{"vip_subnet_id":"svc","health_check_node_port":31000}}`, "health_check_node_port"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, body := raw(t, http.MethodPost, url, tt.body)
			if code != http.StatusBadRequest || errType(body) != "Invalid" || !strings.Contains(body, tt.field) {
				t.Fatalf("status %d body %s; want 400 naming %s", code, body, tt.field)
			}
		})
	}
	// Nothing was stored: no load balancer, and the first free VIP is
	// still the first one of the subnet.
	if all, err := e.cli.ListLoadBalancers(t.Context(), "p1"); err != nil || len(all) != 0 {
		t.Fatalf("after bad input: %d load balancers, %v", len(all), err)
	}
	if lb, err := e.cli.CreateLoadBalancer(t.Context(), "p1", web("w")); err != nil || lb.VIPAddress != "10.96.0.2" {
		t.Fatalf("after bad input: %+v, %v", lb, err)
	}
	// Members body: must be {"members":[...]}.
	for _, b := range []string{`{}`, `{"members":[{"address":"10.20.0.5","x":1}]}`, `[]`} {
		code, body := raw(t, http.MethodPut, url+"/w/members", b)
		if code != http.StatusBadRequest {
			t.Fatalf("members body %s: %d %s", b, code, body)
		}
	}
}

func TestLoadBalancerBulk(t *testing.T) {
	e := lbEnv(t)
	ctx := t.Context()
	var lbs []capi.LoadBalancer
	for i := range 50 {
		lbs = append(lbs, web(fmt.Sprintf("b%02d", i)))
	}
	out, err := e.cli.CreateLoadBalancers(ctx, "p1", lbs)
	if err != nil || len(out) != 50 {
		t.Fatalf("bulk: %d, %v", len(out), err)
	}
	seen := map[string]bool{}
	for _, lb := range out {
		if seen[lb.VIPAddress] {
			t.Fatalf("vip %s twice", lb.VIPAddress)
		}
		seen[lb.VIPAddress] = true
	}
	// All or nothing: a duplicate id in the store fails the whole bulk.
	_, err = e.cli.CreateLoadBalancers(ctx, "p1", []capi.LoadBalancer{web("new1"), web("b07")})
	if !errors.Is(err, kerrors.Conflict) {
		t.Fatalf("bulk with existing id: %v, want Conflict", err)
	}
	if _, err := e.cli.GetLoadBalancer(ctx, "p1", "new1"); !errors.Is(err, kerrors.NotFound) {
		t.Fatalf("partial bulk stored new1: %v", err)
	}
}

func TestFloatingIPs(t *testing.T) {
	e := lbEnv(t)
	ctx := t.Context()
	port, err := e.cli.CreatePort(ctx, "p1", capi.Port{ID: "pod", NetworkID: "s1"})
	if err != nil {
		t.Fatal(err)
	}
	lb, err := e.cli.CreateLoadBalancer(ctx, "p1", web("web"))
	if err != nil {
		t.Fatal(err)
	}
	f, err := e.cli.CreateFloatingIP(ctx, "p1", capi.FloatingIP{ID: "f1", FloatingNetworkID: "ext", FloatingIPAddress: "192.0.2.9", PortID: "pod"})
	if err != nil || f.FloatingIPAddress != "192.0.2.9" || f.FixedIPAddress != port.FixedIPs[0].IPAddress || f.Status != capi.FIPActive || f.VPCID != "v1" {
		t.Fatalf("create with port: %+v, %v", f, err)
	}
	if _, err := e.cli.CreateFloatingIP(ctx, "p1", capi.FloatingIP{FloatingNetworkID: "ext", FloatingIPAddress: "192.0.2.9"}); !errors.Is(err, kerrors.Conflict) {
		t.Fatalf("taken address: %v, want Conflict", err)
	}
	if _, err := e.cli.CreateFloatingIP(ctx, "p1", capi.FloatingIP{FloatingNetworkID: "ext", FloatingIPAddress: "198.51.100.1"}); !errors.Is(err, kerrors.Invalid) {
		t.Fatalf("address outside: %v, want Invalid", err)
	}
	// One floating IP per port.
	f2, err := e.cli.CreateFloatingIP(ctx, "p1", capi.FloatingIP{ID: "f2", FloatingNetworkID: "ext"})
	if err != nil || f2.FloatingIPAddress != "192.0.2.2" || f2.Status != capi.FIPDown {
		t.Fatalf("allocate: %+v, %v", f2, err)
	}
	if _, err := e.cli.AssociateFloatingIP(ctx, "p1", "f2", capi.FloatingIPAssociation{PortID: "pod"}); !errors.Is(err, kerrors.Conflict) {
		t.Fatalf("second fip on a port: %v, want Conflict", err)
	}
	if got, err := e.cli.AssociateFloatingIP(ctx, "p1", "f2", capi.FloatingIPAssociation{LoadBalancerID: "web"}); err != nil || got.FixedIPAddress != lb.VIPAddress || got.LoadBalancerID != "web" {
		t.Fatalf("associate lb: %+v, %v", got, err)
	}
	if _, err := e.cli.AssociateFloatingIP(ctx, "p1", "f2", capi.FloatingIPAssociation{PortID: "nope"}); !errors.Is(err, kerrors.NotFound) {
		t.Fatalf("associate unknown port: %v, want NotFound", err)
	}
	// Deleting the port and the load balancer disassociates.
	if err := e.cli.DeletePort(ctx, "p1", "pod"); err != nil {
		t.Fatal(err)
	}
	if err := e.cli.DeleteLoadBalancer(ctx, "p1", "web"); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"f1", "f2"} {
		got, err := e.cli.GetFloatingIP(ctx, "p1", id)
		if err != nil || got.PortID != "" || got.LoadBalancerID != "" || got.FixedIPAddress != "" || got.Status != capi.FIPDown {
			t.Fatalf("%s after target deleted: %+v, %v", id, got, err)
		}
	}
	// Re-associate after disassociation, then disassociate explicitly.
	p2, err := e.cli.CreatePort(ctx, "p1", capi.Port{ID: "pod2", NetworkID: "s1"})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := e.cli.AssociateFloatingIP(ctx, "p1", "f1", capi.FloatingIPAssociation{PortID: "pod2"}); err != nil || got.FixedIPAddress != p2.FixedIPs[0].IPAddress {
		t.Fatalf("associate: %+v, %v", got, err)
	}
	if got, err := e.cli.DisassociateFloatingIP(ctx, "p1", "f1"); err != nil || got.PortID != "" {
		t.Fatalf("disassociate: %+v, %v", got, err)
	}
	// The external network cannot go while it holds floating IPs.
	if err := e.cli.DeleteExternalNetwork(ctx, "ext"); !errors.Is(err, kerrors.Conflict) {
		t.Fatalf("delete busy external network: %v, want Conflict", err)
	}
	if err := e.cli.DeleteProject(ctx, "p1"); !errors.Is(err, kerrors.Conflict) {
		t.Fatalf("delete project with fips: %v, want Conflict", err)
	}
	for _, id := range []string{"f1", "f2"} {
		if err := e.cli.DeleteFloatingIP(ctx, "p1", id); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.cli.DeleteExternalNetwork(ctx, "ext"); err != nil {
		t.Fatal(err)
	}
	// Bad input names the field.
	code, body := raw(t, http.MethodPost, e.url+"/project/p1/floatingips", `{"floatingip":{"floating_network_id":"ext","port_id":"a","loadbalancer_id":"b"}}`)
	if code != http.StatusBadRequest || !strings.Contains(body, "port_id or loadbalancer_id") {
		t.Fatalf("both targets: %d %s", code, body)
	}
	code, body = raw(t, http.MethodPost, e.url+"/external-networks", `{"external_network":{"cidr":"203.0.113.0/24","pool":1}}`)
	if code != http.StatusBadRequest || !strings.Contains(body, "pool") {
		t.Fatalf("unknown field: %d %s", code, body)
	}
}

// TestFloatingIPChurnLeavesNothing runs allocate/associate/disassociate/
// delete cycles and checks nothing stays behind in the store.
func TestFloatingIPChurnLeavesNothing(t *testing.T) {
	e := lbEnv(t)
	ctx := t.Context()
	if _, err := e.cli.CreatePort(ctx, "p1", capi.Port{ID: "pod", NetworkID: "s1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.cli.CreateLoadBalancer(ctx, "p1", web("web")); err != nil {
		t.Fatal(err)
	}
	for i := range 200 {
		f, err := e.cli.CreateFloatingIP(ctx, "p1", capi.FloatingIP{FloatingNetworkID: "ext"})
		if err != nil {
			t.Fatal(err)
		}
		a := capi.FloatingIPAssociation{PortID: "pod"}
		if i%2 == 1 {
			a = capi.FloatingIPAssociation{LoadBalancerID: "web"}
		}
		if _, err := e.cli.AssociateFloatingIP(ctx, "p1", f.ID, a); err != nil {
			t.Fatal(err)
		}
		if i%3 != 0 {
			if _, err := e.cli.DisassociateFloatingIP(ctx, "p1", f.ID); err != nil {
				t.Fatal(err)
			}
		}
		if err := e.cli.DeleteFloatingIP(ctx, "p1", f.ID); err != nil {
			t.Fatal(err)
		}
	}
	for _, prefix := range []string{"svc/fip/", "fipref/", "ipamx/"} {
		kvs, _, err := e.st.List(ctx, prefix)
		if err != nil || len(kvs) != 0 {
			t.Fatalf("%d keys left under %s (%v)", len(kvs), prefix, err)
		}
	}
}

// TestAssociateRacesDelete: associations racing the deletion of their
// target never leave a floating IP pointing at a deleted port.
func TestAssociateRacesDelete(t *testing.T) {
	e := lbEnv(t)
	ctx := t.Context()
	f, err := e.cli.CreateFloatingIP(ctx, "p1", capi.FloatingIP{ID: "f", FloatingNetworkID: "ext"})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 30 {
		id := fmt.Sprintf("p%d", i)
		if _, err := e.cli.CreatePort(ctx, "p1", capi.Port{ID: id, NetworkID: "s1"}); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		wg.Go(func() { _, _ = e.cli.AssociateFloatingIP(ctx, "p1", f.ID, capi.FloatingIPAssociation{PortID: id}) })
		wg.Go(func() {
			if err := e.cli.DeletePort(ctx, "p1", id); err != nil {
				t.Error(err)
			}
		})
		wg.Wait()
		got, err := e.cli.GetFloatingIP(ctx, "p1", f.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.PortID != "" {
			t.Fatalf("round %d: floating IP points at deleted port %s", i, got.PortID)
		}
	}
	if refs, _, _ := e.st.List(ctx, "fipref/"); len(refs) != 0 {
		t.Fatalf("%d references left", len(refs))
	}
}

func TestWatchLoadBalancers(t *testing.T) {
	e := lbEnv(t)
	ctx := t.Context()
	if _, err := e.cli.CreateLoadBalancer(ctx, "p1", web("a")); err != nil {
		t.Fatal(err)
	}
	if _, err := e.cli.CreateFloatingIP(ctx, "p1", capi.FloatingIP{ID: "f", FloatingNetworkID: "ext", LoadBalancerID: "a"}); err != nil {
		t.Fatal(err)
	}
	pull, stop := iter.Pull2(e.cli.WatchLoadBalancers(ctx, 0))
	defer stop()
	var gotLB, gotFIP bool
	for range 2 {
		ev := next(t, pull)
		switch {
		case ev.Type == capi.EventAdded && ev.LoadBalancer != nil && ev.LoadBalancer.ID == "a":
			gotLB = true
		case ev.Type == capi.EventAdded && ev.FloatingIP != nil && ev.FloatingIP.FixedIPAddress != "":
			gotFIP = true
		default:
			t.Fatalf("replay = %+v", ev)
		}
	}
	if !gotLB || !gotFIP {
		t.Fatal("replay misses the load balancer or the floating IP")
	}
	if ev := next(t, pull); ev.Type != capi.EventSynced {
		t.Fatalf("want SYNCED, got %+v", ev)
	}
	if _, err := e.cli.SetMembers(ctx, "p1", "a", []capi.Member{{Address: "10.20.0.7"}}); err != nil {
		t.Fatal(err)
	}
	if ev := next(t, pull); ev.Type != capi.EventModified || ev.LoadBalancer == nil || len(ev.LoadBalancer.Members) != 1 {
		t.Fatalf("members event = %+v", ev)
	}
	// Deleting the load balancer: one transaction, so the floating IP's
	// disassociation and the deletion arrive with the same revision.
	if err := e.cli.DeleteLoadBalancer(ctx, "p1", "a"); err != nil {
		t.Fatal(err)
	}
	ev1, ev2 := next(t, pull), next(t, pull)
	if ev1.Revision != ev2.Revision {
		t.Fatalf("delete events at revisions %d and %d", ev1.Revision, ev2.Revision)
	}
	for _, ev := range []capi.Event{ev1, ev2} {
		switch {
		case ev.LoadBalancer != nil && ev.Type == capi.EventDeleted:
		case ev.FloatingIP != nil && ev.Type == capi.EventModified && ev.FloatingIP.LoadBalancerID == "":
		default:
			t.Fatalf("unexpected event %+v", ev)
		}
	}
}

func TestLoadBalancersSurviveRestart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lb.db")
	st1, err := boltstore.Open(path, boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	e1 := newServer(t, st1, "")
	lbSetup(t, e1)
	ctx := t.Context()
	vips := map[string]bool{}
	for i := range 5 {
		lb, err := e1.cli.CreateLoadBalancer(ctx, "p1", web(fmt.Sprintf("r%d", i)))
		if err != nil {
			t.Fatal(err)
		}
		vips[lb.VIPAddress] = true
	}
	f, err := e1.cli.CreateFloatingIP(ctx, "p1", capi.FloatingIP{FloatingNetworkID: "ext", LoadBalancerID: "r0"})
	if err != nil {
		t.Fatal(err)
	}
	if err := st1.Close(); err != nil {
		t.Fatal(err)
	}
	st2, err := boltstore.Open(path, boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st2.Close() })
	e2 := newServer(t, st2, "")
	lbs, err := e2.cli.ListAllLoadBalancers(ctx)
	if err != nil || len(lbs) != 5 {
		t.Fatalf("%d load balancers after restart (%v)", len(lbs), err)
	}
	for i := range 5 {
		lb, err := e2.cli.CreateLoadBalancer(ctx, "p1", web(fmt.Sprintf("n%d", i)))
		if err != nil {
			t.Fatal(err)
		}
		if vips[lb.VIPAddress] {
			t.Fatalf("vip %s handed out again after restart", lb.VIPAddress)
		}
	}
	f2, err := e2.cli.CreateFloatingIP(ctx, "p1", capi.FloatingIP{FloatingNetworkID: "ext"})
	if err != nil || f2.FloatingIPAddress == f.FloatingIPAddress {
		t.Fatalf("fip after restart: %+v, %v (first was %s)", f2, err, f.FloatingIPAddress)
	}
	if got, err := e2.cli.GetFloatingIP(ctx, "p1", f.ID); err != nil || got.LoadBalancerID != "r0" {
		t.Fatalf("association after restart: %+v, %v", got, err)
	}
}

func TestLoadBalancersTwoReplicasOnEtcd(t *testing.T) {
	rs := replicas(t, 2)
	lbSetup(t, rs[0])
	ctx := t.Context()
	// A /26 service subnet: 61 VIPs; the external network: 13 addresses.
	if _, err := rs[0].cli.CreateSubnet(ctx, "p1", capi.Subnet{ID: "svc2", NetworkID: "v1", CIDR: "10.97.0.0/26", Purpose: capi.SubnetPurposeService}); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	vips, fips := map[string]string{}, map[string]string{}
	var wg sync.WaitGroup
	for w := range 6 {
		c := rs[w%2].cli
		wg.Go(func() {
			for i := 0; ; i++ {
				lb := web(fmt.Sprintf("w%d-%d", w, i))
				lb.VIPSubnetID = "svc2"
				got, err := c.CreateLoadBalancer(ctx, "p1", lb)
				if errors.Is(err, kerrors.Exhausted) {
					return
				}
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				if prev, dup := vips[got.VIPAddress]; dup {
					t.Errorf("vip %s given to %s and %s", got.VIPAddress, prev, got.ID)
				}
				vips[got.VIPAddress] = got.ID
				mu.Unlock()
			}
		})
		wg.Go(func() {
			for {
				got, err := c.CreateFloatingIP(ctx, "p1", capi.FloatingIP{FloatingNetworkID: "ext"})
				if errors.Is(err, kerrors.Exhausted) {
					return
				}
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				if prev, dup := fips[got.FloatingIPAddress]; dup {
					t.Errorf("fip %s given to %s and %s", got.FloatingIPAddress, prev, got.ID)
				}
				fips[got.FloatingIPAddress] = got.ID
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(vips) != 61 || len(fips) != 13 {
		t.Fatalf("handed out %d vips (want 61) and %d fips (want 13)", len(vips), len(fips))
	}
}

// TestLoadBalancerPolicy: host-level frontends, traffic policies, members
// per listener and external members round-trip in canonical form; an
// update replaces the policy; a member replacement is checked against
// the stored listeners.
func TestLoadBalancerPolicy(t *testing.T) {
	e := lbEnv(t)
	ctx := t.Context()
	in := capi.LoadBalancer{ID: "np", VIPSubnetID: "svc",
		Listeners: []capi.Listener{{Protocol: "udp", Port: 53, NodePort: 30053}, {Protocol: "TCP", Port: 80, NodePort: 30080}},
		Members: []capi.Member{
			{Address: "10.20.0.6", Port: 8080, Listeners: []string{"tcp/80"}, HostID: "h2", Backup: true},
			{Address: "192.0.2.10", Port: 6443, External: true, Listeners: []string{"TCP/80", "UDP/53", "TCP/80"}},
			{Address: "10.20.0.5", Port: 5353, Listeners: []string{"UDP/53"}},
		},
		Policy: capi.Policy{HostAccess: true, ExternalAddresses: []string{"198.51.100.9", "198.51.100.1", "198.51.100.9"},
			ExternalLocal: true, HealthCheckNodePort: 31000}}
	got, err := e.cli.CreateLoadBalancer(ctx, "p1", in)
	if err != nil {
		t.Fatal(err)
	}
	wantLs := []capi.Listener{{Protocol: "TCP", Port: 80, TargetPort: 80, NodePort: 30080}, {Protocol: "UDP", Port: 53, TargetPort: 53, NodePort: 30053}}
	wantMs := []capi.Member{
		{Address: "10.20.0.5", Port: 5353, Listeners: []string{"UDP/53"}},
		{Address: "10.20.0.6", Port: 8080, Listeners: []string{"TCP/80"}, HostID: "h2", Backup: true},
		{Address: "192.0.2.10", Port: 6443, External: true, Listeners: []string{"TCP/80", "UDP/53"}},
	}
	wantPol := capi.Policy{HostAccess: true, ExternalAddresses: []string{"198.51.100.1", "198.51.100.9"}, ExternalLocal: true, HealthCheckNodePort: 31000}
	if !reflect.DeepEqual(got.Listeners, wantLs) || !reflect.DeepEqual(got.Members, wantMs) || !reflect.DeepEqual(got.Policy, wantPol) {
		t.Fatalf("stored\n %+v\n %+v\n %+v\nwant\n %+v\n %+v\n %+v", got.Listeners, got.Members, got.Policy, wantLs, wantMs, wantPol)
	}
	if !got.HasHostFrontends() {
		t.Fatal("node ports and host access are host-level frontends")
	}
	pol := capi.Policy{InternalLocal: true}
	if got, err = e.cli.UpdateLoadBalancer(ctx, "p1", "np", capi.LoadBalancerUpdate{Policy: &pol}); err != nil || !reflect.DeepEqual(got.Policy, pol) {
		t.Fatalf("policy update: %+v, %v", got, err)
	}
	if _, err := e.cli.SetMembers(ctx, "p1", "np", []capi.Member{{Address: "10.20.0.5", Listeners: []string{"TCP/81"}}}); !errors.Is(err, kerrors.Invalid) {
		t.Fatalf("members of a missing listener: %v, want Invalid", err)
	}
	// Listeners that drop one its members name: refused, nothing changes.
	ls := []capi.Listener{{Protocol: "TCP", Port: 80}}
	if _, err := e.cli.UpdateLoadBalancer(ctx, "p1", "np", capi.LoadBalancerUpdate{Listeners: &ls}); !errors.Is(err, kerrors.Invalid) {
		t.Fatalf("listener named by members removed: %v, want Invalid", err)
	}
	if got, err := e.cli.GetLoadBalancer(ctx, "p1", "np"); err != nil || !reflect.DeepEqual(got.Listeners, wantLs) {
		t.Fatalf("after the refused update: %+v, %v", got, err)
	}
}
