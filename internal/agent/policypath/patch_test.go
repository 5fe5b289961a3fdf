package policypath

import (
	"bytes"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	"kurma.dev/kurma/internal/agent/nettest"
	"kurma.dev/kurma/internal/policyrule"
	"kurma.dev/kurma/internal/testutil"
)

// TestPatchEqualsFull moves pods through random changes of their allows
// (exact tuples, whole peers, ports of any peer, address ranges with and
// without ports; sorted or not; isolation and address changes) and checks
// after each that the references equal those of every pod's elements
// counted from scratch: the sorted walk of patchOwner touches exactly what
// a full diff would; and that the pending marks say what a kernel kept
// equal to the references by each commit holds.
func TestPatchEqualsFull(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 5))
	randAllow := func() Allow {
		peer := netip.AddrFrom4([4]byte{10, 0, 0, byte(r.IntN(8))})
		switch r.IntN(5) {
		case 0:
			return Allow{PeerLo: A4(peer), PeerHi: A4(peer)}
		case 1:
			return Allow{PeerLo: A4(netip.IPv4Unspecified()), PeerHi: A4(netip.AddrFrom4([4]byte{255, 255, 255, 255})), Proto: 6, PortLo: 80, PortHi: 80}
		case 2:
			hi := netip.AddrFrom4([4]byte{10, 0, 0, byte(8 + r.IntN(8))})
			return Allow{PeerLo: A4(peer), PeerHi: A4(hi)}
		case 3:
			hi := netip.AddrFrom4([4]byte{10, 0, 0, byte(8 + r.IntN(8))})
			lo := uint16(1000 + r.IntN(4))
			return Allow{PeerLo: A4(peer), PeerHi: A4(hi), Proto: 17, PortLo: lo, PortHi: lo + uint16(r.IntN(3))}
		}
		return Allow{PeerLo: A4(peer), PeerHi: A4(peer), Proto: 6, PortLo: uint16(80 + r.IntN(3)), PortHi: 0}
	}
	randDir := func() Dir {
		d := Dir{Isolated: r.IntN(5) > 0}
		for range r.IntN(8) {
			a := randAllow()
			if a.PortHi < a.PortLo {
				a.PortHi = a.PortLo
			}
			d.Base = append(d.Base, a)
		}
		if r.IntN(6) > 0 { // sorted and unique, as the engine gives them
			slices.SortFunc(d.Base, policyrule.Compare)
			d.Base = slices.CompactFunc(d.Base, func(a, b Allow) bool { return a == b })
		}
		return d
	}
	p := booksOnly()
	keys := []string{"a", "b", "c"}
	kernel := map[elem]bool{} // as commit leaves it
	for step := range 5000 {
		k := keys[r.IntN(len(keys))]
		var pod *Pod
		if r.IntN(10) > 0 {
			ip := netip.AddrFrom4([4]byte{10, 1, 0, byte(r.IntN(2))}) // addresses shared at times
			if old, ok := p.pods[k]; ok && r.IntN(4) > 0 {
				ip = old.IP
			}
			pod = &Pod{IP: ip, Ingress: randDir(), Egress: randDir()}
		}
		p.setOwner(k, pod)
		want := map[elem]int32{}
		for _, q := range p.pods {
			seen := map[elem]bool{} // an owner refers to an element once
			for _, e := range elementsOf(&q) {
				if !seen[e] {
					seen[e] = true
					want[e]++
				}
			}
		}
		if !maps.Equal(p.refs, want) {
			t.Fatalf("step %d: references %v, want %v", step, p.refs, want)
		}
		for e, had := range p.pending {
			if kernel[e] != had {
				t.Fatalf("step %d: pending says the kernel had %v: %v, it had %v", step, e, had, kernel[e])
			}
			if p.refs[e] > 0 {
				kernel[e] = true
			} else {
				delete(kernel, e)
			}
		}
		clear(p.pending)
		for e := range p.refs {
			if !kernel[e] {
				t.Fatalf("step %d: %v wanted but not pending", step, e)
			}
		}
		if len(kernel) != len(p.refs) {
			t.Fatalf("step %d: kernel %d elements, references %d", step, len(kernel), len(p.refs))
		}
	}
}

// TestReadSetEqualsLibrary: the read-back with large buffers (readSet)
// returns exactly what google/nftables' GetSetElements returns, for
// hashed and interval sets of thousands of elements (many dump messages).
func TestReadSetEqualsLibrary(t *testing.T) {
	testutil.RequireRoot(t)
	host := nettest.NewNS(t, testutil.UniqueName("pprd"))
	p := pathIn(t, host, "pprd")
	pods := map[string]*Pod{}
	for i := range 20 {
		pod := &Pod{IP: netip.AddrFrom4([4]byte{10, 1, 0, byte(i)}), Ingress: Dir{Isolated: true}, Egress: Dir{Isolated: true}}
		for k := range 500 {
			peer := netip.AddrFrom4([4]byte{10, 2, byte(k / 200), byte(k)})
			pod.Ingress.Base = append(pod.Ingress.Base, exact(peer.String(), 6, uint16(1000+k%20)),
				Allow{PeerLo: A4(peer), PeerHi: A4(peer)})
		}
		for k := range 30 {
			lo := netip.AddrFrom4([4]byte{172, 16, byte(k), 0})
			hi := netip.AddrFrom4([4]byte{172, 16, byte(k), 127})
			pod.Egress.Base = append(pod.Egress.Base, Allow{PeerLo: A4(lo), PeerHi: A4(hi), Proto: 17, PortLo: 53, PortHi: 60},
				Allow{PeerLo: A4(lo), PeerHi: A4(hi)})
		}
		pods[fmt.Sprint(i)] = pod
	}
	if err := p.Sync(t.Context(), pods); err != nil {
		t.Fatal(err)
	}
	total := 0
	for i, s := range p.sets {
		got, err := p.readSet(i)
		if err != nil {
			t.Fatal(err)
		}
		lib, err := p.conn.GetSetElements(s)
		if err != nil {
			t.Fatal(err)
		}
		var want []elem
		for _, el := range lib {
			if el.IntervalEnd {
				continue
			}
			key := el.Key
			if setDefs[i].interval {
				key = append(key, el.KeyEnd...)
			}
			want = append(want, mkElem(i, key))
		}
		cmpElem := func(a, b elem) int { return bytes.Compare(a.key[:], b.key[:]) }
		slices.SortFunc(got, cmpElem)
		slices.SortFunc(want, cmpElem)
		if !slices.Equal(got, want) {
			t.Errorf("set %s: readSet %d elements, library %d, differ", s.Name, len(got), len(want))
		}
		total += len(got)
	}
	if total < 20000 {
		t.Errorf("only %d elements read; the test wants many dump messages", total)
	}
}

// BenchmarkPatchOwner: the shape of bench/k8s/netpol's label change in
// the path, without the kernel: 20 pods of 2,000 exact allows each, one
// peer's 20 allows added to each and taken out again; the new list a
// copy with the allows in it ("copied", as the engine made them before
// policyrule.Dir's overlays), or the old list with an overlay
// ("overlay").
func BenchmarkPatchOwner(b *testing.B) {
	plain := Dir{Isolated: true}
	for peer := range 100 {
		for port := range 20 {
			a := Addr4(10<<24 | 64<<16 | peer*10)
			plain.Base = append(plain.Base, Allow{PeerLo: a, PeerHi: a, Proto: 6, PortLo: uint16(1000 + port*50), PortHi: uint16(1000 + port*50)})
		}
	}
	slices.SortFunc(plain.Base, policyrule.Compare)
	var extra []Allow
	for port := range 20 {
		a := Addr4(10<<24 | 64<<16 | 5)
		extra = append(extra, Allow{PeerLo: a, PeerHi: a, Proto: 6, PortLo: uint16(1000 + port*50), PortHi: uint16(1000 + port*50)})
	}
	copied := Dir{Isolated: true, Base: append(slices.Clone(plain.Base), extra...)}
	slices.SortFunc(copied.Base, policyrule.Compare)
	pods := func(d Dir) map[string]*Pod {
		m := map[string]*Pod{}
		for i := range 20 {
			m[fmt.Sprint(i)] = &Pod{IP: netip.AddrFrom4([4]byte{10, 64, 0, byte(i)}), Ingress: d}
		}
		return m
	}
	for _, bc := range []struct {
		name string
		more Dir
	}{
		{"copied", copied},
		{"overlay", plain.With(extra, nil)},
	} {
		b.Run(bc.name, func(b *testing.B) {
			p := booksOnly()
			a, c := pods(plain), pods(bc.more)
			for k, pod := range a {
				p.setOwner(k, pod)
			}
			clear(p.pending)
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				next := c
				if i%2 == 1 {
					next = a
				}
				for k, pod := range next {
					p.setOwner(k, pod)
				}
				clear(p.pending)
			}
		})
	}
}

// TestSharedListsWalkedOnce: in one Apply, pods that had the same list
// and get the same new one (replicas, as the engine hands them out) are
// walked once for all of them; a pod with other lists, or lists out of
// order, is walked (or diffed in full) on its own; and the references
// equal those of every pod's elements counted from scratch.
func TestSharedListsWalkedOnce(t *testing.T) {
	mk := func(peers, ports int, sorted bool) Dir {
		d := Dir{Isolated: true}
		for peer := range peers {
			for port := range ports {
				a := Addr4(10<<24 | 64<<16 | peer)
				d.Base = append(d.Base, Allow{PeerLo: a, PeerHi: a, Proto: 6, PortLo: uint16(1000 + port), PortHi: uint16(1000 + port)})
			}
		}
		if sorted {
			slices.SortFunc(d.Base, policyrule.Compare)
		} else {
			slices.Reverse(d.Base)
		}
		return d
	}
	old, cur, other := mk(10, 5, true), mk(11, 5, true), mk(9, 5, true)
	// The engine's way: cur's extra allows as an overlay on old's Base;
	// and an overlay out of order on it (checked, then diffed in full).
	extra := slices.DeleteFunc(slices.Clone(cur.Base), old.Has)
	ov := old.With(extra, nil)
	bad := Dir{Isolated: true, Base: old.Base, Add: slices.Clone(extra)}
	slices.Reverse(bad.Add)
	for _, tc := range []struct {
		name  string
		next  []Dir // per pod, after old
		walks int   // distinct pairs walked
	}{
		{"all alike", []Dir{cur, cur, cur, cur}, 1},
		{"two new lists", []Dir{cur, other, cur, other}, 2},
		{"unsorted", []Dir{cur, mk(11, 5, false), cur, cur}, 2},
		{"overlays", []Dir{ov, ov, ov, ov}, 1},
		{"overlay out of order", []Dir{ov, bad, ov, ov}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := booksOnly()
			for i := range tc.next {
				p.setOwner(fmt.Sprint(i), &Pod{IP: netip.AddrFrom4([4]byte{10, 1, 0, byte(i)}), Ingress: old})
			}
			var w walks
			for i, d := range tc.next {
				p.setOwnerWith(fmt.Sprint(i), &Pod{IP: netip.AddrFrom4([4]byte{10, 1, 0, byte(i)}), Ingress: d}, &w)
			}
			if len(w.m) != tc.walks {
				t.Errorf("%d pairs of lists walked, want %d", len(w.m), tc.walks)
			}
			// A pod's lists are marked checked exactly when they are
			// valid (a later overlay on them then skips the Base).
			for i, d := range tc.next {
				if got := p.checked[fmt.Sprint(i)]; got != validDir(d) {
					t.Errorf("pod %d: checked %v, its list valid %v", i, got, validDir(d))
				}
			}
			want := map[elem]int32{}
			for _, q := range p.pods {
				for _, e := range elementsOf(&q) {
					want[e]++
				}
			}
			if !maps.Equal(p.refs, want) {
				t.Errorf("references differ from the pods' elements counted from scratch")
			}
		})
	}
}

// booksOnly is a Path with its bookkeeping alone (no kernel): what
// setOwner and patchOwner use.
func booksOnly() *Path {
	p := &Path{}
	p.resetBooks(0, 0)
	return p
}
