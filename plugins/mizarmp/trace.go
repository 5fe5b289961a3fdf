package main

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"time"
)

// traceEnv, when set to 1 in the plugin's environment, makes the plugin
// print to stderr how long it ran and how much of that it spent waiting
// for the controller (the benchmark reads it).
const traceEnv = "MIZARMP_TRACE"

// waitClock measures the time during which at least one controller
// request is in flight (overlapping requests count once).
type waitClock struct {
	mu       sync.Mutex // guards inflight, since, busy and reqs
	inflight int
	since    time.Time
	busy     time.Duration
	reqs     []string // "METHOD:µs" per request, in completion order
}

func (w *waitClock) record(method string, d time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.reqs = append(w.reqs, fmt.Sprintf("%s:%d", method, d.Microseconds()))
}

func (w *waitClock) begin() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.inflight == 0 {
		w.since = time.Now()
	}
	w.inflight++
}

func (w *waitClock) end() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.inflight--
	if w.inflight == 0 {
		w.busy += time.Since(w.since)
	}
}

func (w *waitClock) total() time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.busy
}

// tracer reports the invocation's timing at exit when enabled.
type tracer struct {
	start time.Time
	clock *waitClock // nil when tracing is off
}

func newTracer() *tracer {
	t := &tracer{start: time.Now()}
	if os.Getenv(traceEnv) == "1" {
		t.clock = &waitClock{}
	}
	return t
}

// begin marks the start of a controller request named label (its
// method, or POST+WAIT / GET+WAIT / LIST); call the returned func when the
// answer has been read.
func (t *tracer) begin(label string) func() {
	if t == nil || t.clock == nil {
		return func() {}
	}
	t.clock.begin()
	start := time.Now()
	return func() {
		t.clock.record(label, time.Since(start))
		t.clock.end()
	}
}

func (t *tracer) report(verb string) {
	if t.clock == nil {
		return
	}
	total := time.Since(t.start)
	wait := t.clock.total()
	t.clock.mu.Lock()
	reqs := strings.Join(t.clock.reqs, ",")
	t.clock.mu.Unlock()
	fmt.Fprintf(os.Stderr, "mizarmp-trace verb=%s total_us=%d controller_wait_us=%d own_us=%d requests=%s\n",
		verb, total.Microseconds(), wait.Microseconds(), (total - wait).Microseconds(), reqs)
}
