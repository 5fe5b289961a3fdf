package store

import (
	"context"
	"errors"
	"fmt"

	"kurma.dev/kurma/pkg/kerrors"
)

// KV is one stored key with the revision of its last modification.
type KV struct {
	Key    string
	Value  []byte
	ModRev int64
}

// CondKind says what a Cond checks.
type CondKind int

const (
	// CondAbsent holds when the key does not exist.
	CondAbsent CondKind = iota + 1
	// CondPresent holds when the key exists.
	CondPresent
	// CondModRev holds when the key exists with ModRev == Cond.Rev.
	CondModRev
)

// Cond is one precondition of a transaction.
type Cond struct {
	Kind CondKind
	Key  string
	Rev  int64
}

// OpKind says what an Op does.
type OpKind int

const (
	// OpPut stores Value under Key.
	OpPut OpKind = iota + 1
	// OpDelete removes Key; a missing key is not an error.
	OpDelete
	// OpSetBit sets bit Bit in the bitmap stored under Key (a key that does
	// not exist is a zero bitmap of Size bytes). The transaction fails with
	// a *TxnError (Conflict) when the bit is already set.
	OpSetBit
	// OpClearBit clears bit Bit; clearing a clear bit or a missing key is
	// not an error. A bitmap that becomes all zeros is deleted.
	OpClearBit
)

// Op is one write of a transaction.
type Op struct {
	Kind  OpKind
	Key   string
	Value []byte
	Bit   int
	Size  int // bitmap size in bytes, for OpSetBit on a missing key
}

// Txn is applied atomically: all conditions hold and all bit sets are
// possible, then every op is applied under one new revision; otherwise
// nothing changes.
type Txn struct {
	Conds []Cond
	Ops   []Op
}

// TxnError reports the first condition or bit operation that failed. It
// wraps kerrors.Conflict.
type TxnError struct {
	Cond *Cond // the failed condition, or nil
	Op   *Op   // the failed bit set, or nil
}

func (e *TxnError) Error() string {
	if e.Cond != nil {
		switch e.Cond.Kind {
		case CondAbsent:
			return fmt.Sprintf("key %q exists", e.Cond.Key)
		case CondPresent:
			return fmt.Sprintf("key %q does not exist", e.Cond.Key)
		default:
			return fmt.Sprintf("key %q changed (want revision %d)", e.Cond.Key, e.Cond.Rev)
		}
	}
	if e.Op != nil {
		return fmt.Sprintf("bit %d of %q is already set", e.Op.Bit, e.Op.Key)
	}
	return "transaction failed"
}

func (e *TxnError) Unwrap() error { return kerrors.Conflict }

// EventType is PUT or DELETE.
type EventType int

const (
	EventPut EventType = iota + 1
	EventDelete
)

// Event is one change seen by a watch. Value is the new value (PUT) and
// PrevValue the value before (both for DELETE: Value is nil).
type Event struct {
	Type      EventType
	Key       string
	Value     []byte
	PrevValue []byte
	Rev       int64
}

// ErrCompacted is returned (wrapped) by Watch when the requested revision
// is no longer available; the caller re-lists and watches from the list's
// revision.
var ErrCompacted = errors.New("revision compacted")

// Store is the controller's persistence. Errors: NotFound for missing keys
// in Get, *TxnError (Conflict) for failed transactions, Unavailable when
// the backend cannot be reached, ErrCompacted from Watch.
type Store interface {
	// Get returns one key.
	Get(ctx context.Context, key string) (KV, error)
	// List returns every key with the prefix, in key order, and the
	// revision the snapshot was read at.
	List(ctx context.Context, prefix string) ([]KV, int64, error)
	// ForEach calls fn for every key with the prefix, in key order, from
	// one consistent snapshot, without holding them all in memory; it
	// returns the snapshot's revision. An error from fn stops it.
	ForEach(ctx context.Context, prefix string, fn func(KV) error) (int64, error)
	// Txn applies t atomically and returns its revision.
	Txn(ctx context.Context, t Txn) (int64, error)
	// Watch streams events on keys with the prefix whose revision is
	// greater than since, in revision order, until ctx ends or an error
	// occurs (then the channel carries no more events and Err reports
	// why). A watch that cannot keep up is ended with an Unavailable error;
	// resume from the last revision seen.
	Watch(ctx context.Context, prefix string, since int64) (Watcher, error)
	// Rev returns the current store revision.
	Rev(ctx context.Context) (int64, error)
	Close() error
}

// Watcher is a running watch.
type Watcher interface {
	// Events is closed when the watch ends.
	Events() <-chan Event
	// Err says why Events was closed (nil after ctx cancellation).
	Err() error
}

// Bitmap helpers shared by backends.

// BitIsSet reports bit i of b (out of range: false).
func BitIsSet(b []byte, i int) bool {
	if i < 0 || i/8 >= len(b) {
		return false
	}
	return b[i/8]&(1<<(uint(i)%8)) != 0
}

// ApplyBitOp returns the bitmap after op (a new slice), or a *TxnError when
// a set finds the bit set, and whether the result is all zeros.
func ApplyBitOp(cur []byte, op *Op) ([]byte, bool, error) {
	if op.Bit < 0 {
		return nil, false, kerrors.New(kerrors.Invalid, "negative bit %d for %q", op.Bit, op.Key)
	}
	n := len(cur)
	if op.Kind == OpSetBit && n < op.Size {
		n = op.Size
	}
	if need := op.Bit/8 + 1; n < need {
		if op.Kind == OpClearBit {
			return cur, isZero(cur), nil
		}
		n = need
	}
	out := make([]byte, n)
	copy(out, cur)
	mask := byte(1 << (uint(op.Bit) % 8))
	switch op.Kind {
	case OpSetBit:
		if out[op.Bit/8]&mask != 0 {
			return nil, false, &TxnError{Op: op}
		}
		out[op.Bit/8] |= mask
	case OpClearBit:
		out[op.Bit/8] &^= mask
	}
	return out, isZero(out), nil
}

func isZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
