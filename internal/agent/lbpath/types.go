package lbpath

import (
	"fmt"
	"net/netip"
	"slices"
	"time"

	"kurma.dev/kurma/pkg/kerrors"
)

// Protocol numbers the datapath matches on (meta l4proto).
const (
	TCP  uint8 = 6
	UDP  uint8 = 17
	SCTP uint8 = 132
)

// MaxMembers bounds the members of one load balancer (the controller's
// limit, controllerapi.MaxMembers): a class carries the member count of
// one listener in its low classBits bits, and the member index travels in
// the packet mark.
const MaxMembers = 5000

// LB is one load balancer as the datapath programs it.
//
// Its internal frontends are the VIP on Iface and, with HostAccess, the
// VIP for connections the host opens; its external frontends are its
// FIPs, External and the listeners' node ports. Each listener of each
// kind of frontend has its own member selection: the members that serve
// the listener, only the Local ones under InternalLocal (ExternalLocal),
// and the Backup ones only when no other is left.
type LB struct {
	ID string
	// Iface is the interface its clients' packets arrive on: the bridge of
	// the VPC the VIP belongs to. The VIP answers only there. It may be
	// empty when the VPC has no port on this host and the load balancer
	// has host-level frontends (HostAccess, External, node ports).
	Iface     string
	VIP       netip.Addr // IPv4
	Listeners []Listener
	Members   []Member
	// OnLink: the VIP lies in a subnet on Iface, so clients ARP for it;
	// the host answers (a local route for the VIP on Iface).
	OnLink bool
	// Affinity, when non-zero, pins a client address to the member it was
	// first sent to, for this long after its last new connection.
	Affinity time.Duration
	// HostAccess answers the VIP for connections the host itself opens.
	HostAccess bool
	// External addresses are answered on every interface.
	External []netip.Addr
	// ExternalLocal: external frontends use Local members only and keep
	// the client's address; else their connections are source-NATed to
	// the node address. InternalLocal: internal frontends use Local
	// members only.
	ExternalLocal, InternalLocal bool
}

// Listener is one protocol and port the VIP serves.
type Listener struct {
	Proto      uint8  // TCP, UDP or SCTP
	Port       uint16 // the VIP's port
	TargetPort uint16 // the members' port, unless a member names its own; 0: Port
	NodePort   uint16 // also answered on this port of the node addresses; 0: none
}

// Key is the listener's protocol and port.
func (l Listener) Key() ListenerKey { return ListenerKey{l.Proto, l.Port} }

// ListenerKey names a listener.
type ListenerKey struct {
	Proto uint8
	Port  uint16
}

// Member is one backend of a load balancer.
type Member struct {
	Addr netip.Addr // IPv4
	Port uint16     // 0: the listener's target port
	// Serves lists the listeners the member serves; empty: all.
	Serves []ListenerKey
	// Local: the member runs on this host. Backup: used only while no
	// other member is left for a listener and frontend.
	Local, Backup bool
}

// serves reports whether m serves listener k.
func (m *Member) serves(k ListenerKey) bool {
	return len(m.Serves) == 0 || slices.Contains(m.Serves, k)
}

// hostLevel reports whether l answers on the host itself, not only on
// its VPC's bridge.
func (l *LB) hostLevel() bool {
	return l.HostAccess || len(l.External) > 0 || slices.ContainsFunc(l.Listeners, func(ls Listener) bool { return ls.NodePort != 0 })
}

// FIP is a floating IP: an address on the external network that stands
// for a port (PortAddr) or for a load balancer's VIP (LBID). With neither,
// it is allocated but programs nothing.
type FIP struct {
	ID       string
	Addr     netip.Addr // IPv4, answered on the external interface
	PortAddr netip.Addr // DNAT target and the source its egress is SNATed from
	LBID     string
}

// State is the whole desired state of the datapath.
type State struct {
	LBs  []LB
	FIPs []FIP
}

// Changes is an incremental update: objects to create or replace, and ids
// to remove. An id in both lists is removed.
type Changes struct {
	LBs       []LB
	DeleteLBs []string
	FIPs      []FIP
	DeleteFIP []string
}

// Validate checks an LB.
func (l LB) Validate() error {
	if l.ID == "" {
		return kerrors.New(kerrors.Invalid, "lb: empty id")
	}
	if len(l.Iface) > 15 || l.Iface == "" && (l.OnLink || !l.hostLevel()) {
		return kerrors.New(kerrors.Invalid, "lb %s: iface %q: want 1 to 15 bytes", l.ID, l.Iface)
	}
	for _, a := range l.External {
		if !a.Is4() {
			return kerrors.New(kerrors.Invalid, "lb %s: external address %v: want IPv4", l.ID, a)
		}
	}
	if !l.VIP.Is4() {
		return kerrors.New(kerrors.Invalid, "lb %s: vip %v: want an IPv4 address", l.ID, l.VIP)
	}
	if len(l.Members) > MaxMembers {
		return kerrors.New(kerrors.Invalid, "lb %s: %d members, at most %d", l.ID, len(l.Members), MaxMembers)
	}
	if l.Affinity < 0 || l.Affinity > 7*24*time.Hour {
		return kerrors.New(kerrors.Invalid, "lb %s: affinity %v out of range", l.ID, l.Affinity)
	}
	seen := map[[2]uint16]bool{}
	for _, ls := range l.Listeners {
		if ls.Proto != TCP && ls.Proto != UDP && ls.Proto != SCTP {
			return kerrors.New(kerrors.Invalid, "lb %s: listener protocol %d", l.ID, ls.Proto)
		}
		if ls.Port == 0 {
			return kerrors.New(kerrors.Invalid, "lb %s: listener port 0", l.ID)
		}
		k := [2]uint16{uint16(ls.Proto), ls.Port}
		if seen[k] {
			return kerrors.New(kerrors.Invalid, "lb %s: duplicate listener %d/%d", l.ID, ls.Proto, ls.Port)
		}
		seen[k] = true
		if ls.NodePort != 0 {
			k := [2]uint16{uint16(ls.Proto) | 0x100, ls.NodePort}
			if seen[k] {
				return kerrors.New(kerrors.Invalid, "lb %s: node port %d/%d twice", l.ID, ls.Proto, ls.NodePort)
			}
			seen[k] = true
		}
	}
	for _, m := range l.Members {
		if !m.Addr.Is4() {
			return kerrors.New(kerrors.Invalid, "lb %s: member %v: want an IPv4 address", l.ID, m.Addr)
		}
	}
	return nil
}

// Validate checks a FIP.
func (f FIP) Validate() error {
	if f.ID == "" {
		return kerrors.New(kerrors.Invalid, "fip: empty id")
	}
	if !f.Addr.Is4() {
		return kerrors.New(kerrors.Invalid, "fip %s: address %v: want IPv4", f.ID, f.Addr)
	}
	if f.PortAddr.IsValid() && !f.PortAddr.Is4() {
		return kerrors.New(kerrors.Invalid, "fip %s: port address %v: want IPv4", f.ID, f.PortAddr)
	}
	if f.PortAddr.IsValid() && f.LBID != "" {
		return kerrors.New(kerrors.Invalid, "fip %s: associated with both a port and a load balancer", f.ID)
	}
	return nil
}

func (f FIP) String() string { return fmt.Sprintf("fip %s (%v)", f.ID, f.Addr) }

func sameMember(a, b Member) bool {
	return a.Addr == b.Addr && a.Port == b.Port && a.Local == b.Local && a.Backup == b.Backup && slices.Equal(a.Serves, b.Serves)
}

// validate checks every load balancer and floating IP.
func validate(lbs []LB, fips []FIP) error {
	for i := range lbs {
		if err := lbs[i].Validate(); err != nil {
			return err
		}
	}
	for i := range fips {
		if err := fips[i].Validate(); err != nil {
			return err
		}
	}
	return nil
}
