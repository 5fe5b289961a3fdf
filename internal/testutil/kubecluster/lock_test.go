package kubecluster

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"
)

// TestHostLock: a second taker waits while the lock is held, gives up at
// its deadline without keeping the lock once it is freed, and a later
// taker gets it.
func TestHostLock(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lock")
	first, err := hostLock(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	if _, err := hostLock(ctx, path); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("second taker while held: %v, want deadline exceeded", err)
	}
	got := make(chan error, 1)
	go func() {
		f, err := hostLock(t.Context(), path)
		if err == nil {
			defer f.Close()
		}
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("third taker got the lock while it was held: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	// The abandoned second taker may win the flock first; it must drop
	// it, so the third one gets it.
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the lock was not passed on after release")
	}
}
