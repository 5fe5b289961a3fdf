package netpol

import (
	"fmt"
	"runtime"
	"testing"

	"k8s.io/apimachinery/pkg/util/intstr"

	"kurma.dev/kurma/internal/policyrule"
)

// relabel moves remote pod bench/p<i> of benchPods to peer group g and
// computes: the bench's (c).
func relabel(e *Engine, i int, g string) map[string]*Rules {
	p := *e.pods[fmt.Sprintf("bench/p%d", i)]
	p.Labels = map[string]string{"app": p.Labels["app"], "grp": g}
	e.SetPod(&p)
	return e.Compute()
}

// allocated returns the bytes the heap allocated while f ran, in the
// whole process: ReadMemStats flushes every P's cached spans, so the
// count is exact, but another goroutine's allocations (a previous test's
// informer winding down) land in it too; callers take the least of
// several runs.
func allocated(f func()) uint64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	before := m.TotalAlloc
	f()
	runtime.ReadMemStats(&m)
	return m.TotalAlloc - before
}

// TestPeerChangeWork checks what a peer's label change costs the engine
// at the bench's shape (1,000 pods, 100 local, policies alike in 10 peer
// groups): after policies were added and deleted, the weights of the
// signatures are kept, not rebuilt from every policy naming the peer
// (the first label change after (b) was the slowest); the local pods of
// one class that shared a list share the patched one; and the bytes it
// allocates are O(change): the new lists share the old ones' Base, only
// their overlays are new.
func TestPeerChangeWork(t *testing.T) {
	e := benchPods()
	const n = 2000
	for j := range n {
		_ = e.SetPolicy(benchPolicy(j))
	}
	e.Compute()
	relabel(e, 101, "g-0") // builds the weights of g-0 and g-1
	relabel(e, 101, "g-1")
	for k := range 3 {
		p := benchPolicy(0)
		p.Name = fmt.Sprintf("probe%d", k)
		p.Spec.Ingress[0].Ports[0].Port = ptr(intstr.FromInt32(int32(20000 + k)))
		_ = e.SetPolicy(p)
		e.Compute()
		if k != 1 {
			e.DeletePolicy("bench", p.Name)
			e.Compute()
		}
	}
	before := e.All()
	var ch map[string]*Rules
	bytes := allocated(func() { ch = relabel(e, 111, "g-0") })
	st := e.LastStats()
	if st.WeightsBuilt != 0 || st.Recomputed != 0 {
		t.Errorf("label change after policy changes: %+v, want no weights built, nothing recomputed", st)
	}
	// 10 local pods (5 apps, 2 pods each) gain p111 on 20 ports; 10
	// lose it on 20.
	if len(ch) != 20 {
		t.Fatalf("%d pods changed, want 20", len(ch))
	}
	lists := map[policyrule.ListID]bool{}
	total := 0
	for _, r := range ch {
		lists[r.Ingress.ID()] = true
		total += r.Ingress.Len()
	}
	if len(lists) != 10 {
		t.Errorf("%d distinct new lists for 20 pods of 10 classes, want 10", len(lists))
	}
	// The new lists (16 bytes an allow) for 10 classes, not 20, plus
	// what the change's bookkeeping takes (well under a list). The least
	// of three alike changes (p111 back to g-1 and to g-0 again), so that
	// another goroutine's allocations cannot fail the test; the engine's
	// own bytes are the same in each.
	for _, g := range []string{"g-1", "g-0"} {
		b := allocated(func() { relabel(e, 111, g) })
		if st := e.LastStats(); st.Changed != 20 || st.Recomputed != 0 {
			t.Fatalf("p111 to %s: %+v, want 20 pods changed, none recomputed", g, st)
		}
		bytes = min(bytes, b)
	}
	// Each class's new list is its old one's Base, shared, with a new
	// overlay of the change's 20 allows (policyrule.Dir.With): the bytes
	// are the overlays and bookkeeping, O(change), well under one list
	// of 2,000 allows (32 KB; before the overlays each change built ten,
	// about 350 KB).
	if limit := uint64(64 << 10); bytes > limit {
		t.Errorf("label change allocated %d bytes, want at most %d (the %d allows' 10 lists would be %d)", bytes, limit, total, total/2*16)
	}
	shared := 0
	for k, r := range ch {
		if old := before[k]; old != nil && r.Ingress.SameBase(old.Ingress) && r.Ingress.Len() > 0 {
			shared++
		}
	}
	if shared != len(ch) {
		t.Errorf("%d of %d changed lists share their Base with the old list, want all", shared, len(ch))
	}
	t.Logf("label change: %d bytes allocated, %d allows in the 20 changed lists, stats %+v", bytes, total, st)

	// The engine still equals one computed from scratch.
	f := benchPods()
	for j := range n {
		_ = f.SetPolicy(benchPolicy(j))
	}
	p := benchPolicy(0)
	p.Name = "probe1"
	p.Spec.Ingress[0].Ports[0].Port = ptr(intstr.FromInt32(20001))
	_ = f.SetPolicy(p)
	relabel(f, 111, "g-0")
	for k, r := range e.All() {
		if !r.Equal(f.Rules(k)) {
			t.Fatalf("%s: incremental rules differ from scratch", k)
		}
	}
	if len(e.All()) != len(f.All()) {
		t.Fatalf("%d local pods with rules, scratch %d", len(e.All()), len(f.All()))
	}
}

// TestOverlayCompaction: peers moved for good, one after another (each
// change lands on the overlays of the lists naming the peer's old and
// new groups), keep every list's overlay within its bound: the lists are
// compacted into new Bases as they grow, and the engine still equals one
// computed from scratch.
func TestOverlayCompaction(t *testing.T) {
	build := func() *Engine {
		e := benchPods()
		for j := range 1000 {
			_ = e.SetPolicy(benchPolicy(j))
		}
		e.Compute()
		return e
	}
	e := build()
	compacted, overlaid := 0, 0
	for k := range 150 {
		i := 101 + k
		before := e.All()
		ch := relabel(e, i, fmt.Sprintf("g-%d", (i+1+k%3)%10))
		if st := e.LastStats(); st.Recomputed != 0 || st.Changed == 0 {
			t.Fatalf("move %d: %+v, want patched pods only", k, st)
		}
		for key, r := range ch {
			for _, d := range []struct{ old, cur Dir }{{before[key].Ingress, r.Ingress}, {before[key].Egress, r.Egress}} {
				if d.cur.Overlay() > 16+len(d.cur.Base)/8 {
					t.Fatalf("move %d, %s: overlay of %d on a Base of %d", k, key, d.cur.Overlay(), len(d.cur.Base))
				}
				switch {
				case d.cur.ID() == d.old.ID():
				case d.cur.SameBase(d.old):
					overlaid++
				default:
					compacted++
				}
			}
		}
	}
	if compacted == 0 || overlaid == 0 {
		t.Errorf("%d lists compacted, %d overlaid: the test wants both", compacted, overlaid)
	}
	t.Logf("%d changed lists overlaid on their old Base, %d compacted", overlaid, compacted)
	f := build()
	for k := range 150 {
		i := 101 + k
		p := *f.pods[fmt.Sprintf("bench/p%d", i)]
		p.Labels = map[string]string{"app": p.Labels["app"], "grp": fmt.Sprintf("g-%d", (i+1+k%3)%10)}
		f.SetPod(&p)
	}
	f.Compute()
	for k, r := range f.All() {
		if !r.Equal(e.Rules(k)) {
			t.Fatalf("%s: incremental rules differ from scratch", k)
		}
	}
	if len(e.All()) != len(f.All()) {
		t.Fatalf("%d local pods with rules, scratch %d", len(e.All()), len(f.All()))
	}
}
