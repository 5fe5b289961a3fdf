package policypath

import (
	"net/netip"

	"kurma.dev/kurma/internal/policyrule"
)

// The path's wanted state is in policyrule's types, shared with the
// policy engine, so the engine's allow lists reach the path uncopied.
type (
	// Pod is the wanted state of one local pod.
	Pod = policyrule.Pod
	// Dir is one direction: when Isolated, only what its list (Base with
	// its overlay, see policyrule.Dir) allows passes.
	Dir = policyrule.Dir
	// Addr4 is an IPv4 address as a number (see policyrule.Addr4).
	Addr4 = policyrule.Addr4
	// Allow lets peers PeerLo..PeerHi reach (ingress) or be reached
	// (egress) on protocol Proto, ports PortLo..PortHi; Proto 0 means
	// every protocol and port.
	Allow = policyrule.Allow
)

// A4 is the Addr4 of IPv4 address a (0.0.0.0 for any other: callers pass
// IPv4 only).
func A4(a netip.Addr) Addr4 { return policyrule.A4(a) }
