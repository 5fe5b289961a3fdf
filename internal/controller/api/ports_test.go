package api_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	capi "kurma.dev/kurma/pkg/controllerapi"
	"kurma.dev/kurma/pkg/kerrors"
)

// The two bodies spec 003 shows, verbatim apart from placeholders.
const specSingle = `{
    "port": {
        "project_id": "p1",
        "id": "cni-port-1",
        "name": "k8s_cni-port-1",
        "admin_state_up": true,
        "description": "cni sandbox1, ns:/var/run/netns/x, host:node1",
        "network_id": "s1",
        "veth_name": "eth0",
        "network_ns": "/var/run/netns/x",
        "dns_domain": "my-domain.org.",
        "dns_name": "myport",
        "port_security_enabled": false,
        "allowed_address_pairs": [ { } ],
        "binding:host_id": "node1",
        "binding:profile": null,
        "binding:vnic_type": "normal",
        "fast_path": true
    }
}`

const specBulk = `{
    "ports": [
        {
            "project_id": "p1", "id": "bulk-1", "name": "k8s_bulk-1", "admin_state_up": true,
            "description": "cni a", "network_id": "s1", "veth_name": "eth0",
            "veth_namespace": "/var/run/netns/a", "dns_domain": "my-domain.org.", "dns_name": "myport",
            "port_security_enabled": false, "allowed_address_pairs": [ { } ],
            "binding:host_id": "node1", "binding:profile": { }, "binding:vnic_type": "normal"
        },
        {
            "project_id": "p1", "id": "bulk-2", "name": "k8s_bulk-2", "admin_state_up": true,
            "description": "cni b", "network_id": "s1", "veth_name": "eth0",
            "veth_namespace": "/var/run/netns/b", "dns_domain": "my-domain.org.", "dns_name": "myport",
            "port_security_enabled": false, "allowed_address_pairs": [ { } ],
            "binding:host_id": "node2", "binding:profile": null, "binding:vnic_type": "normal", "fast_path": true
        }
    ]
}`

func TestSpecBodies(t *testing.T) {
	e := newEnv(t, "")
	code, body := raw(t, "POST", e.url+"/project/p1/ports", specSingle)
	if code != http.StatusCreated {
		t.Fatalf("single create = %d %s", code, body)
	}
	var one capi.PortBody
	if err := json.Unmarshal([]byte(body), &one); err != nil {
		t.Fatal(err)
	}
	p := one.Port
	if p.ID != "cni-port-1" || p.Status != capi.StatusPending || p.NetworkNS != "/var/run/netns/x" || p.VethNamespace != "/var/run/netns/x" ||
		p.BindingHostID != "node1" || p.DNSName != "myport" || p.FastPath == nil || !*p.FastPath || p.VPCID != "v1" || p.VNI != e.vpc.VNI ||
		p.RevisionNumber == 0 || p.CreatedAt.IsZero() {
		t.Fatalf("single port fields: %s", body)
	}
	if len(p.FixedIPs) != 1 || p.FixedIPs[0].SubnetID != "s1" || p.FixedIPs[0].IPAddress != "10.20.0.2" {
		t.Fatalf("fixed_ips %+v", p.FixedIPs)
	}
	hw, err := netParseMAC(p.MACAddress)
	if err != nil || hw[0]&0x02 == 0 || hw[0]&0x01 != 0 {
		t.Fatalf("mac %q is not locally administered unicast", p.MACAddress)
	}
	code, body = raw(t, "POST", e.url+"/project/p1/ports", specBulk)
	if code != http.StatusCreated {
		t.Fatalf("bulk create = %d %s", code, body)
	}
	var bulk capi.PortsBody
	if err := json.Unmarshal([]byte(body), &bulk); err != nil || len(bulk.Ports) != 2 {
		t.Fatalf("bulk body %s (%v)", body, err)
	}
	if bulk.Ports[0].NetworkNS != "/var/run/netns/a" || bulk.Ports[1].BindingHostID != "node2" {
		t.Fatalf("bulk fields: %s", body)
	}
	// GET as the spec's plugin polls it, then the subnet query.
	got, err := e.cli.GetPort(t.Context(), "p1", "bulk-2")
	if err != nil || got.FixedIPs[0].IPAddress != bulk.Ports[1].FixedIPs[0].IPAddress {
		t.Fatalf("GetPort = %+v, %v", got, err)
	}
	sn, err := e.cli.GetSubnet(t.Context(), "p1", "s1")
	if err != nil || sn.CIDR != "10.20.0.0/24" || sn.GatewayIP != "10.20.0.1" {
		t.Fatalf("GetSubnet = %+v, %v", sn, err)
	}
	// network_id naming the VPC picks its only subnet.
	vp, err := e.cli.CreatePort(t.Context(), "p1", capi.Port{NetworkID: "v1"})
	if err != nil || vp.FixedIPs[0].SubnetID != "s1" {
		t.Fatalf("port on vpc = %+v, %v", vp, err)
	}
}

func TestPortConflicts(t *testing.T) {
	e := newEnv(t, "")
	ctx := t.Context()
	if _, err := e.cli.CreatePort(ctx, "p1", capi.Port{ID: "a", NetworkID: "s1", MACAddress: "02:00:00:00:00:0a", FixedIPs: []capi.FixedIP{{IPAddress: "10.20.0.50"}}}); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		port capi.Port
		want error
	}{
		{"duplicate id", capi.Port{ID: "a", NetworkID: "s1"}, kerrors.Conflict},
		{"address taken", capi.Port{ID: "b", NetworkID: "s1", FixedIPs: []capi.FixedIP{{IPAddress: "10.20.0.50"}}}, kerrors.Conflict},
		{"mac taken", capi.Port{ID: "c", NetworkID: "s1", MACAddress: "02:00:00:00:00:0A"}, kerrors.Conflict},
		{"subnet mismatch", capi.Port{ID: "d", NetworkID: "s1", FixedIPs: []capi.FixedIP{{SubnetID: "other"}}}, kerrors.Invalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := e.cli.CreatePort(ctx, "p1", tt.port); !errors.Is(err, tt.want) {
				t.Fatalf("CreatePort = %v, want %v", err, tt.want)
			}
		})
	}
	if n := len(listAll(t, e)); n != 1 {
		t.Fatalf("%d ports after conflicts, want 1", n)
	}
	// After deletion the requested address and MAC are free again.
	if err := e.cli.DeletePort(ctx, "p1", "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.cli.CreatePort(ctx, "p1", capi.Port{ID: "b", NetworkID: "s1", MACAddress: "02:00:00:00:00:0a", FixedIPs: []capi.FixedIP{{IPAddress: "10.20.0.50"}}}); err != nil {
		t.Fatalf("reuse after delete: %v", err)
	}
}

func TestBulkIsAtomic(t *testing.T) {
	e := newEnv(t, "")
	ctx := t.Context()
	if _, err := e.cli.CreatePort(ctx, "p1", capi.Port{ID: "taken", NetworkID: "s1", FixedIPs: []capi.FixedIP{{IPAddress: "10.20.0.9"}}}); err != nil {
		t.Fatal(err)
	}
	good := func(id string) capi.Port { return capi.Port{ID: id, NetworkID: "s1", BindingHostID: "h", Name: id} }
	tests := []struct {
		name string
		bad  capi.Port
		want error
	}{
		{"invalid field", capi.Port{ID: "x3", NetworkID: "s1", BindingVNICType: "warp"}, kerrors.Invalid},
		{"taken address", capi.Port{ID: "x3", NetworkID: "s1", FixedIPs: []capi.FixedIP{{IPAddress: "10.20.0.9"}}}, kerrors.Conflict},
		{"existing id", capi.Port{ID: "taken", NetworkID: "s1"}, kerrors.Conflict},
		{"unknown network", capi.Port{ID: "x3", NetworkID: "nowhere"}, kerrors.NotFound},
		{"id twice", good("x1"), kerrors.Invalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := e.cli.CreatePorts(ctx, "p1", []capi.Port{good("x1"), good("x2"), tt.bad})
			if !errors.Is(err, tt.want) {
				t.Fatalf("CreatePorts = %v, want %v", err, tt.want)
			}
			if ps := listAll(t, e); len(ps) != 1 {
				t.Fatalf("failed bulk left %d ports", len(ps))
			}
			if ps, _ := e.cli.ListPorts(ctx, "p1", capi.PortFilter{HostID: "h"}); len(ps) != 0 {
				t.Fatalf("failed bulk left index entries: %v", ps)
			}
		})
	}
	ps, err := e.cli.CreatePorts(ctx, "p1", []capi.Port{good("y1"), good("y2"), good("y3")})
	if err != nil || len(ps) != 3 {
		t.Fatalf("good bulk = %v, %v", ps, err)
	}
	// Addresses reserved by the failed bulks were not leaked: the /24 still
	// has exactly 253 - 4 addresses to give.
	n := 0
	for {
		_, err := e.cli.CreatePort(ctx, "p1", capi.Port{NetworkID: "s1"})
		if errors.Is(err, kerrors.Exhausted) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		n++
	}
	if n != 253-4 {
		t.Fatalf("%d addresses left after failed bulks, want %d", n, 253-4)
	}
}

func TestExhaustionAndReuse(t *testing.T) {
	e := newEnv(t, "10.9.0.0/29") // hosts .2-.6, gateway .1
	ctx := t.Context()
	seen := map[string]bool{}
	var ids []string
	for i := range 5 {
		p, err := e.cli.CreatePort(ctx, "p1", capi.Port{NetworkID: "s1"})
		if err != nil {
			t.Fatalf("port %d: %v", i, err)
		}
		ip := p.FixedIPs[0].IPAddress
		if seen[ip] || ip == "10.9.0.0" || ip == "10.9.0.1" || ip == "10.9.0.7" {
			t.Fatalf("bad or duplicate address %s", ip)
		}
		seen[ip] = true
		ids = append(ids, p.ID)
	}
	_, err := e.cli.CreatePort(ctx, "p1", capi.Port{NetworkID: "s1"})
	if !errors.Is(err, kerrors.Exhausted) {
		t.Fatalf("create in full subnet = %v, want Exhausted", err)
	}
	code, body := raw(t, "POST", e.url+"/project/p1/ports", `{"port":{"network_id":"s1"}}`)
	if code != http.StatusConflict || errType(body) != "Exhausted" {
		t.Fatalf("raw exhausted = %d %s", code, body)
	}
	if err := e.cli.DeletePort(ctx, "p1", ids[2]); err != nil {
		t.Fatal(err)
	}
	if err := e.cli.DeletePort(ctx, "p1", ids[2]); !errors.Is(err, kerrors.NotFound) {
		t.Fatalf("second delete = %v, want NotFound", err)
	}
	if _, err := e.cli.CreatePort(ctx, "p1", capi.Port{NetworkID: "s1"}); err != nil {
		t.Fatalf("create after release: %v", err)
	}
}

func TestConcurrentCreatesAreUnique(t *testing.T) {
	e := newEnv(t, "10.128.0.0/22")
	const workers, each = 12, 20
	var mu sync.Mutex
	ips, macs := map[string]string{}, map[string]string{}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				var ps []capi.Port
				var err error
				if i%4 == 0 {
					ps, err = e.cli.CreatePorts(t.Context(), "p1", []capi.Port{{NetworkID: "s1"}, {NetworkID: "s1"}})
				} else {
					var p *capi.Port
					p, err = e.cli.CreatePort(t.Context(), "p1", capi.Port{NetworkID: "s1", BindingHostID: fmt.Sprintf("h%d", w)})
					if p != nil {
						ps = []capi.Port{*p}
					}
				}
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				for _, p := range ps {
					ip := p.FixedIPs[0].IPAddress
					if prev, dup := ips[ip]; dup {
						t.Errorf("address %s given to %s and %s", ip, prev, p.ID)
					}
					if prev, dup := macs[p.MACAddress]; dup {
						t.Errorf("mac %s given to %s and %s", p.MACAddress, prev, p.ID)
					}
					ips[ip], macs[p.MACAddress] = p.ID, p.ID
					if !netip.MustParsePrefix("10.128.0.0/22").Contains(netip.MustParseAddr(ip)) {
						t.Errorf("address %s outside subnet", ip)
					}
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if n := len(listAll(t, e)); n != len(ips) {
		t.Fatalf("%d ports stored, %d addresses handed out", n, len(ips))
	}
	hp, err := e.cli.ListPorts(t.Context(), "p1", capi.PortFilter{HostID: "h3"})
	if err != nil || len(hp) != each-each/4 {
		t.Fatalf("ports on h3 = %d (%v), want %d", len(hp), err, each-each/4)
	}
}

func TestStatusAndLongPoll(t *testing.T) {
	e := newEnv(t, "")
	ctx := t.Context()
	if _, err := e.cli.CreatePort(ctx, "p1", capi.Port{ID: "lp", NetworkID: "s1", BindingHostID: "h1"}); err != nil {
		t.Fatal(err)
	}
	t.Run("times out pending", func(t *testing.T) {
		start := time.Now()
		p, err := e.cli.WaitPort(ctx, "p1", "lp", capi.StatusUp, 300*time.Millisecond)
		if err != nil || p.Status != capi.StatusPending {
			t.Fatalf("WaitPort = %+v, %v", p, err)
		}
		if d := time.Since(start); d < 250*time.Millisecond || d > 3*time.Second {
			t.Fatalf("long poll returned after %v", d)
		}
	})
	t.Run("plain GET returns at once", func(t *testing.T) {
		start := time.Now()
		p, err := e.cli.GetPort(ctx, "p1", "lp")
		if err != nil || p.Status != capi.StatusPending || time.Since(start) > time.Second {
			t.Fatalf("GetPort = %+v, %v", p, err)
		}
	})
	t.Run("wakes on UP", func(t *testing.T) {
		setErr := make(chan error, 1)
		go func() {
			time.Sleep(100 * time.Millisecond)
			_, err := e.cli.SetPortStatus(ctx, "p1", "lp", capi.StatusUp, "")
			setErr <- err
		}()
		start := time.Now()
		p, err := e.cli.WaitPort(ctx, "p1", "lp", capi.StatusUp, 10*time.Second)
		if serr := <-setErr; serr != nil {
			t.Fatalf("SetPortStatus UP: %v", serr)
		}
		if err != nil || p.Status != capi.StatusUp {
			t.Fatalf("WaitPort = %+v, %v", p, err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Fatalf("woke after %v", d)
		}
	})
	t.Run("error with reason", func(t *testing.T) {
		p, err := e.cli.SetPortStatus(ctx, "p1", "lp", capi.StatusError, "netns gone")
		if err != nil || p.Status != capi.StatusError || p.StatusReason != "netns gone" {
			t.Fatalf("SetPortStatus = %+v, %v", p, err)
		}
		got, _ := e.cli.GetPort(ctx, "p1", "lp")
		if got.StatusReason != "netns gone" || got.RevisionNumber != p.RevisionNumber {
			t.Fatalf("stored = %+v", got)
		}
	})
}

// TestCreateWait covers POST with wait_status: the answer waits for the
// status change, returns PENDING after the timeout, and a bulk create with
// the query is refused without creating anything.
func TestCreateWait(t *testing.T) {
	e := newEnv(t, "")
	ctx := t.Context()
	t.Run("wakes on UP", func(t *testing.T) {
		setErr := make(chan error, 1)
		go func() {
			// Report UP as soon as the port exists (an agent's view).
			for range 200 {
				if _, err := e.cli.SetPortStatus(ctx, "p1", "cw1", capi.StatusUp, ""); err == nil || !errors.Is(err, kerrors.NotFound) {
					setErr <- err
					return
				}
				time.Sleep(10 * time.Millisecond)
			}
			setErr <- errors.New("port cw1 never appeared")
		}()
		p, err := e.cli.CreatePortWait(ctx, "p1", capi.Port{ID: "cw1", NetworkID: "s1", BindingHostID: "h1"}, capi.StatusUp, 10*time.Second)
		if serr := <-setErr; serr != nil {
			t.Fatalf("SetPortStatus UP: %v", serr)
		}
		if err != nil || p.Status != capi.StatusUp || len(p.FixedIPs) != 1 || p.FixedIPs[0].CIDR == "" {
			t.Fatalf("CreatePortWait = %+v, %v", p, err)
		}
	})
	t.Run("times out pending", func(t *testing.T) {
		start := time.Now()
		p, err := e.cli.CreatePortWait(ctx, "p1", capi.Port{ID: "cw2", NetworkID: "s1", BindingHostID: "h1"}, capi.StatusUp, 200*time.Millisecond)
		if err != nil || p.Status != capi.StatusPending {
			t.Fatalf("CreatePortWait = %+v, %v", p, err)
		}
		if d := time.Since(start); d < 150*time.Millisecond || d > 3*time.Second {
			t.Fatalf("answered after %v", d)
		}
	})
	t.Run("bulk refused", func(t *testing.T) {
		code, body := raw(t, "POST", e.url+"/project/p1/ports?wait_status=UP&timeout=1s", `{"ports":[{"id":"cw3","network_id":"s1"}]}`)
		if code != http.StatusBadRequest || errType(body) != "Invalid" {
			t.Fatalf("bulk create with wait: %d %s, want 400 Invalid", code, body)
		}
		if _, err := e.cli.GetPort(ctx, "p1", "cw3"); !errors.Is(err, kerrors.NotFound) {
			t.Fatalf("bulk create with wait left port cw3: %v", err)
		}
	})
}

func TestListFilters(t *testing.T) {
	e := newEnv(t, "")
	ctx := t.Context()
	for i, p := range []capi.Port{
		{ID: "a", NetworkID: "s1", BindingHostID: "h1", DeviceID: "d1", Name: "n1"},
		{ID: "b", NetworkID: "s1", BindingHostID: "h1", DeviceID: "d2", Name: "n2"},
		{ID: "c", NetworkID: "v1", BindingHostID: "h2", DeviceID: "d2", Name: "n1"},
	} {
		if _, err := e.cli.CreatePort(ctx, "p1", p); err != nil {
			t.Fatalf("port %d: %v", i, err)
		}
	}
	tests := []struct {
		name string
		f    capi.PortFilter
		want string
	}{
		{"all", capi.PortFilter{}, "a,b,c"},
		{"host", capi.PortFilter{HostID: "h1"}, "a,b"},
		{"device", capi.PortFilter{DeviceID: "d2"}, "b,c"},
		{"name", capi.PortFilter{Name: "n1"}, "a,c"},
		{"host and name", capi.PortFilter{HostID: "h1", Name: "n1"}, "a"},
		{"network as subnet", capi.PortFilter{NetworkID: "s1"}, "a,b,c"},
		{"network as vpc", capi.PortFilter{NetworkID: "v1"}, "a,b,c"},
		{"no match", capi.PortFilter{HostID: "h9"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ps, err := e.cli.ListPorts(ctx, "p1", tt.f)
			if err != nil {
				t.Fatal(err)
			}
			var ids []string
			for _, p := range ps {
				ids = append(ids, p.ID)
			}
			if got := strings.Join(ids, ","); got != tt.want {
				t.Fatalf("ListPorts(%+v) = %q, want %q", tt.f, got, tt.want)
			}
		})
	}
}
