package policyrule

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// ref is the list a Dir stands for, as a set.
func ref(d Dir) map[Allow]bool {
	m := map[Allow]bool{}
	for _, a := range d.Base {
		m[a] = true
	}
	for _, a := range d.Del {
		delete(m, a)
	}
	for _, a := range d.Add {
		m[a] = true
	}
	return m
}

func sorted(m map[Allow]bool) []Allow {
	var out []Allow
	for a, ok := range m {
		if ok {
			out = append(out, a)
		}
	}
	slices.SortFunc(out, Compare)
	return out
}

// valid reports whether d keeps Dir's invariants.
func valid(d Dir) bool {
	strict := func(s []Allow) bool {
		for i := 1; i < len(s); i++ {
			if Compare(s[i-1], s[i]) >= 0 {
				return false
			}
		}
		return true
	}
	return strict(d.Base) && strict(d.Add) && strict(d.Del) && d.OverlayFits()
}

func allowN(n int) Allow {
	return Allow{PeerLo: Addr4(n / 4), PeerHi: Addr4(n / 4), Proto: 6, PortLo: uint16(n % 4), PortHi: uint16(n % 4)}
}

func TestDirWith(t *testing.T) {
	base := Dir{Isolated: true, Base: []Allow{allowN(1), allowN(3), allowN(5)}}
	for _, tc := range []struct {
		name     string
		add, del []int
		want     []int
		overlay  int
	}{
		{"nothing", nil, nil, []int{1, 3, 5}, 0},
		{"add new", []int{2}, nil, []int{1, 2, 3, 5}, 1},
		{"add present", []int{3}, nil, []int{1, 3, 5}, 0},
		{"delete base", nil, []int{1}, []int{3, 5}, 1},
		{"delete absent", nil, []int{4}, []int{1, 3, 5}, 0},
		{"both", []int{0, 6}, []int{3, 5}, []int{0, 1, 6}, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conv := func(ns []int) []Allow {
				var out []Allow
				for _, n := range ns {
					out = append(out, allowN(n))
				}
				return out
			}
			d := base.With(conv(tc.add), conv(tc.del))
			if got := d.List(); !slices.Equal(got, conv(tc.want)) {
				t.Errorf("list %v, want %v", got, conv(tc.want))
			}
			if d.Overlay() != tc.overlay || !valid(d) || !d.SameBase(base) || d.Len() != len(tc.want) {
				t.Errorf("dir %+v: overlay %d (want %d), valid %v, len %d", d, d.Overlay(), tc.overlay, valid(d), d.Len())
			}
			if len(base.Base) != 3 || base.Overlay() != 0 {
				t.Errorf("With modified its receiver: %+v", base)
			}
		})
	}
}

// TestDirRandom applies random changes through With and checks every
// accessor against a plain set, that no Dir handed out changes, and that
// compaction keeps overlays small.
func TestDirRandom(t *testing.T) {
	for seed := range uint64(20) {
		checkRandom(t, rand.New(rand.NewPCG(seed, 7)), 300)
	}
}

func FuzzDirWith(f *testing.F) {
	f.Add(uint64(1), uint16(50))
	f.Add(uint64(2), uint16(3))
	f.Fuzz(func(t *testing.T, seed uint64, steps uint16) {
		checkRandom(t, rand.New(rand.NewPCG(seed, 1)), int(steps%500))
	})
}

func checkRandom(t *testing.T, r *rand.Rand, steps int) {
	t.Helper()
	universe := 20 + r.IntN(400)
	want := map[Allow]bool{}
	var b []Allow
	for n := range universe {
		if r.IntN(2) == 0 {
			want[allowN(n)] = true
			b = append(b, allowN(n))
		}
	}
	d := Dir{Isolated: true, Base: b}
	type kept struct{ d, c Dir }
	var handed []kept
	for range steps {
		var add, del []Allow
		for n := range universe {
			switch r.IntN(60) {
			case 0:
				add = append(add, allowN(n))
				want[allowN(n)] = true
			case 1:
				del = append(del, allowN(n))
				delete(want, allowN(n))
			}
		}
		old := d
		d = d.With(add, del)
		handed = append(handed, kept{old, Dir{Isolated: true, Base: slices.Clone(old.Base), Add: slices.Clone(old.Add), Del: slices.Clone(old.Del)}})
		if !valid(d) {
			t.Fatalf("invalid dir %+v", d)
		}
		if d.Overlay() > compactAt(len(d.Base)) {
			t.Fatalf("overlay %d on a base of %d", d.Overlay(), len(d.Base))
		}
		exp := sorted(want)
		if got := d.List(); !slices.Equal(got, exp) {
			t.Fatalf("list %v, want %v", got, exp)
		}
		if got := slices.Collect(d.All()); !slices.Equal(got, exp) || d.Len() != len(exp) {
			t.Fatalf("All %v (len %d), want %v", got, d.Len(), exp)
		}
		for n := range universe {
			if d.Has(allowN(n)) != want[allowN(n)] {
				t.Fatalf("Has(%v) = %v", allowN(n), !want[allowN(n)])
			}
		}
		plain := Dir{Isolated: true, Base: exp}
		if !d.Equal(plain) || !plain.Equal(d) || d.Equal(Dir{Base: exp}) {
			t.Fatalf("Equal disagrees with the lists")
		}
		if len(exp) > 0 && d.Equal(Dir{Isolated: true, Base: exp[1:]}) {
			t.Fatalf("Equal of different lists")
		}
		if !old.Equal(old) || (len(add)+len(del) > 0 && !slices.Equal(old.List(), sorted(ref(old)))) {
			t.Fatalf("old dir broken")
		}
	}
	for i, k := range handed {
		if !slices.Equal(k.d.Base, k.c.Base) || !slices.Equal(k.d.Add, k.c.Add) || !slices.Equal(k.d.Del, k.c.Del) {
			t.Fatalf("dir %d was modified after With returned it", i)
		}
	}
}

func TestDirEqualSameBase(t *testing.T) {
	b := []Allow{allowN(1), allowN(2), allowN(3)}
	x := Dir{Isolated: true, Base: b}.With([]Allow{allowN(4)}, []Allow{allowN(2)})
	y := Dir{Isolated: true, Base: b}.With([]Allow{allowN(4)}, []Allow{allowN(2)})
	z := Dir{Isolated: true, Base: b}.With([]Allow{allowN(5)}, []Allow{allowN(2)})
	if !x.Equal(y) || x.Equal(z) || x.ID() == y.ID() {
		t.Errorf("equal %v %v, ids differ %v", x.Equal(y), x.Equal(z), x.ID() != y.ID())
	}
}
