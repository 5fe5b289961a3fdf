package main

import (
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// TestTimelineJoin writes a "cnid: ADD" line as the daemon's slog text
// handler does and a cnitimer line, and joins them with the pod's times.
func TestTimelineJoin(t *testing.T) {
	dir := t.TempDir()
	logPath := filepath.Join(dir, "agent.log")
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(f, nil))
	log.Info("cnid: request", "container", "c0")
	log.Info("cnid: ADD", "container", "c1", "pod", "default/many-001", "port", "pod-u1",
		"read", 40*time.Microsecond, "annotation", 500*time.Microsecond, "policy", time.Duration(0),
		"attach", 8*time.Millisecond, "took", 9*time.Millisecond, "inflight", 3)
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(1000, 0)
	timings := filepath.Join(dir, ".timings")
	line := "ADD c1 " + itoa(t0.Add(2*time.Second).UnixNano()) + " " + itoa(int64(30*time.Millisecond)) + " 0\n" +
		"ADD c2 " + itoa(t0.UnixNano()) + " 5 1\n"
	if err := os.WriteFile(timings, []byte(line), 0o644); err != nil {
		t.Fatal(err)
	}
	steps := timeline(readCalls(timings, "ADD"), readDaemonAdds(logPath),
		map[string]time.Time{"many-001": t0}, map[string]time.Time{"many-001": t0.Add(time.Second)})
	if len(steps) != 1 {
		t.Fatalf("steps %+v, want one", steps)
	}
	s := steps[0]
	if s.d.attach != 8*time.Millisecond || s.d.inflight != 3 || s.d.read != 40*time.Microsecond {
		t.Errorf("daemon side %+v", s.d)
	}
	if got := s.outside(); got != 30*time.Millisecond-9*time.Millisecond-40*time.Microsecond {
		t.Errorf("outside %v", got)
	}
	if got := s.call.start.Sub(s.created); got != 2*time.Second {
		t.Errorf("created → ADD %v", got)
	}
	printTimeline(steps)
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
