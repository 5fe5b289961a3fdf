package policypath

import (
	"encoding/binary"
	"math"
)

// The sets, by index into setDefs.
const (
	setInIso   = iota // ipv4: local pods isolated for ingress
	setEgIso          // ipv4: local pods isolated for egress
	setInExact        // pod . peer . proto . port
	setInPeer         // pod . peer
	setInPort         // pod . proto . port
	setInRange        // pod . peer range . proto . port range (interval)
	setInCIDR         // pod . peer range (interval)
	setEgExact
	setEgPeer
	setEgPort
	setEgRange
	setEgCIDR
	numSets
)

type setDef struct {
	name     string
	decl     string
	interval bool
	keyLen   int
}

var setDefs = [numSets]setDef{
	setInIso:   {name: "pol-in-iso", decl: "ipv4_addr", keyLen: 4},
	setEgIso:   {name: "pol-eg-iso", decl: "ipv4_addr", keyLen: 4},
	setInExact: {name: "pol-in-exact", decl: "ipv4_addr . ipv4_addr . inet_proto . inet_service", keyLen: 16},
	setInPeer:  {name: "pol-in-peer", decl: "ipv4_addr . ipv4_addr", keyLen: 8},
	setInPort:  {name: "pol-in-port", decl: "ipv4_addr . inet_proto . inet_service", keyLen: 12},
	setInRange: {name: "pol-in-range", decl: "ipv4_addr . ipv4_addr . inet_proto . inet_service", keyLen: 16, interval: true},
	setInCIDR:  {name: "pol-in-cidr", decl: "ipv4_addr . ipv4_addr", keyLen: 8, interval: true},
	setEgExact: {name: "pol-eg-exact", decl: "ipv4_addr . ipv4_addr . inet_proto . inet_service", keyLen: 16},
	setEgPeer:  {name: "pol-eg-peer", decl: "ipv4_addr . ipv4_addr", keyLen: 8},
	setEgPort:  {name: "pol-eg-port", decl: "ipv4_addr . inet_proto . inet_service", keyLen: 12},
	setEgRange: {name: "pol-eg-range", decl: "ipv4_addr . ipv4_addr . inet_proto . inet_service", keyLen: 16, interval: true},
	setEgCIDR:  {name: "pol-eg-cidr", decl: "ipv4_addr . ipv4_addr", keyLen: 8, interval: true},
}

// elem is one element: its set and key (for an interval set, the start
// key followed by the inclusive end key).
type elem struct {
	set uint8
	key string
}

// Key encodings follow nft's: each field of a concatenation is padded to
// 4 bytes, addresses and ports big-endian.
func putAddr(b []byte, a uint32) []byte { return binary.BigEndian.AppendUint32(b, a) }
func putProto(b []byte, p uint8) []byte { return append(b, p, 0, 0, 0) }
func putPort(b []byte, p uint32) []byte { return append(b, byte(p>>8), byte(p), 0, 0) }

// elementsOf lists the elements pod p needs.
func elementsOf(p *Pod) []elem {
	if p == nil || !p.IP.Is4() {
		return nil
	}
	pod := u32(p.IP)
	var out []elem
	add := func(set int, key []byte) { out = append(out, elem{uint8(set), string(key)}) }
	for d, dir := range []Dir{p.Ingress, p.Egress} {
		if !dir.Isolated {
			continue
		}
		base := 0 // offset from the ingress sets
		if d == 1 {
			base = setEgExact - setInExact
		}
		add([]int{setInIso, setEgIso}[d], putAddr(nil, pod))
		var cidrs []span
		boxes := map[uint8][]box{}
		for _, a := range dir.Allow {
			if !a.PeerLo.Is4() || !a.PeerHi.Is4() || a.PeerHi.Less(a.PeerLo) || a.PortHi < a.PortLo {
				continue
			}
			lo, hi := u32(a.PeerLo), u32(a.PeerHi)
			single, anyPeer := lo == hi, lo == 0 && hi == math.MaxUint32
			switch {
			case a.Proto == 0 && single:
				add(base+setInPeer, putAddr(putAddr(nil, pod), lo))
			case a.Proto == 0:
				cidrs = append(cidrs, span{lo, hi})
			case a.PortLo == a.PortHi && single:
				add(base+setInExact, putPort(putProto(putAddr(putAddr(nil, pod), lo), a.Proto), uint32(a.PortLo)))
			case a.PortLo == a.PortHi && anyPeer:
				add(base+setInPort, putPort(putProto(putAddr(nil, pod), a.Proto), uint32(a.PortLo)))
			default:
				boxes[a.Proto] = append(boxes[a.Proto], box{span{lo, hi}, span{uint32(a.PortLo), uint32(a.PortHi)}})
			}
		}
		for _, c := range mergeSpans(cidrs) {
			k := putAddr(putAddr(nil, pod), c.lo)
			add(base+setInCIDR, putAddr(putAddr(k, pod), c.hi))
		}
		for proto, bs := range boxes {
			for _, b := range disjointBoxes(bs) {
				k := putPort(putProto(putAddr(putAddr(nil, pod), b.peer.lo), proto), b.port.lo)
				add(base+setInRange, putPort(putProto(putAddr(putAddr(k, pod), b.peer.hi), proto), b.port.hi))
			}
		}
	}
	return out
}
