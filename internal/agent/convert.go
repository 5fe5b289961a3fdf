package agent

import (
	"net"
	"strings"

	"kurma.dev/kurma/internal/agent/datapath"
	"kurma.dev/kurma/pkg/controllerapi"
	"kurma.dev/kurma/pkg/kerrors"
)

// DefaultIfName is the container-side name when a port has no veth_name.
const DefaultIfName = "eth0"

// netnsOf returns the port's namespace path (network_ns, or spec 003's
// bulk spelling veth_namespace).
func netnsOf(p *controllerapi.Port) string {
	if p.NetworkNS != "" {
		return p.NetworkNS
	}
	return p.VethNamespace
}

// toPortSpec turns a controller port into what the datapath plugs. Every
// fixed IP must carry its subnet's CIDR (the controller fills it in
// responses); the error is kerrors.Invalid otherwise.
func toPortSpec(p *controllerapi.Port) (datapath.PortSpec, error) {
	s := datapath.PortSpec{ID: p.ID, VNI: p.VNI, NetNS: netnsOf(p), IfName: p.VethName,
		AdminDown: p.AdminStateUp != nil && !*p.AdminStateUp}
	if s.IfName == "" {
		s.IfName = DefaultIfName
	}
	if !strings.HasPrefix(s.NetNS, "/") {
		return s, kerrors.New(kerrors.Invalid, "port %s: network_ns %q is not an absolute path", p.ID, s.NetNS)
	}
	mac, err := net.ParseMAC(p.MACAddress)
	if err != nil || len(mac) != 6 {
		return s, kerrors.New(kerrors.Invalid, "port %s: mac_address %q: want an ethernet address", p.ID, p.MACAddress)
	}
	s.MAC = mac
	if len(p.FixedIPs) == 0 {
		return s, kerrors.New(kerrors.Invalid, "port %s: no fixed_ips", p.ID)
	}
	for _, f := range p.FixedIPs {
		a, err := toPortAddr(p.ID, f)
		if err != nil {
			return s, err
		}
		s.Addrs = append(s.Addrs, a)
	}
	return s, s.Validate()
}

func toPortAddr(portID string, f controllerapi.FixedIP) (datapath.PortAddr, error) {
	ip := net.ParseIP(f.IPAddress)
	_, cidr, err := net.ParseCIDR(f.CIDR)
	if ip == nil || err != nil {
		return datapath.PortAddr{}, kerrors.New(kerrors.Invalid, "port %s: fixed ip %q in subnet %q (cidr %q) is not usable", portID, f.IPAddress, f.SubnetID, f.CIDR)
	}
	if v4 := ip.To4(); v4 != nil {
		ip = v4
	}
	if !cidr.Contains(ip) {
		return datapath.PortAddr{}, kerrors.New(kerrors.Invalid, "port %s: %s is outside %s", portID, ip, cidr)
	}
	a := datapath.PortAddr{Addr: net.IPNet{IP: ip, Mask: cidr.Mask}}
	if f.GatewayIP != "" {
		gw := net.ParseIP(f.GatewayIP)
		if gw == nil || !cidr.Contains(gw) {
			return datapath.PortAddr{}, kerrors.New(kerrors.Invalid, "port %s: gateway %q outside %s", portID, f.GatewayIP, cidr)
		}
		if v4 := gw.To4(); v4 != nil {
			gw = v4
		}
		a.Gateway = gw
	}
	return a, nil
}

// gatewaysOf collects the gateway addresses (with their subnets' prefix
// lengths) that the VPC bridge must carry for these ports, without
// duplicates.
func gatewaysOf(specs []datapath.PortSpec) []net.IPNet {
	seen := map[string]bool{}
	var out []net.IPNet
	for _, s := range specs {
		for _, a := range s.Addrs {
			if a.Gateway == nil {
				continue
			}
			g := net.IPNet{IP: a.Gateway, Mask: a.Addr.Mask}
			if !seen[g.String()] {
				seen[g.String()] = true
				out = append(out, g)
			}
		}
	}
	return out
}

// toRemote turns a port on another host into a datapath.Remote; ok is
// false when the port lacks what is needed (no MAC, no usable address).
func toRemote(p *controllerapi.Port, vtep net.IP) (datapath.Remote, bool) {
	mac, err := net.ParseMAC(p.MACAddress)
	if err != nil || len(mac) != 6 || mac[0]&1 != 0 || vtep == nil {
		return datapath.Remote{}, false
	}
	r := datapath.Remote{MAC: mac, VTEP: vtep}
	for _, f := range p.FixedIPs {
		if ip := net.ParseIP(f.IPAddress); ip != nil {
			if v4 := ip.To4(); v4 != nil {
				ip = v4
			}
			r.IPs = append(r.IPs, ip)
		}
	}
	return r, true
}

// toGuard converts a local port to its anti-spoofing guard. ok is false
// when the port is not guarded: port_security_enabled is false, its MAC
// does not parse, or an allowed address pair names another MAC or a
// CIDR (which a guard cannot express). Pairs with a single address and
// no other MAC add that address.
func toGuard(p *controllerapi.Port) (g datapath.Guard, ok bool) {
	if p.PortSecurityEnabled != nil && !*p.PortSecurityEnabled {
		return g, false
	}
	mac, err := net.ParseMAC(p.MACAddress)
	if err != nil || len(mac) != 6 {
		return g, false
	}
	g = datapath.Guard{PortID: p.ID, MAC: mac}
	add := func(s string) bool {
		ip := net.ParseIP(s)
		if ip == nil || ip.IsUnspecified() {
			return false
		}
		if v4 := ip.To4(); v4 != nil {
			ip = v4
		}
		g.IPs = append(g.IPs, ip)
		return true
	}
	for _, f := range p.FixedIPs {
		add(f.IPAddress)
	}
	for _, ap := range p.AllowedAddressPairs {
		if ap.MACAddress != "" && !strings.EqualFold(ap.MACAddress, p.MACAddress) {
			return g, false
		}
		if ap.IPAddress != "" && !add(ap.IPAddress) {
			return g, false
		}
	}
	return g, g.Validate() == nil
}
