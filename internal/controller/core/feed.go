package core

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"time"

	"kurma.dev/kurma/internal/controller/store"
	capi "kurma.dev/kurma/pkg/controllerapi"
)

// waiters wakes long polls when their port changes.
type waiters struct {
	mu sync.Mutex
	m  map[string]map[chan struct{}]struct{} // guarded by mu; port key -> wake channels
}

func newWaiters() *waiters { return &waiters{m: map[string]map[chan struct{}]struct{}{}} }

func (w *waiters) add(key string) chan struct{} {
	ch := make(chan struct{}, 1)
	w.mu.Lock()
	set := w.m[key]
	if set == nil {
		set = map[chan struct{}]struct{}{}
		w.m[key] = set
	}
	set[ch] = struct{}{}
	w.mu.Unlock()
	return ch
}

func (w *waiters) remove(key string, ch chan struct{}) {
	w.mu.Lock()
	if set := w.m[key]; set != nil {
		delete(set, ch)
		if len(set) == 0 {
			delete(w.m, key)
		}
	}
	w.mu.Unlock()
}

func poke(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

func (w *waiters) wake(key string) {
	w.mu.Lock()
	for ch := range w.m[key] {
		poke(ch)
	}
	w.mu.Unlock()
}

func (w *waiters) wakeAll() {
	w.mu.Lock()
	for _, set := range w.m {
		for ch := range set {
			poke(ch)
		}
	}
	w.mu.Unlock()
}

// statusOnly decodes just what the feed needs from a stored port.
type statusOnly struct {
	Status    string    `json:"status"`
	CreatedAt time.Time `json:"created_at"`
}

// counter keeps ports-by-status: a baseline counted from a snapshot plus
// the deltas of later events. Deltas that arrive before the baseline is
// known are held and applied only when newer than the snapshot.
type counter struct {
	mu      sync.Mutex
	base    map[string]float64 // guarded by mu; nil until counted
	baseRev int64              // guarded by mu
	held    []delta            // guarded by mu
}

type delta struct {
	rev      int64
	from, to string
}

func (s *Core) applyDelta(c *counter, d delta) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.base == nil {
		c.held = append(c.held, d)
		return
	}
	if d.rev <= c.baseRev {
		return
	}
	if d.from != "" {
		s.metrics.ports.WithLabelValues(d.from).Dec()
	}
	if d.to != "" {
		s.metrics.ports.WithLabelValues(d.to).Inc()
	}
}

// feed watches every port change: it wakes long polls, keeps the
// ports-by-status gauge and the create-to-UP histogram. It restarts from
// the current revision when its watch ends.
func (s *Core) feed(ctx context.Context) {
	c := &counter{}
	go func() {
		counts := map[string]float64{}
		rev, err := s.st.ForEach(ctx, "ports/", func(kv store.KV) error {
			var so statusOnly
			if json.Unmarshal(kv.Value, &so) == nil {
				counts[so.Status]++
			}
			return nil
		})
		if err != nil {
			if ctx.Err() == nil {
				s.log.Warn("counting ports failed; ports gauge shows changes only", "err", err)
			}
			counts = map[string]float64{}
		}
		c.mu.Lock()
		c.base, c.baseRev = counts, rev
		for st, n := range counts {
			s.metrics.ports.WithLabelValues(st).Set(n)
		}
		held := c.held
		c.held = nil
		c.mu.Unlock()
		for _, d := range held {
			s.applyDelta(c, d)
		}
	}()
	for ctx.Err() == nil {
		rev, err := s.st.Rev(ctx)
		if err == nil {
			var w store.Watcher
			if w, err = s.st.Watch(ctx, "ports/", rev); err == nil {
				s.waiters.wakeAll() // anything may have changed while we were away
				for ev := range w.Events() {
					s.feedEvent(c, ev)
				}
				err = w.Err()
			}
		}
		if ctx.Err() != nil {
			return
		}
		if err != nil && !errors.Is(err, store.ErrCompacted) {
			s.log.Warn("port change feed interrupted; restarting", "err", err)
		}
		s.waiters.wakeAll()
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (s *Core) feedEvent(c *counter, ev store.Event) {
	s.waiters.wake(ev.Key)
	var prev, cur statusOnly
	if ev.PrevValue != nil {
		_ = json.Unmarshal(ev.PrevValue, &prev)
	}
	if ev.Type == store.EventPut {
		_ = json.Unmarshal(ev.Value, &cur)
	}
	// The histogram first: whoever sees the gauge move sees it too.
	if prev.Status == capi.StatusPending && cur.Status == capi.StatusUp && !cur.CreatedAt.IsZero() {
		s.metrics.upLatency.Observe(time.Since(cur.CreatedAt).Seconds())
	}
	if prev.Status != cur.Status {
		s.applyDelta(c, delta{rev: ev.Rev, from: prev.Status, to: cur.Status})
	}
}
