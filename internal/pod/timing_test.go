package pod

import (
	"log/slog"
	"os"
	"sort"
	"testing"
	"time"
)

// TestStartTimings reports how long create, stop and remove take with the
// real stager and store (cached image); it fails only when a full cycle is
// far slower than the few-millisecond target allows.
func TestStartTimings(t *testing.T) {
	if testing.Short() {
		t.Skip("timing")
	}
	ri := newRealImages(t)
	f := newRealFixture(t, ri)
	if os.Getenv("KPOD_DEBUG") != "" {
		f.rt.log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	ctx := t.Context()
	var creates, stops, removes []time.Duration
	for range 10 {
		t0 := time.Now()
		p, err := f.rt.Create(ctx, Spec{Name: "kpod-timing", Apps: []AppSpec{{Image: ri.busybox, Exec: []string{"/bin/true"}}}})
		if err != nil {
			t.Fatal(err)
		}
		t1 := time.Now()
		if err := f.rt.Stop(ctx, p.UUID, 5*time.Second); err != nil {
			t.Fatal(err)
		}
		t2 := time.Now()
		if err := f.rt.Remove(ctx, p.UUID, false); err != nil {
			t.Fatal(err)
		}
		creates, stops, removes = append(creates, t1.Sub(t0)), append(stops, t2.Sub(t1)), append(removes, time.Since(t2))
	}
	med := func(d []time.Duration) time.Duration {
		sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
		return d[len(d)/2]
	}
	t.Logf("median create %v, stop %v, remove %v", med(creates), med(stops), med(removes))
	if total := med(creates) + med(stops) + med(removes); total > 5*time.Second {
		t.Errorf("a pod cycle takes %v", total)
	}
}
