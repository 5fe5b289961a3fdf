package policypath

import (
	"encoding/binary"
	"math"

	"kurma.dev/kurma/internal/policyrule"
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
// key followed by the inclusive end key), zero-padded to maxKey. It holds
// no pointer, so the path's maps of hundreds of thousands of elements
// cost the garbage collector nothing to scan and an element nothing to
// allocate.
type elem struct {
	set uint8
	key [maxKey]byte
}

// maxKey is the longest key: an interval element of the widest
// concatenation (start and end of 16 bytes each).
const maxKey = 32

// mkElem makes the element of set with key b (at most maxKey bytes).
func mkElem(set int, b []byte) elem {
	e := elem{set: uint8(set)}
	copy(e.key[:], b)
	return e
}

// keyLen is the length of e's key: the set's, twice for an interval set.
func (e *elem) keyLen() int {
	d := setDefs[e.set]
	if d.interval {
		return 2 * d.keyLen
	}
	return d.keyLen
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
	out := make([]elem, 0, 2+p.Ingress.Len()+p.Egress.Len())
	for d, dir := range []Dir{p.Ingress, p.Egress} {
		if !dir.Isolated {
			continue
		}
		var b [4]byte
		out = append(out, mkElem([]int{setInIso, setEgIso}[d], putAddr(b[:0], pod)))
		for a := range dir.All() {
			if e, ranged, ok := exactElem(pod, d, a); ok && !ranged {
				out = append(out, e)
			}
		}
	}
	return append(out, rangedElems(p)...)
}

// dirBase is the offset of direction d's sets from the ingress ones.
func dirBase(d int) int {
	if d == 1 {
		return setEgExact - setInExact
	}
	return 0
}

// exactElem returns the element of Allow a of local pod address pod in
// direction d (0 ingress, 1 egress) when a maps to one hashed element
// (ranged false), or reports that a belongs to the interval sets (ranged
// true; those elements depend on the pod's other ranged allows, see
// rangedElems). ok is false for an invalid allow.
func exactElem(pod uint32, d int, a Allow) (e elem, ranged, ok bool) {
	if a.PeerHi < a.PeerLo || a.PortHi < a.PortLo {
		return elem{}, false, false
	}
	base := dirBase(d)
	lo, hi := uint32(a.PeerLo), uint32(a.PeerHi)
	single, anyPeer := lo == hi, lo == 0 && hi == math.MaxUint32
	var b [maxKey]byte
	switch {
	case a.Proto == 0 && single:
		return mkElem(base+setInPeer, putAddr(putAddr(b[:0], pod), lo)), false, true
	case a.Proto == 0:
		return elem{}, true, true
	case a.PortLo == a.PortHi && single:
		return mkElem(base+setInExact, putPort(putProto(putAddr(putAddr(b[:0], pod), lo), uint8(a.Proto)), uint32(a.PortLo))), false, true
	case a.PortLo == a.PortHi && anyPeer:
		return mkElem(base+setInPort, putPort(putProto(putAddr(b[:0], pod), uint8(a.Proto)), uint32(a.PortLo))), false, true
	}
	return elem{}, true, true
}

// rangedElems lists pod p's interval-set elements: its address ranges
// without ports merged, and its ranges with ports cut into disjoint boxes
// (an interval set holds no overlapping elements).
func rangedElems(p *Pod) []elem {
	if p == nil || !p.IP.Is4() {
		return nil
	}
	pod := u32(p.IP)
	var out []elem
	for d, dir := range []Dir{p.Ingress, p.Egress} {
		if !dir.Isolated {
			continue
		}
		base := dirBase(d)
		var cidrs []span
		boxes := map[uint8][]box{}
		for a := range dir.All() {
			if _, ranged, ok := exactElem(pod, d, a); !ok || !ranged {
				continue
			}
			lo, hi := uint32(a.PeerLo), uint32(a.PeerHi)
			if a.Proto == 0 {
				cidrs = append(cidrs, span{lo, hi})
			} else {
				boxes[uint8(a.Proto)] = append(boxes[uint8(a.Proto)], box{span{lo, hi}, span{uint32(a.PortLo), uint32(a.PortHi)}})
			}
		}
		var buf [maxKey]byte
		for _, c := range mergeSpans(cidrs) {
			k := putAddr(putAddr(buf[:0], pod), c.lo)
			out = append(out, mkElem(base+setInCIDR, putAddr(putAddr(k, pod), c.hi)))
		}
		for proto, bs := range boxes {
			for _, b := range disjointBoxes(bs) {
				k := putPort(putProto(putAddr(putAddr(buf[:0], pod), b.peer.lo), proto), b.port.lo)
				out = append(out, mkElem(base+setInRange, putPort(putProto(putAddr(putAddr(k, pod), b.peer.hi), proto), b.port.hi)))
			}
		}
	}
	return out
}

// strictlySorted reports whether as is sorted by policyrule.Compare without
// duplicates, holds only IPv4 peers and no ports without a protocol: then
// distinct allows have distinct exact elements.
func strictlySorted(as []Allow) bool {
	for i, a := range as {
		if (a.Proto == 0 && (a.PortLo != 0 || a.PortHi != 0)) || (i > 0 && policyrule.Compare(as[i-1], a) >= 0) {
			return false
		}
	}
	return true
}

// validDir reports whether d's list is strictly sorted with valid
// allows (strictlySorted), checking policyrule.Dir's invariants, which
// its With keeps: each slice strictly sorted, Add outside Base and Del
// within it. O(Base) without allocating, plus a lookup per overlay
// allow.
func validDir(d Dir) bool { return strictlySorted(d.Base) && validOverlay(d) }

// validOverlay is validDir's check of d's overlay alone, for a Base
// known to pass strictlySorted: O(overlay × log Base).
func validOverlay(d Dir) bool {
	return strictlySorted(d.Add) && strictlySorted(d.Del) && d.OverlayFits()
}
