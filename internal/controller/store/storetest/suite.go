package storetest

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"kurma.dev/kurma/internal/controller/store"
	"kurma.dev/kurma/pkg/kerrors"
)

// Opener returns two handles onto one fresh, empty store (the same value
// twice for single-process backends, two clients for shared ones). The
// opener registers the cleanup.
type Opener func(t *testing.T) (a, b store.Store)

// Run runs the whole suite.
func Run(t *testing.T, open Opener) {
	tests := []struct {
		name string
		fn   func(t *testing.T, a, b store.Store)
	}{
		{"GetMissing", testGetMissing},
		{"CreateOnce", testCreateOnce},
		{"ModRevCAS", testModRevCAS},
		{"AtomicFailure", testAtomicFailure},
		{"Delete", testDelete},
		{"Bits", testBits},
		{"ListPrefix", testList},
		{"WatchResume", testWatch},
		{"WatchFromListRevision", testWatchFromList},
		{"NoLostUpdate", testNoLostUpdate},
		{"ConcurrentBits", testConcurrentBits},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, b := open(t)
			tt.fn(t, a, b)
		})
	}
}

func put(k, v string) store.Op { return store.Op{Kind: store.OpPut, Key: k, Value: []byte(v)} }

func mustTxn(t *testing.T, s store.Store, txn store.Txn) int64 {
	t.Helper()
	rev, err := s.Txn(t.Context(), txn)
	if err != nil {
		t.Fatalf("txn: %v", err)
	}
	return rev
}

func testGetMissing(t *testing.T, a, _ store.Store) {
	_, err := a.Get(t.Context(), "nope")
	if !errors.Is(err, kerrors.NotFound) {
		t.Fatalf("Get missing = %v, want NotFound", err)
	}
}

func testCreateOnce(t *testing.T, a, b store.Store) {
	txn := store.Txn{Conds: []store.Cond{{Kind: store.CondAbsent, Key: "k/1"}}, Ops: []store.Op{put("k/1", "one")}}
	rev := mustTxn(t, a, txn)
	kv, err := b.Get(t.Context(), "k/1")
	if err != nil || string(kv.Value) != "one" || kv.ModRev != rev {
		t.Fatalf("Get = %+v, %v; want one@%d", kv, err, rev)
	}
	_, err = b.Txn(t.Context(), txn)
	var te *store.TxnError
	if !errors.As(err, &te) || !errors.Is(err, kerrors.Conflict) || te.Cond == nil || te.Cond.Key != "k/1" {
		t.Fatalf("second create = %v, want TxnError on k/1", err)
	}
	if _, err := a.Txn(t.Context(), store.Txn{Conds: []store.Cond{{Kind: store.CondPresent, Key: "k/2"}}, Ops: []store.Op{put("k/3", "x")}}); !errors.Is(err, kerrors.Conflict) {
		t.Fatalf("CondPresent on missing key = %v, want Conflict", err)
	}
}

func testModRevCAS(t *testing.T, a, b store.Store) {
	r1 := mustTxn(t, a, store.Txn{Ops: []store.Op{put("cas", "v1")}})
	r2 := mustTxn(t, b, store.Txn{Conds: []store.Cond{{Kind: store.CondModRev, Key: "cas", Rev: r1}}, Ops: []store.Op{put("cas", "v2")}})
	if r2 <= r1 {
		t.Fatalf("revision did not grow: %d then %d", r1, r2)
	}
	// A writer still holding r1 must lose.
	_, err := a.Txn(t.Context(), store.Txn{Conds: []store.Cond{{Kind: store.CondModRev, Key: "cas", Rev: r1}}, Ops: []store.Op{put("cas", "stale")}})
	if !errors.Is(err, kerrors.Conflict) {
		t.Fatalf("stale CAS = %v, want Conflict", err)
	}
	kv, _ := a.Get(t.Context(), "cas")
	if string(kv.Value) != "v2" || kv.ModRev != r2 {
		t.Fatalf("after CAS: %+v", kv)
	}
}

func testAtomicFailure(t *testing.T, a, b store.Store) {
	mustTxn(t, a, store.Txn{Ops: []store.Op{put("taken", "x"), {Kind: store.OpSetBit, Key: "bm", Bit: 3, Size: 8}}})
	cases := []struct {
		name string
		txn  store.Txn
	}{
		{"failed cond", store.Txn{Conds: []store.Cond{{Kind: store.CondAbsent, Key: "taken"}}, Ops: []store.Op{put("new1", "a"), put("new2", "b"), {Kind: store.OpSetBit, Key: "bm", Bit: 4}}}},
		{"taken bit", store.Txn{Ops: []store.Op{put("new1", "a"), {Kind: store.OpSetBit, Key: "bm", Bit: 5}, {Kind: store.OpSetBit, Key: "bm", Bit: 3}}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if _, err := b.Txn(t.Context(), c.txn); !errors.Is(err, kerrors.Conflict) {
				t.Fatalf("txn = %v, want Conflict", err)
			}
			for _, k := range []string{"new1", "new2"} {
				if _, err := a.Get(t.Context(), k); !errors.Is(err, kerrors.NotFound) {
					t.Errorf("%s written by a failed txn (%v)", k, err)
				}
			}
			kv, _ := a.Get(t.Context(), "bm")
			if store.BitIsSet(kv.Value, 4) || store.BitIsSet(kv.Value, 5) || !store.BitIsSet(kv.Value, 3) {
				t.Errorf("bitmap changed by a failed txn: %x", kv.Value)
			}
		})
	}
}

func testDelete(t *testing.T, a, b store.Store) {
	rev := mustTxn(t, a, store.Txn{Ops: []store.Op{put("d", "x")}})
	mustTxn(t, b, store.Txn{Conds: []store.Cond{{Kind: store.CondModRev, Key: "d", Rev: rev}}, Ops: []store.Op{{Kind: store.OpDelete, Key: "d"}, {Kind: store.OpDelete, Key: "never-existed"}}})
	if _, err := a.Get(t.Context(), "d"); !errors.Is(err, kerrors.NotFound) {
		t.Fatalf("deleted key: %v", err)
	}
	// Recreate after delete works.
	mustTxn(t, a, store.Txn{Conds: []store.Cond{{Kind: store.CondAbsent, Key: "d"}}, Ops: []store.Op{put("d", "y")}})
}

func testBits(t *testing.T, a, b store.Store) {
	set := func(bit int) error {
		_, err := a.Txn(t.Context(), store.Txn{Ops: []store.Op{{Kind: store.OpSetBit, Key: "b", Bit: bit, Size: 16}}})
		return err
	}
	for _, bit := range []int{0, 7, 8, 127} {
		if err := set(bit); err != nil {
			t.Fatalf("set %d: %v", bit, err)
		}
	}
	if err := set(7); !errors.Is(err, kerrors.Conflict) {
		t.Fatalf("set taken bit = %v, want Conflict", err)
	}
	kv, err := b.Get(t.Context(), "b")
	if err != nil || len(kv.Value) != 16 {
		t.Fatalf("bitmap = %x, %v", kv.Value, err)
	}
	for _, bit := range []int{0, 7, 8, 127} {
		if !store.BitIsSet(kv.Value, bit) {
			t.Errorf("bit %d not set", bit)
		}
	}
	mustTxn(t, b, store.Txn{Ops: []store.Op{{Kind: store.OpClearBit, Key: "b", Bit: 7}}})
	if err := set(7); err != nil {
		t.Fatalf("reuse cleared bit: %v", err)
	}
	clr := store.Txn{}
	for _, bit := range []int{0, 7, 8, 127} {
		clr.Ops = append(clr.Ops, store.Op{Kind: store.OpClearBit, Key: "b", Bit: bit})
	}
	mustTxn(t, b, clr)
	if _, err := a.Get(t.Context(), "b"); !errors.Is(err, kerrors.NotFound) {
		t.Fatalf("all-zero bitmap kept: %v", err)
	}
}

func testList(t *testing.T, a, b store.Store) {
	mustTxn(t, a, store.Txn{Ops: []store.Op{put("p/b", "2"), put("p/a", "1"), put("q/a", "x"), put("p", "bare")}})
	kvs, rev, err := b.List(t.Context(), "p/")
	if err != nil {
		t.Fatal(err)
	}
	if len(kvs) != 2 || kvs[0].Key != "p/a" || kvs[1].Key != "p/b" || string(kvs[1].Value) != "2" {
		t.Fatalf("List = %+v", kvs)
	}
	if cur, _ := b.Rev(t.Context()); rev <= 0 || rev > cur {
		t.Fatalf("list rev %d, store rev %d", rev, cur)
	}
}

func testWatch(t *testing.T, a, b store.Store) {
	r0 := mustTxn(t, a, store.Txn{Ops: []store.Op{put("w/0", "zero")}})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	// Written before the watch starts but after r0: must be replayed.
	r1 := mustTxn(t, a, store.Txn{Ops: []store.Op{put("w/1", "one"), put("other/x", "no")}})
	w, err := b.Watch(ctx, "w/", r0)
	if err != nil {
		t.Fatal(err)
	}
	r2 := mustTxn(t, a, store.Txn{Ops: []store.Op{put("w/1", "uno")}})
	r3 := mustTxn(t, b, store.Txn{Ops: []store.Op{{Kind: store.OpDelete, Key: "w/0"}}})
	want := []struct {
		typ  store.EventType
		key  string
		val  string
		prev string
		rev  int64
	}{
		{store.EventPut, "w/1", "one", "", r1},
		{store.EventPut, "w/1", "uno", "one", r2},
		{store.EventDelete, "w/0", "", "zero", r3},
	}
	for i, wt := range want {
		select {
		case ev, ok := <-w.Events():
			if !ok {
				t.Fatalf("watch ended early: %v", w.Err())
			}
			if ev.Type != wt.typ || ev.Key != wt.key || string(ev.Value) != wt.val || string(ev.PrevValue) != wt.prev || ev.Rev != wt.rev {
				t.Fatalf("event %d = %+v (value %q prev %q), want %+v", i, ev, ev.Value, ev.PrevValue, wt)
			}
		case <-ctx.Done():
			t.Fatalf("timed out waiting for event %d", i)
		}
	}
	cancel()
	for range w.Events() {
	}
}

// testWatchFromList: a watch from the revision a List returned always
// starts, however close behind a commit the List ran (a client lists,
// then watches from the list's revision), and it delivers only what came
// after that revision.
func testWatchFromList(t *testing.T, a, b store.Store) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 1)
	wg.Go(func() {
		for i := 0; ctx.Err() == nil; i++ {
			if _, err := a.Txn(ctx, store.Txn{Ops: []store.Op{put("l/"+strconv.Itoa(i%8), strconv.Itoa(i))}}); err != nil && ctx.Err() == nil {
				errs <- err
				return
			}
		}
	})
	defer func() {
		cancel()
		wg.Wait()
	}()
	for i := range 300 {
		_, rev, err := b.List(ctx, "l/")
		if err != nil {
			t.Fatalf("list %d: %v", i, err)
		}
		wctx, wcancel := context.WithCancel(ctx)
		w, err := b.Watch(wctx, "l/", rev)
		if err != nil {
			wcancel()
			t.Fatalf("watch %d from the revision its list returned (%d): %v", i, rev, err)
		}
		select {
		case ev, ok := <-w.Events():
			if ok && ev.Rev <= rev {
				wcancel()
				t.Fatalf("watch %d from %d delivered revision %d", i, rev, ev.Rev)
			}
		case err := <-errs:
			wcancel()
			t.Fatalf("writer: %v", err)
		case <-ctx.Done():
			wcancel()
			t.Fatalf("watch %d: no event while a writer commits", i)
		}
		wcancel()
		for range w.Events() {
		}
	}
}

// testNoLostUpdate: many writers on two handles increment one counter with
// compare-and-swap; every increment must survive.
func testNoLostUpdate(t *testing.T, a, b store.Store) {
	const writers, each = 6, 15
	mustTxn(t, a, store.Txn{Ops: []store.Op{put("ctr", "0")}})
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		s := a
		if w%2 == 1 {
			s = b
		}
		wg.Go(func() {
			for range each {
				for {
					kv, err := s.Get(t.Context(), "ctr")
					if err != nil {
						errs <- err
						return
					}
					n, _ := strconv.Atoi(string(kv.Value))
					_, err = s.Txn(t.Context(), store.Txn{Conds: []store.Cond{{Kind: store.CondModRev, Key: "ctr", Rev: kv.ModRev}}, Ops: []store.Op{put("ctr", strconv.Itoa(n+1))}})
					if err == nil {
						break
					}
					if !errors.Is(err, kerrors.Conflict) {
						errs <- err
						return
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	kv, _ := a.Get(t.Context(), "ctr")
	if string(kv.Value) != strconv.Itoa(writers*each) {
		t.Fatalf("counter = %s, want %d (lost updates)", kv.Value, writers*each)
	}
}

// testConcurrentBits: writers race to claim the same 64 bits; each bit must
// be won exactly once.
func testConcurrentBits(t *testing.T, a, b store.Store) {
	const writers, bits = 4, 64
	wins := make([][]int, writers)
	var wg sync.WaitGroup
	for w := range writers {
		s := a
		if w%2 == 1 {
			s = b
		}
		wg.Go(func() {
			for i := range bits {
				bit := (i + w*16) % bits
				_, err := s.Txn(t.Context(), store.Txn{Ops: []store.Op{
					{Kind: store.OpSetBit, Key: "race", Bit: bit, Size: bits / 8},
					put(fmt.Sprintf("owner/%d", bit), strconv.Itoa(w)),
				}})
				if err == nil {
					wins[w] = append(wins[w], bit)
				} else if !errors.Is(err, kerrors.Conflict) {
					t.Errorf("writer %d bit %d: %v", w, bit, err)
				}
			}
		})
	}
	wg.Wait()
	seen := map[int]int{}
	for w, ws := range wins {
		for _, bit := range ws {
			if prev, dup := seen[bit]; dup {
				t.Fatalf("bit %d won by writers %d and %d", bit, prev, w)
			}
			seen[bit] = w
		}
	}
	if len(seen) != bits {
		t.Fatalf("%d bits claimed, want %d", len(seen), bits)
	}
	kvs, _, _ := a.List(t.Context(), "owner/")
	if len(kvs) != bits {
		t.Fatalf("%d owner keys, want %d", len(kvs), bits)
	}
}
