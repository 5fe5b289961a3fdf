package policypath

import (
	"fmt"
	"net/netip"
	"os/exec"
	"slices"
	"testing"

	"kurma.dev/kurma/internal/agent/nettest"
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
	p, err := New(t.Context(), Config{HostNS: host, Table: "ppcm"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
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
		slices.SortFunc(d.Base, cmpAllow)
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
