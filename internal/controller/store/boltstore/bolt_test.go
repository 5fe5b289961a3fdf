package boltstore_test

import (
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"kurma.dev/kurma/internal/controller/store"
	"kurma.dev/kurma/internal/controller/store/boltstore"
	"kurma.dev/kurma/internal/controller/store/storetest"
)

func open(t *testing.T, path string, o boltstore.Options) *boltstore.Store {
	t.Helper()
	s, err := boltstore.Open(path, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) (store.Store, store.Store) {
		s := open(t, filepath.Join(t.TempDir(), "c.db"), boltstore.Options{})
		return s, s
	})
}

func TestReopenKeepsDataAndRevision(t *testing.T) {
	path := filepath.Join(t.TempDir(), "r.db")
	s, err := boltstore.Open(path, boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rev, err := s.Txn(t.Context(), store.Txn{Ops: []store.Op{{Kind: store.OpPut, Key: "a", Value: []byte("1")}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2 := open(t, path, boltstore.Options{})
	kv, err := s2.Get(t.Context(), "a")
	if err != nil || kv.ModRev != rev || string(kv.Value) != "1" {
		t.Fatalf("after reopen: %+v %v", kv, err)
	}
	// History does not survive a restart: older revisions are compacted.
	if _, err := s2.Watch(t.Context(), "", rev-1); !errors.Is(err, store.ErrCompacted) {
		t.Fatalf("watch before restart revision = %v, want ErrCompacted", err)
	}
	if r2, _ := s2.Txn(t.Context(), store.Txn{Ops: []store.Op{{Kind: store.OpPut, Key: "b"}}}); r2 != rev+1 {
		t.Fatalf("revision after reopen = %d, want %d", r2, rev+1)
	}
}

func TestHistoryCompaction(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "h.db"), boltstore.Options{History: 4, NoSync: true})
	var first int64
	for i := range 20 {
		rev, err := s.Txn(t.Context(), store.Txn{Ops: []store.Op{{Kind: store.OpPut, Key: "k", Value: []byte{byte(i)}}}})
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			first = rev
		}
	}
	if _, err := s.Watch(t.Context(), "", first); !errors.Is(err, store.ErrCompacted) {
		t.Fatalf("watch from evicted revision = %v, want ErrCompacted", err)
	}
	cur, _ := s.Rev(t.Context())
	if _, err := s.Watch(t.Context(), "", cur-2); err != nil {
		t.Fatalf("watch from recent revision: %v", err)
	}
}

func TestSecondOpenFails(t *testing.T) {
	path := filepath.Join(t.TempDir(), "l.db")
	open(t, path, boltstore.Options{})
	if s, err := boltstore.Open(path, boltstore.Options{}); err == nil {
		_ = s.Close()
		t.Fatal("second Open of a locked file succeeded")
	}
}

// TestHistoryAfterCompaction: the events kept after the history is
// compacted in place (several times over) are the newest ones, in order,
// with their values.
func TestHistoryAfterCompaction(t *testing.T) {
	for _, tc := range []struct{ history, puts, back int }{
		{history: 4, puts: 50, back: 4},
		{history: 7, puts: 100, back: 3},
		{history: 16, puts: 33, back: 16},
	} {
		t.Run(fmt.Sprintf("keep%d_puts%d", tc.history, tc.puts), func(t *testing.T) {
			s := open(t, filepath.Join(t.TempDir(), "h.db"), boltstore.Options{History: tc.history, NoSync: true})
			for i := range tc.puts {
				if _, err := s.Txn(t.Context(), store.Txn{Ops: []store.Op{{Kind: store.OpPut, Key: fmt.Sprintf("k%d", i%3), Value: []byte{byte(i)}}}}); err != nil {
					t.Fatal(err)
				}
			}
			cur, _ := s.Rev(t.Context())
			w, err := s.Watch(t.Context(), "", cur-int64(tc.back))
			if err != nil {
				t.Fatalf("watch %d back: %v", tc.back, err)
			}
			for i := tc.puts - tc.back; i < tc.puts; i++ {
				select {
				case ev := <-w.Events():
					if want := fmt.Sprintf("k%d", i%3); ev.Key != want || len(ev.Value) != 1 || ev.Value[0] != byte(i) {
						t.Fatalf("event %d: %s=%v, want %s=[%d]", i, ev.Key, ev.Value, want, i)
					}
				case <-time.After(5 * time.Second):
					t.Fatalf("event %d not delivered", i)
				}
			}
		})
	}
}
