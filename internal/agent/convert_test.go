package agent

import (
	"encoding/json"
	"errors"
	"slices"
	"testing"

	"kurma.dev/kurma/internal/agent/datapath"
	"kurma.dev/kurma/pkg/controllerapi"
	"kurma.dev/kurma/pkg/kerrors"
)

func goodPort() controllerapi.Port {
	return controllerapi.Port{
		ID: "p1", ProjectID: "proj", BindingHostID: "h1", VNI: 42,
		NetworkNS: "/run/netns/pod", MACAddress: "02:42:00:00:00:05",
		FixedIPs: []controllerapi.FixedIP{{SubnetID: "s1", IPAddress: "10.42.0.5", CIDR: "10.42.0.0/24", GatewayIP: "10.42.0.1"}},
	}
}

func TestToPortSpec(t *testing.T) {
	s, err := toPortSpec(ptr(goodPort()))
	if err != nil {
		t.Fatal(err)
	}
	if s.IfName != "eth0" || s.Addrs[0].Addr.String() != "10.42.0.5/24" || s.Addrs[0].Gateway.String() != "10.42.0.1" || s.MAC.String() != "02:42:00:00:00:05" {
		t.Fatalf("spec = %+v", s)
	}
	p := goodPort()
	p.NetworkNS, p.VethNamespace, p.VethName = "", "/run/netns/other", "net1"
	if s, err := toPortSpec(&p); err != nil || s.NetNS != "/run/netns/other" || s.IfName != "net1" {
		t.Fatalf("veth_namespace spelling: %+v, %v", s, err)
	}
	for _, tc := range []struct {
		name string
		mod  func(*controllerapi.Port)
	}{
		{"relative netns", func(p *controllerapi.Port) { p.NetworkNS = "pod" }},
		{"no netns", func(p *controllerapi.Port) { p.NetworkNS = "" }},
		{"bad mac", func(p *controllerapi.Port) { p.MACAddress = "zz" }},
		{"long mac", func(p *controllerapi.Port) { p.MACAddress = "02:00:00:00:00:00:00:01" }},
		{"multicast mac", func(p *controllerapi.Port) { p.MACAddress = "01:00:5e:00:00:01" }},
		{"no ips", func(p *controllerapi.Port) { p.FixedIPs = nil }},
		{"no cidr", func(p *controllerapi.Port) { p.FixedIPs[0].CIDR = "" }},
		{"ip outside", func(p *controllerapi.Port) { p.FixedIPs[0].IPAddress = "10.43.0.5" }},
		{"gateway outside", func(p *controllerapi.Port) { p.FixedIPs[0].GatewayIP = "10.43.0.1" }},
		{"no vni", func(p *controllerapi.Port) { p.VNI = 0 }},
		{"bad ifname", func(p *controllerapi.Port) { p.VethName = "a/b" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := goodPort()
			p.FixedIPs = append([]controllerapi.FixedIP(nil), p.FixedIPs...)
			tc.mod(&p)
			if _, err := toPortSpec(&p); !errors.Is(err, kerrors.Invalid) {
				t.Fatalf("err = %v, want Invalid", err)
			}
		})
	}
}

func TestGatewaysAndRemotes(t *testing.T) {
	a, _ := toPortSpec(ptr(goodPort()))
	p2 := goodPort()
	p2.FixedIPs[0].IPAddress = "10.42.0.9"
	b, _ := toPortSpec(&p2)
	if g := gatewaysOf([]datapath.PortSpec{a, b}); len(g) != 1 || g[0].String() != "10.42.0.1/24" {
		t.Fatalf("gateways = %v", g)
	}
	r, ok := toRemote(ptr(goodPort()), []byte{192, 0, 2, 2})
	if !ok || r.MAC.String() != "02:42:00:00:00:05" || len(r.IPs) != 1 || r.IPs[0].String() != "10.42.0.5" {
		t.Fatalf("remote = %+v, %v", r, ok)
	}
	if _, ok := toRemote(ptr(goodPort()), nil); ok {
		t.Fatal("remote without a known host accepted")
	}
}

func TestDatapathChange(t *testing.T) {
	base := goodPort()
	for _, tc := range []struct {
		name string
		mod  func(*controllerapi.Port)
		want bool
	}{
		{"status only", func(p *controllerapi.Port) { p.Status, p.StatusReason, p.RevisionNumber = "UP", "", 9 }, false},
		{"moved host", func(p *controllerapi.Port) { p.BindingHostID = "h2" }, true},
		{"new ip", func(p *controllerapi.Port) { p.FixedIPs = []controllerapi.FixedIP{{IPAddress: "10.42.0.7"}} }, true},
		{"new netns", func(p *controllerapi.Port) { p.NetworkNS = "/run/netns/x" }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := goodPort()
			p.FixedIPs = append([]controllerapi.FixedIP(nil), p.FixedIPs...)
			tc.mod(&p)
			if got := datapathChange(&base, &p); got != tc.want {
				t.Fatalf("datapathChange = %v, want %v", got, tc.want)
			}
		})
	}
}

// FuzzToPortSpec: any port body the controller could send converts to a
// valid spec or an Invalid error, never a panic.
func FuzzToPortSpec(f *testing.F) {
	b, _ := json.Marshal(goodPort())
	f.Add(b)
	f.Add([]byte(`{"id":"x","vni":1,"network_ns":"/a","mac_address":"02:00:00:00:00:01","fixed_ips":[{"ip_address":"::1","cidr":"::/0"}]}`))
	f.Add([]byte(`{"fixed_ips":[{}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		var p controllerapi.Port
		if json.Unmarshal(body, &p) != nil {
			return
		}
		s, err := toPortSpec(&p)
		if err != nil {
			if !errors.Is(err, kerrors.Invalid) {
				t.Fatalf("error without category: %v", err)
			}
			return
		}
		if err := s.Validate(); err != nil {
			t.Fatalf("accepted spec is invalid: %v", err)
		}
	})
}

func ptr[T any](v T) *T { return &v }

func TestToGuard(t *testing.T) {
	for _, tc := range []struct {
		name    string
		mod     func(*controllerapi.Port)
		ok      bool
		wantIPs []string
	}{
		{"default guarded", func(*controllerapi.Port) {}, true, []string{"10.42.0.5"}},
		{"explicitly enabled", func(p *controllerapi.Port) { p.PortSecurityEnabled = ptr(true) }, true, []string{"10.42.0.5"}},
		{"disabled", func(p *controllerapi.Port) { p.PortSecurityEnabled = ptr(false) }, false, nil},
		{"bad mac", func(p *controllerapi.Port) { p.MACAddress = "zz" }, false, nil},
		{"pair adds address", func(p *controllerapi.Port) {
			p.AllowedAddressPairs = []controllerapi.AddressPair{{IPAddress: "10.42.0.200", MACAddress: "02:42:00:00:00:05"}}
		}, true, []string{"10.42.0.5", "10.42.0.200"}},
		{"pair with other mac", func(p *controllerapi.Port) {
			p.AllowedAddressPairs = []controllerapi.AddressPair{{IPAddress: "10.42.0.200", MACAddress: "02:42:00:00:00:99"}}
		}, false, nil},
		{"pair with cidr", func(p *controllerapi.Port) {
			p.AllowedAddressPairs = []controllerapi.AddressPair{{IPAddress: "10.42.0.0/24"}}
		}, false, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := goodPort()
			tc.mod(&p)
			g, ok := toGuard(&p)
			if ok != tc.ok {
				t.Fatalf("toGuard ok = %v, want %v", ok, tc.ok)
			}
			if !ok {
				return
			}
			var got []string
			for _, ip := range g.IPs {
				got = append(got, ip.String())
			}
			if !slices.Equal(got, tc.wantIPs) || g.MAC.String() != p.MACAddress {
				t.Fatalf("guard = %v %v, want %v %s", g.MAC, got, tc.wantIPs, p.MACAddress)
			}
		})
	}
}
