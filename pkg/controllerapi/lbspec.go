package controllerapi

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"kurma.dev/kurma/pkg/kerrors"
)

// The contract of a load balancer, in one place: the controller refuses
// what breaks it, the agents program what it allows, and the Kubernetes
// Services reconciler builds its load balancers in the canonical form
// these functions produce, so that it can compare them with what the
// controller returns.

// Limits of one load balancer. MaxMembers also bounds the members one
// listener of one frontend selects in the agents' datapath.
const (
	MaxListeners         = 100
	MaxMembers           = 5000
	MaxExternalAddresses = 64
	// DefaultAffinityTimeout is the source-IP persistence timeout when none
	// is given: Kubernetes' default for sessionAffinity ClientIP.
	DefaultAffinityTimeout = 10800
	MaxAffinityTimeout     = 86400
)

func invalid(format string, args ...any) error { return kerrors.New(kerrors.Invalid, format, args...) }

// ValidID accepts ids safe as store key segments: 1-128 of
// [A-Za-z0-9._:-], not "." or "..".
func ValidID(kind, id string) error {
	if id == "" || len(id) > 128 {
		return invalid("%s id %q: want 1-128 characters", kind, id)
	}
	for _, c := range id {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-' || c == ':'
		if !ok {
			return invalid("%s id %q: only letters, digits, '.', '_', '-', ':' allowed", kind, id)
		}
	}
	if id == "." || id == ".." {
		return invalid("%s id %q not allowed", kind, id)
	}
	return nil
}

// ListenerKey is the name of a listener in Member.Listeners: the upper
// case protocol, a slash and the port ("UDP/53").
func ListenerKey(protocol string, port int) string {
	return strings.ToUpper(protocol) + "/" + strconv.Itoa(port)
}

// ProtocolNumber is the IP protocol number of a listener protocol, 0 for
// an unknown one.
func ProtocolNumber(p string) uint8 {
	switch strings.ToUpper(p) {
	case ProtocolTCP:
		return 6
	case ProtocolUDP:
		return 17
	case ProtocolSCTP:
		return 132
	}
	return 0
}

func validPort(field string, p int, zeroOK bool) error {
	if p == 0 && zeroOK {
		return nil
	}
	if p < 1 || p > 65535 {
		return invalid("%s %d: want 1-65535", field, p)
	}
	return nil
}

// unicast4 parses an IPv4 unicast address: the datapath programs IPv4
// only, so the controller refuses IPv6 instead of the agents dropping it.
func unicast4(field, s string) (netip.Addr, error) {
	a, err := netip.ParseAddr(s)
	if err != nil || a.Zone() != "" {
		return netip.Addr{}, invalid("%s %q is not an IP address", field, s)
	}
	a = a.Unmap()
	if !a.Is4() {
		return netip.Addr{}, invalid("%s %s: only IPv4 is supported", field, s)
	}
	if a.IsUnspecified() || a.IsLoopback() || a.IsMulticast() || a.IsLinkLocalUnicast() || a == netip.AddrFrom4([4]byte{255, 255, 255, 255}) {
		return netip.Addr{}, invalid("%s %s is not a unicast address", field, s)
	}
	return a, nil
}

// NormalizeVIP checks a requested VIP (IPv4 unicast) and returns it in
// canonical form; empty stays empty (allocate one).
func NormalizeVIP(s string) (string, error) {
	if s == "" {
		return "", nil
	}
	a, err := unicast4("vip_address", s)
	if err != nil {
		return "", err
	}
	return a.String(), nil
}

// NormalizeListeners checks listeners (protocol, ports, no duplicate
// protocol and port, no node port twice for one protocol), fills
// TargetPort and sorts them by protocol and port.
func NormalizeListeners(in []Listener) ([]Listener, error) {
	if len(in) > MaxListeners {
		return nil, invalid("listeners: %d exceed %d", len(in), MaxListeners)
	}
	if len(in) == 0 {
		return nil, nil // as JSON decodes an absent list: one canonical form
	}
	seen := map[string]int{}
	nodePorts := map[string]int{}
	out := make([]Listener, 0, len(in))
	for i, l := range in {
		f := fmt.Sprintf("listeners[%d]", i)
		l.Protocol = strings.ToUpper(l.Protocol)
		if ProtocolNumber(l.Protocol) == 0 {
			return nil, invalid("%s.protocol %q: want TCP, UDP or SCTP", f, l.Protocol)
		}
		if err := validPort(f+".port", l.Port, false); err != nil {
			return nil, err
		}
		if err := validPort(f+".target_port", l.TargetPort, true); err != nil {
			return nil, err
		}
		if err := validPort(f+".node_port", l.NodePort, true); err != nil {
			return nil, err
		}
		if l.TargetPort == 0 {
			l.TargetPort = l.Port
		}
		k := l.Key()
		if j, dup := seen[k]; dup {
			return nil, invalid("%s: duplicate listener %s (as listeners[%d])", f, k, j)
		}
		seen[k] = i
		if l.NodePort != 0 {
			nk := ListenerKey(l.Protocol, l.NodePort)
			if j, dup := nodePorts[nk]; dup {
				return nil, invalid("%s.node_port %d: also listeners[%d]'s", f, l.NodePort, j)
			}
			nodePorts[nk] = i
		}
		out = append(out, l)
	}
	slices.SortFunc(out, CompareListeners)
	return out, nil
}

// CompareListeners orders listeners by protocol, then port.
func CompareListeners(a, b Listener) int {
	return cmp.Or(cmp.Compare(a.Protocol, b.Protocol), cmp.Compare(a.Port, b.Port))
}

// NormalizeMembers checks members (address, port, port id, listener
// names, host id; no member twice with the same address, port and
// listener) and returns them in canonical form: addresses canonical,
// listener names upper case, sorted and without repeats, members sorted.
// Whether an address lies in the VPC needs the controller's store, whether
// the listeners exist the load balancer's listeners: see
// CheckMemberListeners.
func NormalizeMembers(in []Member) ([]Member, error) {
	if len(in) > MaxMembers {
		return nil, invalid("members: %d exceed %d", len(in), MaxMembers)
	}
	if len(in) == 0 {
		return nil, nil
	}
	out := make([]Member, 0, len(in))
	for i, m := range in {
		f := fmt.Sprintf("members[%d]", i)
		a, err := unicast4(f+".address", m.Address)
		if err != nil {
			return nil, err
		}
		m.Address = a.String()
		if err := validPort(f+".port", m.Port, true); err != nil {
			return nil, err
		}
		if m.PortID != "" {
			if err := ValidID(f+".port_id", m.PortID); err != nil {
				return nil, err
			}
		}
		if m.HostID != "" {
			if err := ValidID(f+".host_id", m.HostID); err != nil {
				return nil, err
			}
		}
		if len(m.Listeners) > 0 {
			ls := make([]string, 0, len(m.Listeners))
			for j, k := range m.Listeners {
				proto, port, ok := strings.Cut(strings.ToUpper(k), "/")
				n, err := strconv.Atoi(port)
				if !ok || ProtocolNumber(proto) == 0 || err != nil || n < 1 || n > 65535 || strconv.Itoa(n) != port {
					return nil, invalid("%s.listeners[%d] %q: want PROTOCOL/PORT, e.g. TCP/80", f, j, k)
				}
				ls = append(ls, ListenerKey(proto, n))
			}
			slices.Sort(ls)
			m.Listeners = slices.Compact(ls)
		} else {
			m.Listeners = nil
		}
		out = append(out, m)
	}
	// The same address and port may serve disjoint listener sets (a member
	// listed once per listener), never one listener twice.
	type use struct {
		addr     string
		port     int
		listener string // "": every listener
	}
	seen := make(map[use]int, len(out))   // -> index in the request
	listed := make(map[use]int, len(out)) // address and port, any listener
	for i, m := range out {
		all := use{m.Address, m.Port, ""}
		j, dup := seen[all]
		if !dup && m.Listeners == nil {
			j, dup = listed[all]
		}
		if dup {
			return nil, invalid("members[%d]: %s port %d is listed twice (as members[%d])", i, m.Address, m.Port, j)
		}
		if _, ok := listed[all]; !ok {
			listed[all] = i
		}
		if m.Listeners == nil {
			seen[all] = i
			continue
		}
		for _, l := range m.Listeners {
			u := use{m.Address, m.Port, l}
			if j, dup := seen[u]; dup {
				return nil, invalid("members[%d]: %s port %d is listed twice for listener %s (as members[%d])", i, m.Address, m.Port, l, j)
			}
			seen[u] = i
		}
	}
	slices.SortFunc(out, CompareMembers)
	return out, nil
}

// CompareMembers orders members by address, port, then listener names;
// normalized members compare as their canonical JSON would.
func CompareMembers(a, b Member) int {
	pa, _ := netip.ParseAddr(a.Address)
	pb, _ := netip.ParseAddr(b.Address)
	return cmp.Or(pa.Compare(pb), cmp.Compare(a.Port, b.Port), slices.Compare(a.Listeners, b.Listeners),
		cmp.Compare(a.PortID, b.PortID), cmp.Compare(a.HostID, b.HostID), compareBool(a.Backup, b.Backup),
		compareBool(a.External, b.External))
}

func compareBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
}

// CheckMemberListeners refuses members that name a listener the load
// balancer lacks.
func CheckMemberListeners(ls []Listener, ms []Member) error {
	have := make(map[string]bool, len(ls))
	for _, l := range ls {
		have[l.Key()] = true
	}
	for i, m := range ms {
		for _, k := range m.Listeners {
			if !have[k] {
				return invalid("members[%d] (%s): listener %s does not exist", i, m.Address, k)
			}
		}
	}
	return nil
}

// NormalizePersistence checks session persistence and fills its default
// timeout.
func NormalizePersistence(p *SessionPersistence) error {
	if p == nil {
		return nil
	}
	if strings.ToUpper(p.Type) != PersistenceSourceIP {
		return invalid("session_persistence.type %q: want %s", p.Type, PersistenceSourceIP)
	}
	p.Type = PersistenceSourceIP
	if p.Timeout == 0 {
		p.Timeout = DefaultAffinityTimeout
	}
	if p.Timeout < 1 || p.Timeout > MaxAffinityTimeout {
		return invalid("session_persistence.timeout %d: want 1-%d seconds", p.Timeout, MaxAffinityTimeout)
	}
	return nil
}

// NormalizePolicy checks a policy and puts it in canonical form (external
// addresses canonical, sorted, without repeats).
func NormalizePolicy(p *Policy) error {
	if len(p.ExternalAddresses) > MaxExternalAddresses {
		return invalid("external_addresses: %d exceed %d", len(p.ExternalAddresses), MaxExternalAddresses)
	}
	var as []string
	for i, s := range p.ExternalAddresses {
		a, err := unicast4(fmt.Sprintf("external_addresses[%d]", i), s)
		if err != nil {
			return err
		}
		as = append(as, a.String())
	}
	slices.SortFunc(as, func(x, y string) int {
		return netip.MustParseAddr(x).Compare(netip.MustParseAddr(y))
	})
	p.ExternalAddresses = slices.Compact(as)
	if err := validPort("health_check_node_port", p.HealthCheckNodePort, true); err != nil {
		return err
	}
	if p.HealthCheckNodePort != 0 && !p.ExternalLocal {
		return invalid("health_check_node_port needs external_local")
	}
	return nil
}

// HasHostFrontends reports whether every agent must program the load
// balancer: it answers on the hosts themselves (HostAccess, external
// addresses, node ports), not only inside its VPC.
func (lb *LoadBalancer) HasHostFrontends() bool {
	return lb.HostAccess || len(lb.ExternalAddresses) > 0 || slices.ContainsFunc(lb.Listeners, func(l Listener) bool { return l.NodePort != 0 })
}
