package policyrule

import (
	"encoding/binary"
	"fmt"
	"net/netip"
)

// Proto is an IP protocol number (0: every protocol).
type Proto uint8

// Addr4 is an IPv4 address as a number. Unlike netip.Addr it holds no
// pointer, so the hundreds of thousands of Allows an engine and a path
// keep are not scanned by the garbage collector, and it compares as an
// integer.
type Addr4 uint32

// A4 is the Addr4 of an IPv4 address (0 for any other: callers pass IPv4
// only).
func A4(a netip.Addr) Addr4 {
	if !a.Is4() {
		return 0
	}
	b := a.As4()
	return Addr4(binary.BigEndian.Uint32(b[:]))
}

// Addr is a as a netip.Addr.
func (a Addr4) Addr() netip.Addr {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], uint32(a))
	return netip.AddrFrom4(b)
}

func (a Addr4) String() string { return a.Addr().String() }

// Allow is one allowed (peer range, protocol, port range): the peers
// PeerLo..PeerHi reach (ingress) or are reached by (egress) the pod on
// protocol Proto (0: every protocol and port), ports PortLo..PortHi. An
// exact tuple has PeerLo == PeerHi and PortLo == PortHi. It holds no
// pointer (see Addr4).
type Allow struct {
	PeerLo, PeerHi Addr4
	Proto          Proto
	PortLo, PortHi uint16
}

func (a Allow) String() string {
	peer := a.PeerLo.String()
	if a.PeerHi != a.PeerLo {
		peer += "-" + a.PeerHi.String()
	}
	if a.Proto == 0 {
		return peer
	}
	port := fmt.Sprint(a.PortLo)
	if a.PortHi != a.PortLo {
		port += fmt.Sprintf("-%d", a.PortHi)
	}
	return fmt.Sprintf("%s %d/%s", peer, a.Proto, port)
}

// Pod is one local pod's rules: what the engine computes and the path
// programs.
type Pod struct {
	IP              netip.Addr // IPv4
	Ingress, Egress Dir
}
