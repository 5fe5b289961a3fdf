package nfthost

import (
	"sync"

	"github.com/google/nftables"
)

// Recorder is an ElementWriter that only counts: what a datapath would
// send to the kernel, in netlink messages, elements and transactions. It
// stands in for the kernel in tests of operation counts, which then need
// no root; it accepts everything.
type Recorder struct {
	mu sync.Mutex
	// Messages is the number of element messages queued (one per call of
	// SetAddElements or SetDeleteElements), Added and Deleted the
	// elements they carried, and Transactions the number of Flushes that
	// had something to commit.
	Messages, Added, Deleted, Transactions int
	// BySet counts the elements written (added or deleted) per set name.
	BySet   map[string]int
	pending int
}

var (
	_ ElementWriter = (*Recorder)(nil)
	_ Reader        = (*Recorder)(nil)
)

// ListChainsOfTableFamily, GetRules, GetSets and GetSetElements read an
// empty kernel: a datapath that reads back before it writes finds
// nothing in place and writes everything.
func (r *Recorder) ListChainsOfTableFamily(nftables.TableFamily) ([]*nftables.Chain, error) {
	return nil, nil
}

func (r *Recorder) GetRules(*nftables.Table, *nftables.Chain) ([]*nftables.Rule, error) {
	return nil, nil
}

func (r *Recorder) GetSets(*nftables.Table) ([]*nftables.Set, error) { return nil, nil }

func (r *Recorder) GetSetElements(*nftables.Set) ([]nftables.SetElement, error) { return nil, nil }

func (r *Recorder) SetAddElements(s *nftables.Set, els []nftables.SetElement) error {
	r.note(s, len(els), true)
	return nil
}

func (r *Recorder) SetDeleteElements(s *nftables.Set, els []nftables.SetElement) error {
	r.note(s, len(els), false)
	return nil
}

func (r *Recorder) note(s *nftables.Set, n int, add bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.BySet == nil {
		r.BySet = map[string]int{}
	}
	r.Messages++
	r.pending++
	r.BySet[s.Name] += n
	if add {
		r.Added += n
	} else {
		r.Deleted += n
	}
}

func (r *Recorder) Flush() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.pending > 0 {
		r.Transactions++
	}
	r.pending = 0
	return nil
}

// Reset clears the counts.
func (r *Recorder) Reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.Messages, r.Added, r.Deleted, r.Transactions, r.pending = 0, 0, 0, 0, 0
	r.BySet = nil
}
