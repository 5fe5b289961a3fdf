package main

import (
	"os"
	"testing"
)

// TestReadProcStats: this process is found, with its parent, and the CPU
// it burns shows in its ticks.
func TestReadProcStats(t *testing.T) {
	before := readProcStats()[os.Getpid()]
	x := 0
	for i := range 200_000_000 {
		x ^= i
	}
	_ = x
	after, ok := readProcStats()[os.Getpid()]
	if !ok || after.ppid != os.Getppid() {
		t.Fatalf("own stat %+v (found %v), want ppid %d", after, ok, os.Getppid())
	}
	if after.ticks <= before.ticks {
		t.Fatalf("ticks %d then %d: the loop's CPU does not show", before.ticks, after.ticks)
	}
	got := cpuDelta(cpuTimes{"a": 100}, cpuTimes{"a": 300, "b": 50}, 50)
	if got["a"] != 4 || got["b"] != 1 {
		t.Fatalf("cpuDelta = %v, want a 4 s and b 1 s per 100 pods", got)
	}
}
