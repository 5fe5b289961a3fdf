package policypath

import "net/netip"

// Pod is the wanted state of one local pod.
type Pod struct {
	IP              netip.Addr // IPv4
	Ingress, Egress Dir
}

// Dir is one direction: when Isolated, only what Allow lists passes.
type Dir struct {
	Isolated bool
	Allow    []Allow
}

// Addr4 is an IPv4 address as a number: unlike netip.Addr it holds no
// pointer, so the path's hundreds of thousands of Allows are not scanned
// by the garbage collector, and it compares as an integer.
type Addr4 uint32

// A4 is the Addr4 of IPv4 address a (0.0.0.0 for any other: callers pass
// IPv4 only).
func A4(a netip.Addr) Addr4 {
	if !a.Is4() {
		return 0
	}
	b := a.As4()
	return Addr4(uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3]))
}

// Allow lets peers PeerLo..PeerHi reach (ingress) or be reached (egress)
// on protocol Proto, ports PortLo..PortHi; Proto 0 means every protocol
// and port.
type Allow struct {
	PeerLo, PeerHi Addr4
	Proto          uint8
	PortLo, PortHi uint16
}
