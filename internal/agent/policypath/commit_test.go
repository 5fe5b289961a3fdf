package policypath

import (
	"fmt"
	"math"
	"net/netip"
	"os/exec"
	"runtime"
	"slices"
	"testing"
	"time"

	"kurma.dev/kurma/internal/agent/nettest"
	"kurma.dev/kurma/internal/policyrule"
	"kurma.dev/kurma/internal/testutil"
)

// TestApplyCommit: a change's transaction is encoded into the Path's
// kept buffer and sent on its kept connection, so that one peer's label
// change in the bench's shape (20 local pods, one peer on 20 ports each:
// 400 element operations, adds and deletions) allocates a few dozen
// objects, not several per element; the kernel holds exactly the wanted
// state after each; and a failed transaction (an element deleted behind
// the path's back) drops the connection, so that the Sync that repairs
// and the changes after it are read back right.
func TestApplyCommit(t *testing.T) {
	testutil.RequireRoot(t)
	host := nettest.NewNS(t, testutil.UniqueName("ppcm"))
	p := pathIn(t, host, "ppcm")
	dir := func(extra bool) Dir {
		d := Dir{Isolated: true}
		for peer := range 50 {
			for port := range 20 {
				if peer == 0 && !extra {
					continue
				}
				d.Base = append(d.Base, exact(netip.AddrFrom4([4]byte{10, 2, 0, byte(peer)}).String(), 6, uint16(1000+port)))
			}
		}
		slices.SortFunc(d.Base, policyrule.Compare)
		return d
	}
	plain, more := dir(false), dir(true)
	state := func(d Dir) map[string]*Pod {
		m := map[string]*Pod{}
		for i := range 20 {
			m[fmt.Sprint(i)] = &Pod{IP: netip.AddrFrom4([4]byte{10, 1, 0, byte(i)}), Ingress: d}
		}
		return m
	}
	a, b := state(plain), state(more)
	if err := p.Sync(t.Context(), a); err != nil {
		t.Fatal(err)
	}
	flip := false
	allocs := testing.AllocsPerRun(10, func() {
		next := b
		if flip {
			next = a
		}
		flip = !flip
		if err := p.Apply(t.Context(), next); err != nil {
			t.Fatal(err)
		}
	})
	if p.written != 400 {
		t.Fatalf("%d element operations, want 400", p.written)
	}
	// The library's encoding made over 4 allocations per operation
	// (1,756); now well under one.
	if allocs > 300 {
		t.Errorf("an Apply of 400 element operations made %.0f allocations, want at most 300", allocs)
	}
	t.Logf("an Apply of 400 element operations: %.0f allocations", allocs)
	cur := b // after an odd number of runs
	if got, want := kernelElems(t, p), Want(cur); !slices.Equal(got, want) {
		t.Fatalf("kernel differs from the wanted state after the changes")
	}

	// An element of pod 0 deleted behind the path's back: the Apply that
	// deletes it fails, the kernel keeps what it had.
	delete(cur, "0")
	if out, err := exec.Command("ip", "netns", "exec", nettest.Name(host), "nft", "delete", "element", "inet", "ppcm",
		setDefs[setInIso].name, "{ 10.1.0.0 }").CombinedOutput(); err != nil {
		t.Fatalf("nft delete element: %v: %s", err, out)
	}
	if err := p.Apply(t.Context(), map[string]*Pod{"0": nil}); err == nil {
		t.Fatal("an Apply deleting a missing element succeeded")
	}
	if err := p.Sync(t.Context(), cur); err != nil {
		t.Fatal(err)
	}
	cur["1"] = &Pod{IP: cur["1"].IP, Ingress: plain}
	if err := p.Apply(t.Context(), map[string]*Pod{"1": cur["1"]}); err != nil {
		t.Fatalf("the Apply after a failed one: %v", err)
	}
	if got, want := kernelElems(t, p), Want(cur); !slices.Equal(got, want) {
		t.Fatalf("kernel differs from the wanted state after the repair")
	}
}

// TestApplyOverlay: a peer's label change as the engine hands it over
// (bench (c): 20 local pods in 10 classes sharing one list each; 10 pods
// gain a peer on 20 ports, 10 lose one), where each new list is its old
// one's Base with a new overlay (policyrule.Dir.With), costs the path
// O(change), whatever the lists' length: the diffs compare the overlays
// only, and the Apply allocates no copy of a list (2,000 or 10,000
// allows: 32 KB or 160 KB each). The kernel holds exactly the wanted
// state after each change.
func TestApplyOverlay(t *testing.T) {
	testutil.RequireRoot(t)
	host := nettest.NewNS(t, testutil.UniqueName("ppov"))
	for _, tc := range []struct {
		name  string
		peers int // the Base: peers × 20 ports
	}{
		{"2,000 allows", 100},
		{"10,000 allows", 500},
	} {
		t.Run(tc.name, func(t *testing.T) {
			table := testutil.UniqueName("ppov")
			t.Cleanup(func() {
				_ = exec.Command("ip", "netns", "exec", nettest.Name(host), "nft", "delete", "table", "inet", table).Run()
			})
			p := pathIn(t, host, table) // closed before the table goes
			peer := func(i int) []Allow {
				var out []Allow
				for port := range 20 {
					out = append(out, exact(netip.AddrFrom4([4]byte{10, 2, byte(i >> 8), byte(i)}).String(), 6, uint16(1000+port)))
				}
				return out
			}
			base := Dir{Isolated: true}
			for i := range tc.peers {
				base.Base = append(base.Base, peer(i)...)
			}
			slices.SortFunc(base.Base, policyrule.Compare)
			// The classes' lists: class c's two pods; even classes gain
			// peer tc.peers+c, odd ones lose peer c.
			var plain, moved [10]Dir
			for c := range 10 {
				plain[c] = base.With(nil, nil)
				if c%2 == 0 {
					moved[c] = base.With(peer(tc.peers+c), nil)
				} else {
					moved[c] = base.With(nil, peer(c))
				}
				if !moved[c].SameBase(base) || moved[c].Overlay() != 20 {
					t.Fatalf("class %d: the change did not build an overlay on the Base", c)
				}
			}
			state := func(ds [10]Dir) map[string]*Pod {
				m := map[string]*Pod{}
				for i := range 20 {
					m[fmt.Sprint(i)] = &Pod{IP: netip.AddrFrom4([4]byte{10, 1, 0, byte(i)}), Ingress: ds[i/2]}
				}
				return m
			}
			a, b := state(plain), state(moved)
			if err := p.Sync(t.Context(), a); err != nil {
				t.Fatal(err)
			}
			// A dump of a hashed set that the kernel is still growing
			// (its table is resized after a big insert, in the
			// background) may repeat and miss elements: read until the
			// kernel's answer is stable and right, or a deadline.
			same := func(want []string) bool {
				deadline := time.Now().Add(20 * time.Second)
				for {
					got := kernelElems(t, p)
					if slices.Equal(got, want) {
						return true
					}
					if time.Now().After(deadline) {
						t.Logf("kernel %d elements, want %d", len(got), len(want))
						return false
					}
					time.Sleep(100 * time.Millisecond)
				}
			}
			if !same(Want(a)) {
				t.Fatal("after the Sync: kernel differs from the wanted state")
			}
			var least uint64 = math.MaxUint64
			for k := range 6 {
				next := b
				if k%2 == 1 {
					next = a
				}
				var m runtime.MemStats
				runtime.ReadMemStats(&m)
				before := m.TotalAlloc
				if err := p.Apply(t.Context(), next); err != nil {
					t.Fatal(err)
				}
				runtime.ReadMemStats(&m)
				least = min(least, m.TotalAlloc-before)
				// Each class's pair of lists compared once, by its
				// overlays (20 allows), not its lists.
				if p.written != 400 || p.compared != 10*20 {
					t.Fatalf("change %d: %d element operations (want 400), %d allows compared (want 200)", k, p.written, p.compared)
				}
				// (Each state read back in the small case, the last in
				// the large one: a read of 200,000 elements takes seconds.)
				if (tc.peers <= 100 || k == 5) && !same(Want(next)) {
					t.Fatalf("change %d: kernel differs from the wanted state", k)
				}
			}
			// The least of the alike changes (another goroutine's bytes
			// land in the count too).
			if least > 16<<10 {
				t.Errorf("an Apply of a 400-operation change allocated %d bytes, want at most 16 KiB (one list is %d)", least, 16*base.Len())
			}
			t.Logf("an Apply of a 400-operation change on lists of %d allows: %d bytes allocated", base.Len(), least)
		})
	}
}
