package policypath

import (
	"net/netip"
	"slices"
	"testing"

	"kurma.dev/kurma/internal/agent/nettest"
	"kurma.dev/kurma/internal/policyrule"
	"kurma.dev/kurma/internal/testutil"
)

// TestResyncWritesDifference: a second Sync in the same process writes
// only what differs from the first (nothing when nothing did), and still
// rewrites everything when the kernel lost elements or sets behind its
// back: each step ends with the kernel holding exactly the wanted state.
func TestResyncWritesDifference(t *testing.T) {
	testutil.RequireRoot(t)
	host := nettest.NewNS(t, testutil.UniqueName("pprs"))
	p := pathIn(t, host, "pprs")
	nft := func(args ...string) {
		t.Helper()
		testutil.Run(t, "ip", append([]string{"netns", "exec", nettest.Name(host), "nft"}, args...)...)
	}
	mk := func(port uint16) map[string]*Pod {
		pods := map[string]*Pod{}
		for i := range 3 {
			pod := &Pod{IP: netip.AddrFrom4([4]byte{10, 1, 0, byte(i)}), Ingress: Dir{Isolated: true}, Egress: Dir{Isolated: true}}
			for k := range 5 {
				pod.Ingress.Base = append(pod.Ingress.Base, exact(netip.AddrFrom4([4]byte{10, 2, 0, byte(k)}).String(), 6, port))
			}
			pod.Ingress.Base = append(pod.Ingress.Base, Allow{PeerLo: A4(netip.MustParseAddr("172.16.0.0")), PeerHi: A4(netip.MustParseAddr("172.16.0.255")), Proto: 17, PortLo: 53, PortHi: 60})
			pod.Egress.Base = []Allow{{PeerLo: A4(netip.MustParseAddr("10.3.0.1")), PeerHi: A4(netip.MustParseAddr("10.3.0.1"))}}
			slices.SortFunc(pod.Ingress.Base, policyrule.Compare)
			pods[string(rune('a'+i))] = pod
		}
		return pods
	}
	full := len(Want(mk(80)))
	for _, step := range []struct {
		name   string
		before func()
		pods   map[string]*Pod
		writes int
	}{
		{name: "first sync", pods: mk(80), writes: full},
		{name: "same state", pods: mk(80), writes: 0},
		// One pod's 5 exact elements change port: 5 deletions, 5 additions.
		{name: "one pod changed", pods: func() map[string]*Pod {
			m := mk(80)
			m["b"] = mk(81)["b"]
			return m
		}(), writes: 10},
		{name: "one pod gone", pods: func() map[string]*Pod {
			m := mk(80)
			delete(m, "b")
			m["c"] = nil
			return m
		}(), writes: full / 3 * 2}, // b (at port 81) and c: 9 elements each
		{name: "an element deleted by hand", before: func() {
			nft("delete", "element", "inet", "pprs", "pol-eg-peer", "{ 10.1.0.0 . 10.3.0.1 }")
		}, pods: mk(80), writes: full},
		{name: "a set flushed by hand", before: func() { nft("flush", "set", "inet", "pprs", "pol-in-exact") }, pods: mk(80), writes: full},
		{name: "the table deleted", before: func() { nft("delete", "table", "inet", "pprs") }, pods: mk(80), writes: full},
		{name: "same state again", pods: mk(80), writes: 0},
	} {
		if step.before != nil {
			step.before()
		}
		if err := p.Sync(t.Context(), step.pods); err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		if got, want := kernelElems(t, p), Want(step.pods); !slices.Equal(got, want) {
			t.Fatalf("%s: kernel\n%v\nwant\n%v", step.name, got, want)
		}
		if p.written != step.writes {
			t.Errorf("%s: %d element operations, want %d", step.name, p.written, step.writes)
		}
	}
}

// TestFullTxFails: a full transaction the kernel refuses (here, elements
// for a set that does not exist after the flush of one that does)
// reports the kernel's error and applies nothing, not even its flush.
func TestFullTxFails(t *testing.T) {
	testutil.RequireRoot(t)
	host := nettest.NewNS(t, testutil.UniqueName("pptf"))
	p := pathIn(t, host, "pptf")
	pods := map[string]*Pod{"a": {IP: ip("10.0.0.10"), Ingress: Dir{Isolated: true, Base: []Allow{exact("10.0.0.11", 6, 80)}}}}
	if err := p.Sync(t.Context(), pods); err != nil {
		t.Fatal(err)
	}
	tx := &fullTx{}
	tx.begin()
	tx.flushSet("pptf", setDefs[setInExact].name)
	tx.addElems("pptf", setDef{name: "pol-none", keyLen: 4}, []elem{mkElem(setInIso, []byte{10, 0, 0, 1})})
	tx.finish()
	if err := p.send(tx); err == nil {
		t.Fatal("a transaction naming a missing set succeeded")
	}
	if got, want := kernelElems(t, p), Want(pods); !slices.Equal(got, want) {
		t.Fatalf("after the failed transaction:\n%v\nwant\n%v", got, want)
	}
}
