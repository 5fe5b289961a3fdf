package agent

import (
	"slices"
	"sync"
	"time"
)

// queue is a work queue of keys in the style of client-go's: a key is
// queued at most once however often it is added, is never handed to two
// workers at once, and a key added while it is being processed is handed
// out again after Done. Adding is cheap and never blocks. Urgent keys (a
// caller waits on them: a CNI ADD's plug) are handed out before the
// others, in the order they were made urgent.
type queue struct {
	mu         sync.Mutex // guards every field below
	cond       *sync.Cond // signalled when a key is ready or the queue shuts down
	urgentCond *sync.Cond // signalled when an urgent key is ready or the queue shuts down
	urgent     []string   // urgent keys ready to hand out, in order
	items      []string   // other keys ready to hand out, in order
	isUrgent   map[string]bool
	dirty      map[string]bool
	queuedAt   map[string]time.Time // when each dirty key was first added, for the wait metric
	processing map[string]bool
	failures   map[string]int // consecutive failures, for backoff
	timers     map[string]*time.Timer
	shutdown   bool

	base, max time.Duration // backoff bounds
}

func newQueue(base, max time.Duration) *queue {
	q := &queue{
		dirty: map[string]bool{}, processing: map[string]bool{}, queuedAt: map[string]time.Time{}, isUrgent: map[string]bool{},
		failures: map[string]int{}, timers: map[string]*time.Timer{},
		base: base, max: max,
	}
	q.cond, q.urgentCond = sync.NewCond(&q.mu), sync.NewCond(&q.mu)
	return q
}

// Add queues key now.
func (q *queue) Add(key string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.addLocked(key)
}

func (q *queue) addLocked(key string) {
	if q.shutdown || q.dirty[key] {
		return
	}
	q.dirty[key] = true
	q.queuedAt[key] = time.Now()
	if q.processing[key] {
		return // handed out again by Done
	}
	q.items = append(q.items, key)
	q.cond.Signal()
}

// AddUrgent queues key ahead of every key that is not urgent. A key
// already waiting moves to the urgent line; one being processed is handed
// out again, urgently, after Done.
func (q *queue) AddUrgent(key string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.shutdown || q.isUrgent[key] {
		return
	}
	q.isUrgent[key] = true
	if q.dirty[key] && !q.processing[key] {
		if i := slices.Index(q.items, key); i >= 0 {
			q.items = slices.Delete(q.items, i, i+1)
		}
		q.urgent = append(q.urgent, key)
		q.signalUrgent()
		return
	}
	if !q.dirty[key] {
		q.dirty[key] = true
		q.queuedAt[key] = time.Now()
		if !q.processing[key] {
			q.urgent = append(q.urgent, key)
			q.signalUrgent()
		}
	}
}

// Retry queues key after its backoff delay (doubling per consecutive
// failure, up to max) and returns that delay.
func (q *queue) Retry(key string) time.Duration {
	q.mu.Lock()
	defer q.mu.Unlock()
	n := q.failures[key]
	q.failures[key] = n + 1
	d := q.base << min(n, 20)
	if d > q.max || d <= 0 {
		d = q.max
	}
	if q.shutdown {
		return d
	}
	if t := q.timers[key]; t != nil {
		t.Stop()
	}
	q.timers[key] = time.AfterFunc(d, func() {
		q.mu.Lock()
		defer q.mu.Unlock()
		delete(q.timers, key)
		q.addLocked(key)
	})
	return d
}

// AddAfter queues key after d (without counting a failure). A key already
// waiting for a delayed add keeps the earlier one.
func (q *queue) AddAfter(key string, d time.Duration) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.shutdown || q.timers[key] != nil {
		return
	}
	q.timers[key] = time.AfterFunc(d, func() {
		q.mu.Lock()
		defer q.mu.Unlock()
		delete(q.timers, key)
		q.addLocked(key)
	})
}

// Forget clears key's failure count (after a success).
func (q *queue) Forget(key string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	delete(q.failures, key)
}

// Get blocks until a key is ready or the queue shuts down (ok false).
func (q *queue) Get() (key string, ok bool) {
	key, _, _, ok = q.GetWaited()
	return key, ok
}

// GetWaited is Get that also says how long the key waited since it was
// added (for a key added while it was processed: since that add), and
// whether it was urgent.
func (q *queue) GetWaited() (key string, waited time.Duration, urgent, ok bool) {
	return q.get(takeAny)
}

// GetUrgent is GetWaited for a worker that takes only urgent keys, so
// that a caller waiting on one never waits behind background work.
func (q *queue) GetUrgent() (key string, waited time.Duration, ok bool) {
	key, waited, _, ok = q.get(takeUrgent)
	return key, waited, ok
}

// GetPlain is GetWaited for a worker that leaves urgent keys to the
// workers of GetUrgent.
func (q *queue) GetPlain() (key string, waited time.Duration, ok bool) {
	key, waited, _, ok = q.get(takePlain)
	return key, waited, ok
}

// Which keys a worker takes.
const (
	takeAny = iota
	takeUrgent
	takePlain
)

// signalUrgent wakes a worker for a new urgent key: one of GetUrgent's,
// and one of GetWaited's (whichever comes first takes it). Callers hold
// q.mu.
func (q *queue) signalUrgent() {
	q.urgentCond.Signal()
	q.cond.Broadcast() // a worker of GetPlain may be the one woken
}

func (q *queue) get(take int) (key string, waited time.Duration, urgent, ok bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for !q.shutdown {
		if take != takePlain && len(q.urgent) > 0 || take != takeUrgent && len(q.items) > 0 {
			break
		}
		if take == takeUrgent {
			q.urgentCond.Wait()
		} else {
			q.cond.Wait()
		}
	}
	if q.shutdown {
		return "", 0, false, false
	}
	if take != takePlain && len(q.urgent) > 0 {
		key, q.urgent = q.urgent[0], q.urgent[1:]
		urgent = true
	} else {
		key, q.items = q.items[0], q.items[1:]
	}
	delete(q.dirty, key)
	delete(q.isUrgent, key)
	waited = time.Since(q.queuedAt[key])
	delete(q.queuedAt, key)
	q.processing[key] = true
	return key, waited, urgent, true
}

// Done marks key processed; if it was added meanwhile it is queued again.
func (q *queue) Done(key string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	delete(q.processing, key)
	if q.dirty[key] && !q.shutdown {
		if q.isUrgent[key] {
			q.urgent = append(q.urgent, key)
			q.signalUrgent()
		} else {
			q.items = append(q.items, key)
			q.cond.Signal()
		}
	}
}

// UrgentQueued reports whether key waits in the urgent line (added by
// AddUrgent and not yet handed out, or to be handed out again by Done).
func (q *queue) UrgentQueued(key string) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.isUrgent[key] && q.dirty[key]
}

// Len is the number of keys waiting (not counting delayed retries).
func (q *queue) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.urgent) + len(q.items)
}

// Idle reports whether no key is waiting or being synced (delayed
// retries not counted).
func (q *queue) Idle() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.dirty) == 0 && len(q.processing) == 0
}

// Shutdown wakes every Get with ok false and drops pending retries.
func (q *queue) Shutdown() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.shutdown = true
	for _, t := range q.timers {
		t.Stop()
	}
	q.cond.Broadcast()
	q.urgentCond.Broadcast()
}
