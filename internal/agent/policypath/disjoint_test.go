package policypath

import (
	"math/rand/v2"
	"testing"
)

// TestDisjointBoxes: the boxes cover the same points and never overlap.
func TestDisjointBoxes(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		var in []box
		for range 1 + r.IntN(6) {
			p0, p1 := uint32(r.IntN(20)), uint32(r.IntN(20))
			q0, q1 := uint32(r.IntN(20)), uint32(r.IntN(20))
			in = append(in, box{span{min(p0, p1), max(p0, p1)}, span{min(q0, q1), max(q0, q1)}})
		}
		out := disjointBoxes(in)
		for x := uint32(0); x < 20; x++ {
			for y := uint32(0); y < 20; y++ {
				cin, cout := 0, 0
				for _, b := range in {
					if b.peer.lo <= x && x <= b.peer.hi && b.port.lo <= y && y <= b.port.hi {
						cin = 1
					}
				}
				for _, b := range out {
					if b.peer.lo <= x && x <= b.peer.hi && b.port.lo <= y && y <= b.port.hi {
						cout++
					}
				}
				if cin != min(cout, 1) || cout > 1 {
					t.Fatalf("point %d,%d: in %d, out %d boxes (%v -> %v)", x, y, cin, cout, in, out)
				}
			}
		}
	}
}
