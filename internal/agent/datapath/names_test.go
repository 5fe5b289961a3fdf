package datapath

import (
	"errors"
	"net"
	"strings"
	"testing"

	"sigs.k8s.io/knftables"

	"kurma.dev/kurma/pkg/kerrors"
)

func TestNames(t *testing.T) {
	n, err := newNames("kagt", "kurma-agent")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, id string
	}{
		{"uuid", "3dda2801-d675-4688-a63f-dcda8d327f50"},
		{"short", "p"},
		{"long", strings.Repeat("x", 200)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := n.hostVeth(tc.id)
			if err := ValidateIfName(h); err != nil || len(h) != 15 || !strings.HasPrefix(h, "kagtp") {
				t.Fatalf("hostVeth(%q) = %q (%v)", tc.id, h, err)
			}
			if h != n.hostVeth(tc.id) {
				t.Fatal("hostVeth is not deterministic")
			}
			if id, ok := n.ownsPort(h, n.portAlias(tc.id)); !ok || id != tc.id {
				t.Fatalf("ownsPort = %q, %v", id, ok)
			}
			if _, ok := n.ownsPort(h, ""); ok {
				t.Fatal("a link without our alias counts as ours")
			}
			if _, ok := n.ownsPort(n.hostVeth(tc.id+"x"), n.portAlias(tc.id)); ok {
				t.Fatal("a link whose name does not match the alias counts as ours")
			}
		})
	}
	if got := n.bridge(0x2a); got != "kagtb00002a" {
		t.Errorf("bridge = %q", got)
	}
	if got := n.vxlan(MaxVNI); got != "kagtvffffff" {
		t.Errorf("vxlan = %q", got)
	}
	for _, tc := range []struct {
		name, link, alias, kind string
		want                    uint32
		ok                      bool
	}{
		{"bridge", "kagtb00002a", "kurma-agent:vpc:42", "bridge", 42, true},
		{"vxlan", "kagtv00002a", "kurma-agent:vpc:42", "vxlan", 42, true},
		{"wrong kind", "kagtv00002a", "kurma-agent:vpc:42", "bridge", 0, false},
		{"other owner", "kagtb00002a", "someone:vpc:42", "bridge", 0, false},
		{"vni mismatch", "kagtb00002b", "kurma-agent:vpc:42", "bridge", 0, false},
		{"vni zero", "kagtb000000", "kurma-agent:vpc:0", "bridge", 0, false},
		{"vni too big", "kagtb1000000", "kurma-agent:vpc:16777216", "bridge", 0, false},
		{"junk", "kagtb00002a", "kurma-agent:vpc:4x2", "bridge", 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vni, ok := n.ownsVPCLink(tc.link, tc.alias, tc.kind)
			if vni != tc.want || ok != tc.ok {
				t.Fatalf("ownsVPCLink = %d, %v; want %d, %v", vni, ok, tc.want, tc.ok)
			}
		})
	}
}

func TestNewNamesInvalid(t *testing.T) {
	for _, tc := range []struct{ name, prefix, owner string }{
		{"empty prefix", "", "o"},
		{"long prefix", "abcdef", "o"},
		{"slash", "a/b", "o"},
		{"empty owner", "ka", ""},
		{"colon owner", "ka", "a:b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := newNames(tc.prefix, tc.owner); !errors.Is(err, kerrors.Invalid) {
				t.Fatalf("err = %v, want Invalid", err)
			}
		})
	}
}

func TestPortSpecValidate(t *testing.T) {
	good := PortSpec{
		ID: "p1", VNI: 7, NetNS: "/run/netns/x", IfName: "eth0",
		MAC:   net.HardwareAddr{0x02, 0, 0, 0, 0, 1},
		Addrs: []PortAddr{{Addr: net.IPNet{IP: net.ParseIP("10.0.0.5").To4(), Mask: net.CIDRMask(24, 32)}, Gateway: net.ParseIP("10.0.0.1")}},
	}
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		mod  func(*PortSpec)
	}{
		{"no id", func(p *PortSpec) { p.ID = "" }},
		{"space in id", func(p *PortSpec) { p.ID = "a b" }},
		{"bad ifname", func(p *PortSpec) { p.IfName = "eth0/1" }},
		{"long ifname", func(p *PortSpec) { p.IfName = "abcdefghijklmnop" }},
		{"vni 0", func(p *PortSpec) { p.VNI = 0 }},
		{"vni big", func(p *PortSpec) { p.VNI = MaxVNI + 1 }},
		{"multicast mac", func(p *PortSpec) { p.MAC = net.HardwareAddr{1, 0, 0, 0, 0, 1} }},
		{"zero mac", func(p *PortSpec) { p.MAC = make(net.HardwareAddr, 6) }},
		{"no netns", func(p *PortSpec) { p.NetNS = "" }},
		{"no addrs", func(p *PortSpec) { p.Addrs = nil }},
		{"gateway outside", func(p *PortSpec) { p.Addrs[0].Gateway = net.ParseIP("10.9.0.1") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := good
			p.Addrs = append([]PortAddr(nil), good.Addrs...)
			tc.mod(&p)
			if err := p.Validate(); !errors.Is(err, kerrors.Invalid) {
				t.Fatalf("err = %v, want Invalid", err)
			}
		})
	}
}

func TestSigMAC(t *testing.T) {
	d := &Datapath{cfg: Config{Owner: "o"}, vtep: net.ParseIP("192.0.2.1")}
	a := d.sigMAC("kab000005")
	if a[0]&1 != 0 || a[0]&2 == 0 {
		t.Fatalf("MAC %s is not locally administered unicast", a)
	}
	if a.String() != d.sigMAC("kab000005").String() {
		t.Fatal("MAC not stable")
	}
	if a.String() == d.sigMAC("kab000006").String() {
		t.Fatal("two links share a MAC")
	}
	d2 := &Datapath{cfg: Config{Owner: "o"}, vtep: net.ParseIP("192.0.2.2")}
	if a.String() == d2.sigMAC("kab000005").String() {
		t.Fatal("two hosts' bridges share a MAC")
	}
}

// TestIsolationRules checks the nft transaction against knftables' fake.
func TestIsolationRules(t *testing.T) {
	fake := knftables.NewFake(knftables.InetFamily, "kagt-test")
	for _, tc := range []struct {
		name    string
		mark    uint32
		bridges []string
		want    int
	}{
		{"two vpcs", 0, []string{"kab000001", "kab000002"}, 4},
		{"one left", 0, []string{"kab000002"}, 2},
		{"none", 0, nil, 0},
		{"nat accept mark", 0x200000, []string{"kab000002"}, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tx := fake.NewTransaction()
			isolationRules(tx, "kurma-agent", tc.mark, tc.bridges)
			if err := fake.Run(t.Context(), tx); err != nil {
				t.Fatal(err)
			}
			rules, err := fake.ListRules(t.Context(), forwardChain)
			if err != nil {
				t.Fatal(err)
			}
			if len(rules) != tc.want {
				t.Fatalf("%d rules, want %d:\n%s", len(rules), tc.want, fake.Dump())
			}
			for _, r := range rules {
				if r.Comment == nil || !(strings.HasPrefix(*r.Comment, "kurma-agent:vpc-") || strings.HasPrefix(*r.Comment, "kurma-agent:nat-accept")) {
					t.Errorf("rule %q has no owner comment", r.Rule)
				}
			}
		})
	}
}

// FuzzPortNames: any id ValidatePortID accepts yields a valid interface
// name whose alias proves ownership of exactly that id.
func FuzzPortNames(f *testing.F) {
	for _, s := range []string{"p", "3dda2801-d675-4688-a63f-dcda8d327f50", "a:b:c", "kurma-agent:port:x"} {
		f.Add(s)
	}
	n, err := newNames("ka", "kurma-agent")
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, id string) {
		if ValidatePortID(id) != nil {
			return
		}
		h := n.hostVeth(id)
		if err := ValidateIfName(h); err != nil {
			t.Fatalf("hostVeth(%q) = %q: %v", id, h, err)
		}
		got, ok := n.ownsPort(h, n.portAlias(id))
		if !ok || got != id {
			t.Fatalf("ownsPort(%q) = %q, %v", id, got, ok)
		}
		if vni, ok := n.vniFromAlias(n.portAlias(id)); ok {
			t.Fatalf("port alias parsed as vpc %d", vni)
		}
	})
}

// FuzzAlias: parsing any alias never panics and only accepts VNIs in range.
func FuzzAlias(f *testing.F) {
	for _, s := range []string{"kurma-agent:vpc:42", "kurma-agent:vpc:", "kurma-agent:port:", "kurma-agent:vpc:99999999999"} {
		f.Add(s)
	}
	n, _ := newNames("ka", "kurma-agent")
	f.Fuzz(func(t *testing.T, alias string) {
		if vni, ok := n.vniFromAlias(alias); ok && (vni == 0 || vni > MaxVNI) {
			t.Fatalf("vni %d accepted", vni)
		}
		if id, ok := n.portFromAlias(alias); ok && id == "" {
			t.Fatal("empty port id accepted")
		}
	})
}
