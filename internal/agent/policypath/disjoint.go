package policypath

import (
	"encoding/binary"
	"net/netip"
	"slices"
)

// span is an inclusive range of uint32 (addresses) or of ports.
type span struct{ lo, hi uint32 }

// box is a peer range times a port range.
type box struct{ peer, port span }

func u32(a netip.Addr) uint32 { b := a.As4(); return binary.BigEndian.Uint32(b[:]) }

// mergeSpans sorts spans and merges those that overlap or touch.
func mergeSpans(in []span) []span {
	s := slices.Clone(in)
	slices.SortFunc(s, func(a, b span) int {
		if a.lo != b.lo {
			if a.lo < b.lo {
				return -1
			}
			return 1
		}
		return 0
	})
	var out []span
	for _, x := range s {
		if n := len(out); n > 0 && uint64(x.lo) <= uint64(out[n-1].hi)+1 {
			out[n-1].hi = max(out[n-1].hi, x.hi)
			continue
		}
		out = append(out, x)
	}
	return out
}

// disjointBoxes returns boxes covering the same points as in, none of
// which overlap: the peer axis is cut at every box edge, each piece gets
// the merged port ranges of the boxes over it, and neighbouring pieces
// with equal port ranges are joined again.
func disjointBoxes(in []box) []box {
	if len(in) <= 1 {
		return in
	}
	var cuts []uint64
	for _, b := range in {
		cuts = append(cuts, uint64(b.peer.lo), uint64(b.peer.hi)+1)
	}
	slices.Sort(cuts)
	cuts = slices.Compact(cuts)
	type piece struct {
		peer  span
		ports []span
	}
	var pieces []piece
	for i := 0; i+1 < len(cuts); i++ {
		lo, hi := uint32(cuts[i]), uint32(cuts[i+1]-1)
		var ports []span
		for _, b := range in {
			if b.peer.lo <= lo && hi <= b.peer.hi {
				ports = append(ports, b.port)
			}
		}
		if len(ports) == 0 {
			continue
		}
		ports = mergeSpans(ports)
		if n := len(pieces); n > 0 && uint64(pieces[n-1].peer.hi)+1 == uint64(lo) && slices.Equal(pieces[n-1].ports, ports) {
			pieces[n-1].peer.hi = hi
			continue
		}
		pieces = append(pieces, piece{span{lo, hi}, ports})
	}
	var out []box
	for _, p := range pieces {
		for _, pt := range p.ports {
			out = append(out, box{p.peer, pt})
		}
	}
	return out
}
