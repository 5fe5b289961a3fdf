package nftbatch

import (
	"fmt"
	"iter"
	"slices"

	"github.com/google/nftables"

	"kurma.dev/kurma/internal/agent/nfthost"
)

const (
	// MsgElems is the most elements one netlink message carries (the
	// element list's attribute length is 16 bits).
	MsgElems = 256
	// TxOps is the most element operations one transaction carries.
	TxOps = 400000
)

// A Key places one element change: its set (and the set's order among
// the caller's sets) and whether it is a deletion.
type Key struct {
	Set   *nftables.Set
	Order int
	Del   bool
}

// Sort orders ops as they are written: deletions first, then by their
// set's order, so that each set's deletions and additions are runs.
func Sort[O any](ops []O, key func(O) Key) {
	slices.SortFunc(ops, func(a, b O) int {
		x, y := key(a), key(b)
		if x.Del != y.Del {
			if x.Del {
				return -1
			}
			return 1
		}
		return x.Order - y.Order
	})
}

// Transactions yields sorted ops (Sort) in transactions of at most
// TxOps operations, each with its runs (Runs).
func Transactions[O any](ops []O) iter.Seq[[]O] {
	return func(yield func([]O) bool) {
		for len(ops) > 0 {
			tx := ops[:min(len(ops), TxOps)]
			ops = ops[len(tx):]
			if !yield(tx) {
				return
			}
		}
	}
}

// Runs yields the runs of a transaction's sorted ops: consecutive ops of
// one set and verb, at most MsgElems each (one netlink message), with
// their Key.
func Runs[O any](tx []O, key func(O) Key) iter.Seq2[Key, []O] {
	return func(yield func(Key, []O) bool) {
		for i := 0; i < len(tx); {
			first := key(tx[i])
			j := i + 1
			for j < len(tx) && j-i < MsgElems {
				if k := key(tx[j]); k.Del != first.Del || k.Order != first.Order {
					break
				}
				j++
			}
			if !yield(first, tx[i:j]) {
				return
			}
			i = j
		}
	}
}

// Commit writes ops, which it sorts (Sort), through w (a datapath's
// nfthost.Conn, or a nfthost.Recorder in tests): key places an op, elem
// builds its element (once, when it is written). After each transaction
// is committed, committed gets the ops it held, so that the caller
// records them.
func Commit[O any](w nfthost.ElementWriter, ops []O, key func(O) Key, elem func(O) nftables.SetElement, committed func([]O)) error {
	Sort(ops, key)
	for tx := range Transactions(ops) {
		for k, run := range Runs(tx, key) {
			els := make([]nftables.SetElement, 0, len(run))
			for _, o := range run {
				els = append(els, elem(o))
			}
			var err error
			if k.Del {
				err = w.SetDeleteElements(k.Set, els)
			} else {
				err = w.SetAddElements(k.Set, els)
			}
			if err != nil {
				return err
			}
		}
		if err := w.Flush(); err != nil {
			return fmt.Errorf("nft transaction of %d changes: %w", len(tx), err)
		}
		committed(tx)
	}
	return nil
}
