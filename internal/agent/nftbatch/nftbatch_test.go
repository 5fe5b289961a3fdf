package nftbatch

import (
	"fmt"
	"slices"
	"testing"
)

// TestBatches: ops are sorted deletions first, then by set order; a
// transaction holds at most TxOps of them and a run at most MsgElems of
// one set and verb, so that every op is written once, in order.
func TestBatches(t *testing.T) {
	type op struct {
		set, n int
		del    bool
	}
	key := func(o op) Key { return Key{Order: o.set, Del: o.del} }
	for _, tc := range []struct {
		name string
		ops  []op
		runs []string // "verb set len" per run
	}{
		{"empty", nil, nil},
		{"one set", []op{{set: 1}, {set: 1}}, []string{"add 1 2"}},
		{"deletions first, sets in order", []op{{set: 2}, {set: 1, del: true}, {set: 0}, {set: 2, del: true}, {set: 1}},
			[]string{"del 1 1", "del 2 1", "add 0 1", "add 1 1", "add 2 1"}},
		{"a long run split per message", func() []op {
			var out []op
			for i := range MsgElems + 3 {
				out = append(out, op{set: 3, n: i})
			}
			return out
		}(), []string{fmt.Sprintf("add 3 %d", MsgElems), "add 3 3"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			Sort(tc.ops, key)
			var runs []string
			written := 0
			for tx := range Transactions(tc.ops) {
				if len(tx) > TxOps {
					t.Fatalf("a transaction of %d ops", len(tx))
				}
				for k, run := range Runs(tx, key) {
					verb := "add"
					if k.Del {
						verb = "del"
					}
					for _, o := range run {
						if o.set != k.Order || o.del != k.Del {
							t.Fatalf("op %+v in the run of %+v", o, k)
						}
					}
					runs = append(runs, fmt.Sprintf("%s %d %d", verb, k.Order, len(run)))
					written += len(run)
				}
			}
			if !slices.Equal(runs, tc.runs) || written != len(tc.ops) {
				t.Fatalf("runs %q (%d ops written), want %q (%d)", runs, written, tc.runs, len(tc.ops))
			}
		})
	}
}
