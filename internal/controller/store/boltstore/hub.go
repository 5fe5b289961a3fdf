package boltstore

import (
	"context"
	"sort"
	"strings"
	"sync"

	"kurma.dev/kurma/internal/controller/store"
	"kurma.dev/kurma/pkg/kerrors"
)

// hub keeps recent events in memory and wakes watchers. Watchers pull: each
// has a cursor and copies what is new after every wake-up, so a slow
// watcher never blocks the writer; one that falls behind the history is
// ended with ErrCompacted.
type hub struct {
	mu      sync.Mutex
	evs     []store.Event // guarded by mu; ascending Rev
	base    int64         // guarded by mu; events with Rev > base are all in evs
	last    int64         // guarded by mu; newest published revision
	keep    int
	changed chan struct{} // guarded by mu; closed and replaced on publish
	closed  bool          // guarded by mu
}

func newHub(rev int64, keep int) *hub {
	return &hub{base: rev, last: rev, keep: keep, changed: make(chan struct{})}
}

func (h *hub) publish(evs []store.Event, rev int64) {
	h.mu.Lock()
	if h.evs == nil {
		// Sized once for the whole history, so publishing never grows the
		// slice (a growth copies and leaves garbage of up to 2×keep events).
		h.evs = make([]store.Event, 0, 2*h.keep+maxBatch)
	}
	h.evs = append(h.evs, evs...)
	if len(h.evs) > 2*h.keep {
		drop := len(h.evs) - h.keep
		// Never split one revision's events.
		for drop < len(h.evs) && h.evs[drop].Rev == h.evs[drop-1].Rev {
			drop++
		}
		h.base = h.evs[drop-1].Rev
		// Compact in place; since copies what it returns under mu, so
		// no reader holds the old positions. Clear the tail so dropped
		// values can be collected.
		n := copy(h.evs, h.evs[drop:])
		clear(h.evs[n:])
		h.evs = h.evs[:n]
	}
	h.last = rev
	close(h.changed)
	h.changed = make(chan struct{})
	h.mu.Unlock()
}

func (h *hub) close() {
	h.mu.Lock()
	if !h.closed {
		h.closed = true
		close(h.changed)
	}
	h.mu.Unlock()
}

// since copies the events after rev matching prefix, scanning about max
// events (never splitting a revision); it returns the new cursor, whether
// more events are waiting, and the channel to wait on for more.
func (h *hub) since(rev int64, prefix string, max int) ([]store.Event, int64, bool, <-chan struct{}, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, rev, false, nil, kerrors.New(kerrors.Unavailable, "%v", errClosed)
	}
	if rev < h.base {
		return nil, rev, false, nil, kerrors.New(store.ErrCompacted, "revision %d compacted (history starts after %d)", rev, h.base)
	}
	i := sort.Search(len(h.evs), func(i int) bool { return h.evs[i].Rev > rev })
	var out []store.Event
	cursor := rev
	for n := 0; i < len(h.evs); i, n = i+1, n+1 {
		e := h.evs[i]
		if n >= max && e.Rev != cursor {
			break
		}
		cursor = e.Rev
		if strings.HasPrefix(e.Key, prefix) {
			out = append(out, e)
		}
	}
	more := i < len(h.evs)
	if !more && h.last > cursor {
		cursor = h.last
	}
	return out, cursor, more, h.changed, nil
}

type watcher struct {
	ch  chan store.Event
	err error // written before ch is closed
}

func (w *watcher) Events() <-chan store.Event { return w.ch }
func (w *watcher) Err() error                 { return w.err }

// Watch implements store.Store.
func (s *Store) Watch(ctx context.Context, prefix string, since int64) (store.Watcher, error) {
	if since < 0 {
		return nil, kerrors.New(kerrors.Invalid, "negative revision %d", since)
	}
	if since > s.rev.Load() {
		// The counter is set after a commit returns, so a List that read
		// the revision inside its transaction may be just ahead of it:
		// only a revision beyond the committed one is from the future
		// (e.g. from before a restore), treated as compacted so that the
		// client re-lists.
		committed, err := s.committedRev()
		if err != nil {
			return nil, err
		}
		if since > committed {
			return nil, kerrors.New(store.ErrCompacted, "revision %d is ahead of the store (%d)", since, committed)
		}
	}
	if _, _, _, _, err := s.hub.since(since, prefix, 0); err != nil {
		return nil, err
	}
	w := &watcher{ch: make(chan store.Event, 256)}
	go func() {
		defer close(w.ch)
		cursor := since
		for {
			evs, next, more, wake, err := s.hub.since(cursor, prefix, 1024)
			if err != nil {
				w.err = err
				return
			}
			cursor = next
			for _, e := range evs {
				select {
				case w.ch <- e:
				case <-ctx.Done():
					return
				}
			}
			if more {
				continue
			}
			select {
			case <-wake:
			case <-ctx.Done():
				return
			}
		}
	}()
	return w, nil
}
