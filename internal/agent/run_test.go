package agent

import (
	"context"
	"testing"
	"time"
)

// runAgent runs a until the test ends.
func runAgent(ctx context.Context, t *testing.T, a *Agent) {
	t.Helper()
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- a.Run(runCtx) }()
	t.Cleanup(func() { stop(); <-done })
}

// settle waits until a has queued n more periodic resyncs and its queue
// is idle after them: whatever those resyncs would do is done. A test
// that proves something does not happen waits on this, not on a sleep.
func settle(t *testing.T, a *Agent, n uint64) {
	t.Helper()
	target := a.resyncs.Load() + n
	deadline := time.Now().Add(20 * time.Second)
	for a.resyncs.Load() < target || !a.q.Idle() {
		if time.Now().After(deadline) {
			t.Fatalf("no %d resyncs with an idle queue within 20s (%d done, idle %v)", n, a.resyncs.Load(), a.q.Idle())
		}
		time.Sleep(2 * time.Millisecond)
	}
}
