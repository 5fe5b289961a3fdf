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

// Allow lets peers PeerLo..PeerHi reach (ingress) or be reached (egress)
// on protocol Proto, ports PortLo..PortHi; Proto 0 means every protocol
// and port.
type Allow struct {
	PeerLo, PeerHi netip.Addr
	Proto          uint8
	PortLo, PortHi uint16
}
