package podnet

import (
	"errors"
	"strings"
	"testing"

	"kurma.dev/kurma/pkg/kerrors"
)

func good() Networks {
	return Networks{DefaultNetwork: {
		PortID: "k8s-6f1d3c2e", ProjectID: "k8s", SubnetID: "k8s-ns-1",
		MAC: "0a:58:0a:20:00:05", IPs: []string{"10.32.0.5/16"}, Gateways: []string{"10.32.0.1"},
		Routes: []Route{{Dest: "10.96.0.0/16", NextHop: "10.32.0.1"}},
		PodUID: "8cca008f-d492-11e5-bf9e-42010af00005", HostID: "node-1",
	}}
}

func TestRoundTrip(t *testing.T) {
	s, err := Encode(good())
	if err != nil {
		t.Fatal(err)
	}
	ns, err := Decode(s)
	if err != nil {
		t.Fatal(err)
	}
	n, ok := ns.Default()
	if !ok || n.PortID != "k8s-6f1d3c2e" || n.Prefixes()[0].String() != "10.32.0.5/16" || n.HardwareAddr().String() != "0a:58:0a:20:00:05" {
		t.Fatalf("round trip: %+v", ns)
	}
}

func TestRejects(t *testing.T) {
	for _, tc := range []struct {
		name, field string
		mut         func(*Network)
	}{
		{"no port id", "port_id", func(n *Network) { n.PortID = "" }},
		{"port id with slash", "port_id", func(n *Network) { n.PortID = "a/b" }},
		{"no uid", "pod_uid", func(n *Network) { n.PodUID = "" }},
		{"no host", "host_id", func(n *Network) { n.HostID = "" }},
		{"multicast mac", "mac_address", func(n *Network) { n.MAC = "01:00:5e:00:00:01" }},
		{"zero mac", "mac_address", func(n *Network) { n.MAC = "00:00:00:00:00:00" }},
		{"long mac", "mac_address", func(n *Network) { n.MAC = "00:00:00:00:00:00:00:01" }},
		{"no ips", "ip_addresses", func(n *Network) { n.IPs = nil }},
		{"ip without prefix", "ip_addresses", func(n *Network) { n.IPs = []string{"10.32.0.5"} }},
		{"network address", "ip_addresses", func(n *Network) { n.IPs = []string{"10.32.0.0/16"} }},
		{"two v4", "ip_addresses", func(n *Network) { n.IPs = []string{"10.32.0.5/16", "10.33.0.5/16"} }},
		{"gateway outside", "gateway_ips", func(n *Network) { n.Gateways = []string{"10.99.0.1"} }},
		{"gateway is self", "gateway_ips", func(n *Network) { n.Gateways = []string{"10.32.0.5"} }},
		{"route dest not network", "routes[0].dest", func(n *Network) { n.Routes[0].Dest = "10.96.0.1/16" }},
		{"route via v6", "routes[0].nextHop", func(n *Network) { n.Routes[0].NextHop = "fd00::1" }},
		{"route via off-link", "routes[0].nextHop", func(n *Network) { n.Routes[0].NextHop = "10.99.0.1" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := good()
			n := ns[DefaultNetwork]
			n.Routes = append([]Route(nil), n.Routes...)
			tc.mut(&n)
			ns[DefaultNetwork] = n
			_, err := Encode(ns)
			if !errors.Is(err, kerrors.Invalid) || !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("Encode: %v, want Invalid naming %s", err, tc.field)
			}
		})
	}
}

func TestDecodeRejects(t *testing.T) {
	ok, _ := Encode(good())
	for _, tc := range []struct{ name, in string }{
		{"empty", ""},
		{"null", "null"},
		{"array", "[]"},
		{"no default", `{}`},
		{"unknown field", strings.Replace(ok, `"port_id"`, `"bogus":1,"port_id"`, 1)},
		{"duplicate key", strings.Replace(ok, `"port_id":"k8s-6f1d3c2e"`, `"port_id":"a","port_id":"k8s-6f1d3c2e"`, 1)},
		{"trailing", ok + "{}"},
		{"bad network name", strings.Replace(ok, `{"default"`, `{"default":{},"Bad_Name"`, 1)},
		{"too big", `{"default":{"port_id":"` + strings.Repeat("a", MaxSize) + `"}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := Decode(tc.in); !errors.Is(err, kerrors.Invalid) {
				t.Fatalf("Decode(%.60q): %v, want Invalid", tc.in, err)
			}
		})
	}
}

func TestDualStack(t *testing.T) {
	ns := good()
	n := ns[DefaultNetwork]
	n.IPs = []string{"10.32.0.5/16", "fd00:20::5/64"}
	n.Gateways = []string{"10.32.0.1", "fd00:20::1"}
	n.Routes = []Route{{Dest: "fd00:96::/112"}}
	ns[DefaultNetwork] = n
	s, err := Encode(ns)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Decode(s); err != nil {
		t.Fatal(err)
	}
}
