package policyrule

import (
	"cmp"
	"iter"
	"slices"
)

// Dir is one direction of a pod's rules: when Isolated, only the
// allows of its list pass. The list is persistent: a shared, immutable
// Base plus a small overlay of changes against it, Add (allows not in
// Base) and Del (allows of Base taken out), so that a change of a few
// allows builds a new overlay, O(overlay), instead of a copy of the
// whole list (a label change's ~10 new lists of ~2,000 allows were
// ~320 KB of garbage, one GC cycle every ~16 changes). The list a Dir
// stands for is (Base minus Del) plus Add; read it through All, List,
// Len, Has or Equal, never through Base alone.
//
// Base, Add and Del are each sorted by Compare without duplicates; Add
// and Base are disjoint and Del is within Base (With keeps this; a Dir
// built by hand has no overlay). The list is empty unless Isolated. No
// slice of a Dir is ever modified once the Dir is handed out: Dirs
// share their slices.
type Dir struct {
	Isolated bool
	Base     []Allow
	Add, Del []Allow
}

// Compare orders allows by peer range, protocol and port range,
// comparing the fields packed into two integers.
func Compare(a, b Allow) int {
	ah, al := a.key()
	bh, bl := b.key()
	if ah != bh {
		if ah < bh {
			return -1
		}
		return 1
	}
	return cmp.Compare(al, bl)
}

// key packs a's fields, in Compare's order, into two integers.
func (a Allow) key() (hi, lo uint64) {
	return uint64(a.PeerLo)<<32 | uint64(a.PeerHi), uint64(a.Proto)<<32 | uint64(a.PortLo)<<16 | uint64(a.PortHi)
}

// Len is the length of d's list.
func (d Dir) Len() int { return len(d.Base) - len(d.Del) + len(d.Add) }

// Overlay is the size of d's overlay.
func (d Dir) Overlay() int { return len(d.Add) + len(d.Del) }

// Cursor walks a Dir's list in order without allocating.
type Cursor struct {
	b, a, d []Allow
}

// Cursor returns a cursor at the start of d's list.
func (d Dir) Cursor() Cursor { return Cursor{d.Base, d.Add, d.Del} }

// Next returns the next allow of the list (false at its end).
func (c *Cursor) Next() (Allow, bool) {
	for len(c.b) > 0 {
		if len(c.d) > 0 && c.d[0] == c.b[0] {
			c.b, c.d = c.b[1:], c.d[1:]
			continue
		}
		break
	}
	switch {
	case len(c.b) == 0 && len(c.a) == 0:
		return Allow{}, false
	case len(c.a) == 0 || (len(c.b) > 0 && Compare(c.b[0], c.a[0]) < 0):
		x := c.b[0]
		c.b = c.b[1:]
		return x, true
	default:
		x := c.a[0]
		c.a = c.a[1:]
		return x, true
	}
}

// All yields d's list in order.
func (d Dir) All() iter.Seq[Allow] {
	return func(yield func(Allow) bool) {
		c := d.Cursor()
		for a, ok := c.Next(); ok; a, ok = c.Next() {
			if !yield(a) {
				return
			}
		}
	}
}

// List returns d's list: Base itself when there is no overlay (not to
// be modified), a new slice otherwise.
func (d Dir) List() []Allow {
	if d.Overlay() == 0 {
		return d.Base
	}
	return slices.AppendSeq(make([]Allow, 0, d.Len()), d.All())
}

// contains reports whether s, sorted by Compare, holds a.
func contains(s []Allow, a Allow) bool {
	_, ok := slices.BinarySearchFunc(s, a, Compare)
	return ok
}

// Has reports whether d's list holds a.
func (d Dir) Has(a Allow) bool {
	return contains(d.Add, a) || !contains(d.Del, a) && contains(d.Base, a)
}

// OverlayFits reports whether d's overlay fits its Base as With keeps
// it: no allow of Add in Base, every allow of Del in it (each slice
// sorted). O(overlay × log Base).
func (d Dir) OverlayFits() bool {
	for _, a := range d.Add {
		if contains(d.Base, a) {
			return false
		}
	}
	for _, a := range d.Del {
		if !contains(d.Base, a) {
			return false
		}
	}
	return true
}

// ListID identifies a Dir's list by the identity of its slices (their
// first elements' addresses and lengths): two Dirs of one ListID share
// every slice, so they hold the same list. A comparable map key.
type ListID struct {
	b, a, d    *Allow
	nb, na, nd int
}

func first(s []Allow) *Allow {
	if len(s) == 0 {
		return nil
	}
	return &s[0]
}

// ID returns d's ListID.
func (d Dir) ID() ListID {
	return ListID{first(d.Base), first(d.Add), first(d.Del), len(d.Base), len(d.Add), len(d.Del)}
}

// SameBase reports whether d and o share their Base slice.
func (d Dir) SameBase(o Dir) bool {
	return len(d.Base) == len(o.Base) && first(d.Base) == first(o.Base)
}

// Equal reports whether d and o are isolated alike with the same list:
// at once when they share their slices, O(overlays) when they share a
// Base, else by walking both.
func (d Dir) Equal(o Dir) bool {
	if d.Isolated != o.Isolated || d.Len() != o.Len() {
		return false
	}
	if d.ID() == o.ID() {
		return true
	}
	if d.SameBase(o) {
		return slices.Equal(d.Add, o.Add) && slices.Equal(d.Del, o.Del)
	}
	c, e := d.Cursor(), o.Cursor()
	for {
		x, ok := c.Next()
		y, _ := e.Next()
		if !ok {
			return true
		}
		if x != y {
			return false
		}
	}
}

// With returns d with each allow of add in its list and each of del out
// of it (add and del sorted by Compare, without duplicates, disjoint),
// d itself when both are empty. It builds a new overlay, O(overlay + changes) (and a
// lookup of each change in Base), sharing d's Base; when the overlay
// grows past compactAt of the Base, it builds a new Base instead, with
// an empty overlay: O(list), once every len(Base)/8 or more changed
// allows, so O(1) amortized per allow changed. d is not modified.
func (d Dir) With(add, del []Allow) Dir {
	if len(add) == 0 && len(del) == 0 {
		return d
	}
	// Split the changes by whether Base holds them: an addition of a
	// Base allow undoes its deletion, a deletion of a non-Base allow
	// undoes its addition.
	buf := make([]Allow, len(add)+len(del))
	addNew, addBack := d.split(add, buf[:len(add)])
	delNew, delBase := d.split(del, buf[len(add):])
	n := Dir{Isolated: d.Isolated, Base: d.Base,
		Add: mergeMinus(d.Add, addNew, delNew),
		Del: mergeMinus(d.Del, delBase, addBack)}
	if n.Overlay() > compactAt(len(n.Base)) {
		return Dir{Isolated: n.Isolated, Base: n.List()}
	}
	return n
}

// split copies changes (sorted) into buf, which has their length, and
// returns them in two sorted parts: those not in d.Base, then those in it.
func (d Dir) split(changes, buf []Allow) (out, in []Allow) {
	i, j := 0, len(buf)
	for _, a := range changes {
		if contains(d.Base, a) {
			j--
			buf[j] = a
		} else {
			buf[i] = a
			i++
		}
	}
	in = buf[j:]
	slices.Reverse(in)
	return buf[:i], in
}

// compactAt is the largest overlay kept on a Base of n allows: with a
// change of k allows, an overlay of about T costs a copy of T/2 allows
// on average and a compaction of n every T/k changes, least near
// T = sqrt(2nk); n/8 is that for k = 16 at n = 2,000 (bench/k8s/netpol's
// label change flips 20 allows of lists of 2,000).
func compactAt(n int) int { return 16 + n/8 }

// mergeMinus returns (x ∪ plus) \ minus as a new sorted slice (nil when
// empty): x, plus and minus sorted without duplicates.
func mergeMinus(x, plus, minus []Allow) []Allow {
	out := make([]Allow, 0, len(x)+len(plus))
	i, j, k := 0, 0, 0
	for i < len(x) || j < len(plus) {
		var a Allow
		switch {
		case j == len(plus) || (i < len(x) && Compare(x[i], plus[j]) < 0):
			a = x[i]
			i++
		case i == len(x) || Compare(x[i], plus[j]) > 0:
			a = plus[j]
			j++
		default:
			a = x[i]
			i++
			j++
		}
		for k < len(minus) && Compare(minus[k], a) < 0 {
			k++
		}
		if k < len(minus) && minus[k] == a {
			continue
		}
		out = append(out, a)
	}
	if len(out) == 0 {
		return nil
	}
	return out
}
