package api_test

import (
	"errors"
	"net/http"
	"testing"

	capi "kurma.dev/kurma/pkg/controllerapi"
	"kurma.dev/kurma/pkg/kerrors"
)

func TestProjectVPCSubnetLifecycle(t *testing.T) {
	e := newEnv(t, "")
	ctx := t.Context()
	c := e.cli
	if e.vpc.VNI == 0 || e.vpc.VNI >= 1<<24 {
		t.Fatalf("vni %d not a 24-bit id", e.vpc.VNI)
	}
	if e.subnet.GatewayIP != "10.20.0.1" || e.subnet.IPVersion != 4 || len(e.subnet.AllocationPools) != 1 || e.subnet.VNI != e.vpc.VNI {
		t.Fatalf("subnet defaults: %+v", e.subnet)
	}
	tests := []struct {
		name string
		call func() error
		want error
	}{
		{"duplicate project", func() error { _, err := c.CreateProject(ctx, capi.Project{ID: "p1"}); return err }, kerrors.Conflict},
		{"duplicate vpc", func() error { _, err := c.CreateVPC(ctx, "p1", capi.VPC{ID: "v1"}); return err }, kerrors.Conflict},
		{"vpc in unknown project", func() error { _, err := c.CreateVPC(ctx, "nope", capi.VPC{ID: "v9"}); return err }, kerrors.NotFound},
		{"bad vpc id", func() error { _, err := c.CreateVPC(ctx, "p1", capi.VPC{ID: "a b"}); return err }, kerrors.Invalid},
		{"duplicate subnet", func() error {
			_, err := c.CreateSubnet(ctx, "p1", capi.Subnet{ID: "s1", NetworkID: "v1", CIDR: "10.30.0.0/24"})
			return err
		}, kerrors.Conflict},
		{"overlapping subnet", func() error {
			_, err := c.CreateSubnet(ctx, "p1", capi.Subnet{ID: "s2", NetworkID: "v1", CIDR: "10.20.0.128/25"})
			return err
		}, kerrors.Conflict},
		{"subnet of unknown vpc", func() error {
			_, err := c.CreateSubnet(ctx, "p1", capi.Subnet{ID: "s3", NetworkID: "nope", CIDR: "10.40.0.0/24"})
			return err
		}, kerrors.NotFound},
		{"subnet bad cidr", func() error {
			_, err := c.CreateSubnet(ctx, "p1", capi.Subnet{ID: "s4", NetworkID: "v1", CIDR: "10.40.0.7/24"})
			return err
		}, kerrors.Invalid},
		{"subnet version mismatch", func() error {
			_, err := c.CreateSubnet(ctx, "p1", capi.Subnet{ID: "s5", NetworkID: "v1", CIDR: "fd00::/64", IPVersion: 4})
			return err
		}, kerrors.Invalid},
		{"subnet bad dns", func() error {
			_, err := c.CreateSubnet(ctx, "p1", capi.Subnet{ID: "s6", NetworkID: "v1", CIDR: "10.41.0.0/24", DNSNameservers: []string{"x"}})
			return err
		}, kerrors.Invalid},
		{"get unknown subnet", func() error { _, err := c.GetSubnet(ctx, "p1", "nope"); return err }, kerrors.NotFound},
		{"get subnet wrong project", func() error { _, err := c.GetSubnet(ctx, "nope", "s1"); return err }, kerrors.NotFound},
		{"delete project with vpcs", func() error { return c.DeleteProject(ctx, "p1") }, kerrors.Conflict},
		{"delete vpc with subnets", func() error { return c.DeleteVPC(ctx, "p1", "v1") }, kerrors.Conflict},
		{"delete unknown project", func() error { return c.DeleteProject(ctx, "nope") }, kerrors.NotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.call(); !errors.Is(err, tt.want) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
		})
	}

	t.Run("ipv6 subnet with pools and dns", func(t *testing.T) {
		v6, err := c.CreateSubnet(ctx, "p1", capi.Subnet{ID: "s6x", NetworkID: "v1", CIDR: "fd00:1::/64", IPVersion: 6,
			AllocationPools: []capi.AllocationPool{{Start: "fd00:1::10", End: "fd00:1::20"}}, DNSNameservers: []string{"fd00:1::53"}})
		if err != nil {
			t.Fatal(err)
		}
		if v6.GatewayIP != "fd00:1::1" || v6.IPVersion != 6 {
			t.Fatalf("v6 subnet: %+v", v6)
		}
		p, err := c.CreatePort(ctx, "p1", capi.Port{NetworkID: "s6x"})
		if err != nil {
			t.Fatal(err)
		}
		if p.FixedIPs[0].IPAddress != "fd00:1::10" {
			t.Fatalf("v6 port address %s", p.FixedIPs[0].IPAddress)
		}
		if err := c.DeleteSubnet(ctx, "p1", "s6x"); !errors.Is(err, kerrors.Conflict) {
			t.Fatalf("delete subnet with ports = %v", err)
		}
		if err := c.DeletePort(ctx, "p1", p.ID); err != nil {
			t.Fatal(err)
		}
		if err := c.DeleteSubnet(ctx, "p1", "s6x"); err != nil {
			t.Fatalf("delete empty subnet: %v", err)
		}
	})

	t.Run("list and teardown", func(t *testing.T) {
		subs, err := c.ListSubnets(ctx, "p1", "v1")
		if err != nil || len(subs) != 1 || subs[0].ID != "s1" {
			t.Fatalf("ListSubnets = %+v, %v", subs, err)
		}
		vpcs, err := c.ListVPCs(ctx, "p1")
		if err != nil || len(vpcs) != 1 {
			t.Fatalf("ListVPCs = %+v, %v", vpcs, err)
		}
		if err := c.DeleteSubnet(ctx, "p1", "s1"); err != nil {
			t.Fatal(err)
		}
		if err := c.DeleteVPC(ctx, "p1", "v1"); err != nil {
			t.Fatal(err)
		}
		if err := c.DeleteProject(ctx, "p1"); err != nil {
			t.Fatal(err)
		}
		ps, err := c.ListProjects(ctx)
		if err != nil || len(ps) != 0 {
			t.Fatalf("ListProjects after delete = %+v, %v", ps, err)
		}
	})
}

func TestRawErrorsAndRouting(t *testing.T) {
	e := newEnv(t, "")
	tests := []struct {
		name, method, path, body string
		code                     int
		typ                      string
	}{
		{"bad json", "POST", "/project/p1/ports", `{"port":`, 400, "Invalid"},
		{"not an object", "POST", "/project/p1/ports", `[1,2]`, 400, "Invalid"},
		{"empty body", "POST", "/project/p1/ports", ``, 400, "Invalid"},
		{"trailing data", "POST", "/project/p1/ports", `{"port":{"network_id":"s1"}} {}`, 400, "Invalid"},
		{"unknown top-level key", "POST", "/project/p1/ports", `{"port":{"network_id":"s1"},"extra":1}`, 400, "Invalid"},
		{"unknown port field", "POST", "/project/p1/ports", `{"port":{"network_id":"s1","bogus_field":1}}`, 400, "Invalid"},
		{"port and ports", "POST", "/project/p1/ports", `{"port":{"network_id":"s1"},"ports":[{"network_id":"s1"}]}`, 400, "Invalid"},
		{"empty bulk", "POST", "/project/p1/ports", `{"ports":[]}`, 400, "Invalid"},
		{"wrong type", "POST", "/project/p1/ports", `{"port":{"network_id":5}}`, 400, "Invalid"},
		{"wrong project", "POST", "/project/nope/ports", `{"port":{"network_id":"s1"}}`, 404, "NotFound"},
		{"unknown network", "POST", "/project/p1/ports", `{"port":{"network_id":"zzz"}}`, 404, "NotFound"},
		{"missing network", "POST", "/project/p1/ports", `{"port":{"name":"x"}}`, 400, "Invalid"},
		{"project_id mismatch", "POST", "/project/p1/ports", `{"port":{"network_id":"s1","project_id":"p2"}}`, 400, "Invalid"},
		{"bad vnic", "POST", "/project/p1/ports", `{"port":{"network_id":"s1","binding:vnic_type":"warp"}}`, 400, "Invalid"},
		{"bad veth name", "POST", "/project/p1/ports", `{"port":{"network_id":"s1","veth_name":"this-name-is-too-long"}}`, 400, "Invalid"},
		{"bad profile", "POST", "/project/p1/ports", `{"port":{"network_id":"s1","binding:profile":[1]}}`, 400, "Invalid"},
		{"bad mac", "POST", "/project/p1/ports", `{"port":{"network_id":"s1","mac_address":"01:00:5e:00:00:01"}}`, 400, "Invalid"},
		{"ip outside subnet", "POST", "/project/p1/ports", `{"port":{"network_id":"s1","fixed_ips":[{"ip_address":"10.99.0.5"}]}}`, 400, "Invalid"},
		{"gateway requested", "POST", "/project/p1/ports", `{"port":{"network_id":"s1","fixed_ips":[{"ip_address":"10.20.0.1"}]}}`, 409, "Conflict"},
		{"broadcast requested", "POST", "/project/p1/ports", `{"port":{"network_id":"s1","fixed_ips":[{"ip_address":"10.20.0.255"}]}}`, 400, "Invalid"},
		{"bad port id", "POST", "/project/p1/ports", `{"port":{"id":"../x","network_id":"s1"}}`, 400, "Invalid"},
		{"unknown port", "GET", "/project/p1/ports/nope", ``, 404, "NotFound"},
		{"delete unknown port", "DELETE", "/project/p1/ports/nope", ``, 404, "NotFound"},
		{"status of unknown port", "PUT", "/project/p1/ports/nope/status", `{"status":"UP"}`, 404, "NotFound"},
		{"bad status", "PUT", "/project/p1/ports/nope/status", `{"status":"SIDEWAYS"}`, 400, "Invalid"},
		{"bad wait timeout", "GET", "/project/p1/ports/nope?wait_status=UP&timeout=soon", ``, 400, "Invalid"},
		{"bad since", "GET", "/watch/ports?since=-4", ``, 400, "Invalid"},
		{"bad host body", "PUT", "/hosts/h1", `{"host":{"id":"h2","underlay_ip":"10.0.0.1"}}`, 400, "Invalid"},
		{"bad underlay", "PUT", "/hosts/h1", `{"host":{"underlay_ip":"ten"}}`, 400, "Invalid"},
		{"unknown host", "GET", "/hosts/nope", ``, 404, "NotFound"},
		{"delete unknown host", "DELETE", "/hosts/nope", ``, 404, "NotFound"},
		{"no route", "GET", "/v1/whatever", ``, 404, "NotFound"},
		{"bad subnet body", "POST", "/project/p1/subnets", `{"subnet":{"network_id":"v1","cidr":"10.50.0.0/24","color":"red"}}`, 400, "Invalid"},
		{"bad project body", "POST", "/projects", `{"projekt":{}}`, 400, "Invalid"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, body := raw(t, tt.method, e.url+tt.path, tt.body, "Content-Type", "application/json")
			if code != tt.code || errType(body) != tt.typ {
				t.Fatalf("%s %s = %d %s, want %d %s", tt.method, tt.path, code, body, tt.code, tt.typ)
			}
		})
	}
	// Nothing was created by any of the failures.
	if ps := listAll(t, e); len(ps) != 0 {
		t.Fatalf("failed requests left %d ports", len(ps))
	}
	// The unknown field is named in the message.
	_, body := raw(t, "POST", e.url+"/project/p1/ports", `{"port":{"network_id":"s1","bogus_field":1}}`)
	if !contains(body, "bogus_field") {
		t.Fatalf("error does not name the field: %s", body)
	}
	code, _ := raw(t, "GET", e.url+"/healthz", "")
	if code != http.StatusOK {
		t.Fatalf("healthz = %d", code)
	}
}

func contains(s, sub string) bool {
	return len(sub) == 0 || (len(s) >= len(sub) && (s[:len(sub)] == sub || contains(s[1:], sub)))
}
