package nftbatch

import (
	"fmt"
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

// Commit writes ops, which it sorts, through w (a datapath's
// nfthost.Conn, or a nfthost.Recorder in tests): key places an op, elem
// builds its element (once, when it is written). After each transaction
// is committed, committed gets the ops it held, so that the caller
// records them.
func Commit[O any](w nfthost.ElementWriter, ops []O, key func(O) Key, elem func(O) nftables.SetElement, committed func([]O)) error {
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
	for len(ops) > 0 {
		tx := ops[:min(len(ops), TxOps)]
		ops = ops[len(tx):]
		for i := 0; i < len(tx); {
			first := key(tx[i])
			j := i + 1
			for j < len(tx) && j-i < MsgElems {
				if k := key(tx[j]); k.Del != first.Del || k.Order != first.Order {
					break
				}
				j++
			}
			els := make([]nftables.SetElement, 0, j-i)
			for _, o := range tx[i:j] {
				els = append(els, elem(o))
			}
			var err error
			if first.Del {
				err = w.SetDeleteElements(first.Set, els)
			} else {
				err = w.SetAddElements(first.Set, els)
			}
			if err != nil {
				return err
			}
			i = j
		}
		if err := w.Flush(); err != nil {
			return fmt.Errorf("nft transaction of %d changes: %w", len(tx), err)
		}
		committed(tx)
	}
	return nil
}
