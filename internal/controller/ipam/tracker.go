package ipam

import (
	"math/bits"
	"sync"

	"kurma.dev/kurma/pkg/kerrors"
)

// Tracker proposes free addresses of one subnet from a cache of its block
// bitmaps. Proposals are reserved (pending) until Commit or Abort so that
// concurrent requests in this process never pick the same address; the
// store's bit-set is what finally guarantees uniqueness.
type Tracker struct {
	sub *Subnet

	mu      sync.Mutex
	used    map[int][]uint64 // guarded by mu; block -> bitmap words
	pending map[int][]uint64 // guarded by mu
	cursor  int64            // guarded by mu; next-fit start offset
}

const words = BlockBits / 64

// NewTracker returns a tracker with every block empty; Load the persisted
// blocks before use.
func NewTracker(s *Subnet) *Tracker {
	return &Tracker{sub: s, used: map[int][]uint64{}, pending: map[int][]uint64{}, cursor: s.pools[0].lo}
}

// Subnet returns the tracked subnet.
func (t *Tracker) Subnet() *Subnet { return t.sub }

func toWords(b []byte) []uint64 {
	w := make([]uint64, words)
	for i := 0; i < len(b) && i < BlockBytes; i++ {
		w[i/8] |= uint64(b[i]) << (8 * uint(i%8))
	}
	return w
}

// Load replaces the cached bitmap of block (nil: empty) with persisted
// bytes (bit i of the block is byte i/8, bit i%8).
func (t *Tracker) Load(block int, b []byte) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(b) == 0 {
		delete(t.used, block)
		return
	}
	t.used[block] = toWords(b)
}

func setBit(m map[int][]uint64, off int64, v bool) {
	blk, bit := Block(off)
	w := m[blk]
	if w == nil {
		if !v {
			return
		}
		w = make([]uint64, words)
		m[blk] = w
	}
	if v {
		w[bit/64] |= 1 << uint(bit%64)
	} else {
		w[bit/64] &^= 1 << uint(bit%64)
	}
}

func getBit(m map[int][]uint64, off int64) bool {
	blk, bit := Block(off)
	w := m[blk]
	return w != nil && w[bit/64]&(1<<uint(bit%64)) != 0
}

// Reserve proposes a free allocatable offset and marks it pending; false
// means the cache has none left (refresh the cache, then report Exhausted).
func (t *Tracker) Reserve() (int64, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	off, ok := t.find(t.cursor)
	if !ok && t.cursor != t.sub.pools[0].lo {
		off, ok = t.find(t.sub.pools[0].lo)
	}
	if !ok {
		return 0, false
	}
	setBit(t.pending, off, true)
	t.cursor = off + 1
	return off, true
}

// find scans spans from offset from, skipping full words.
func (t *Tracker) find(from int64) (int64, bool) {
	for _, sp := range t.sub.pools {
		if sp.hi < from {
			continue
		}
		off := max(sp.lo, from)
		for off <= sp.hi {
			blk, bit := Block(off)
			u, p := t.used[blk], t.pending[blk]
			var w uint64
			if u != nil {
				w = u[bit/64]
			}
			if p != nil {
				w |= p[bit/64]
			}
			w |= (1 << uint(bit%64)) - 1 // bits below off in this word
			if w == ^uint64(0) {
				off = (off/64 + 1) * 64
				continue
			}
			cand := off - int64(bit%64) + int64(bits.TrailingZeros64(^w))
			if cand > sp.hi {
				break
			}
			if t.sub.Allocatable(cand) {
				return cand, true
			}
			off = cand + 1
		}
	}
	return 0, false
}

// Claim marks a specific offset pending (a requested address). Conflict
// when the cache already knows it is used or pending.
func (t *Tracker) Claim(off int64) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if getBit(t.used, off) || getBit(t.pending, off) {
		return kerrors.New(kerrors.Conflict, "address %s is in use", t.sub.Addr(off))
	}
	setBit(t.pending, off, true)
	return nil
}

// Commit records that the store accepted the reservation.
func (t *Tracker) Commit(off int64) {
	t.mu.Lock()
	setBit(t.pending, off, false)
	setBit(t.used, off, true)
	t.mu.Unlock()
}

// Abort drops a reservation the store did not take; taken says the store
// reported the address as already used (by another replica).
func (t *Tracker) Abort(off int64, taken bool) {
	t.mu.Lock()
	setBit(t.pending, off, false)
	if taken {
		setBit(t.used, off, true)
	}
	t.mu.Unlock()
}

// Release records that an address was freed.
func (t *Tracker) Release(off int64) {
	t.mu.Lock()
	setBit(t.used, off, false)
	t.mu.Unlock()
}

// Used is the number of addresses the cache holds as used.
func (t *Tracker) Used() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, w := range t.used {
		for _, x := range w {
			n += bits.OnesCount64(x)
		}
	}
	return n
}
