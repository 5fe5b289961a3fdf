package boltstore

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	bolt "go.etcd.io/bbolt"

	"kurma.dev/kurma/internal/controller/store"
	"kurma.dev/kurma/pkg/kerrors"
)

var (
	kvBucket   = []byte("kv")
	metaBucket = []byte("meta")
	revKey     = []byte("rev")
)

// maxBatch caps how many queued transactions one commit takes.
const maxBatch = 512

// Options tune a Store.
type Options struct {
	// NoSync skips fsync on commit (tests and benchmarks of the API only;
	// unsafe on power loss).
	NoSync bool
	// History is how many events watches can resume across (default 65536).
	History int
	Logger  *slog.Logger
}

// Store is a bbolt-backed store.Store.
type Store struct {
	db   *bolt.DB
	reqs chan *request
	hub  *hub
	rev  atomic.Int64 // last committed revision
	log  *slog.Logger

	closeOnce sync.Once
	quit      chan struct{} // closed by Close: the writer drains and exits
	done      chan struct{} // closed when the writer has exited

	trimReq  chan struct{} // asks the trimmer to unmap now (buffered, 1)
	trimDone chan struct{} // closed when the trimmer has exited
}

var _ store.Store = (*Store)(nil)

type request struct {
	txn  store.Txn
	rev  int64
	err  error
	done chan struct{}
}

// Open opens (creating when needed) the bbolt file at path.
func Open(path string, opts Options) (*Store, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("store dir: %w", err)
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{
		Timeout:        2 * time.Second,
		NoFreelistSync: true,
		FreelistType:   bolt.FreelistMapType,
		NoSync:         opts.NoSync,
		// A large initial mapping means the file rarely needs remapping,
		// and remapping waits for every open read transaction: without
		// it a slow watch replaying a million ports would stall writes.
		InitialMmapSize: 8 << 30,
		// Map the file with MAP_POPULATE (as etcd does on Linux): it reads
		// the whole file into the page cache at open, so a large store
		// opened cold does not take a disk read for each page a commit
		// first touches (which set the create-to-UP tail for minutes
		// after a restart). The page table entries it also fills are
		// dropped again right after open; see trim.go.
		MmapFlags: syscall.MAP_POPULATE,
	})
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, kerrors.New(kerrors.Unavailable, "%v", err))
	}
	var rev int64
	err = db.Update(func(tx *bolt.Tx) error {
		if _, err := tx.CreateBucketIfNotExists(kvBucket); err != nil {
			return err
		}
		m, err := tx.CreateBucketIfNotExists(metaBucket)
		if err != nil {
			return err
		}
		if v := m.Get(revKey); len(v) == 8 {
			rev = int64(binary.BigEndian.Uint64(v))
		}
		return nil
	})
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("init %s: %w", path, err)
	}
	if opts.History <= 0 {
		opts.History = 1 << 16
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	s := &Store{
		db:   db,
		reqs: make(chan *request, 4096),
		hub:  newHub(rev, opts.History),
		log:  opts.Logger,
		quit: make(chan struct{}),
		done: make(chan struct{}),

		trimReq:  make(chan struct{}, 1),
		trimDone: make(chan struct{}),
	}
	s.rev.Store(rev)
	// Opening scanned every page (MAP_POPULATE, and the freelist rebuild
	// NoFreelistSync implies): unmap them before the first write.
	s.trim()
	go s.writer()
	go s.trimmer(trimInterval)
	return s, nil
}

// Close stops the writer (after it finishes queued work) and closes the file.
func (s *Store) Close() error {
	var err error
	s.closeOnce.Do(func() {
		close(s.quit)
		<-s.done
		<-s.trimDone
		s.hub.close()
		err = s.db.Close()
	})
	return err
}

func encode(rev int64, v []byte) []byte {
	out := make([]byte, 8+len(v))
	binary.BigEndian.PutUint64(out, uint64(rev))
	copy(out[8:], v)
	return out
}

func decode(raw []byte) (int64, []byte) {
	if len(raw) < 8 {
		return 0, nil
	}
	v := make([]byte, len(raw)-8)
	copy(v, raw[8:])
	return int64(binary.BigEndian.Uint64(raw)), v
}

// Get implements store.Store.
func (s *Store) Get(ctx context.Context, key string) (store.KV, error) {
	var kv store.KV
	err := s.db.View(func(tx *bolt.Tx) error {
		raw := tx.Bucket(kvBucket).Get([]byte(key))
		if raw == nil {
			return kerrors.New(kerrors.NotFound, "key %q not found", key)
		}
		kv.Key = key
		kv.ModRev, kv.Value = decode(raw)
		return nil
	})
	return kv, err
}

// List implements store.Store.
func (s *Store) List(ctx context.Context, prefix string) ([]store.KV, int64, error) {
	var out []store.KV
	var rev int64
	err := s.db.View(func(tx *bolt.Tx) error {
		rev = readRev(tx)
		c := tx.Bucket(kvBucket).Cursor()
		p := []byte(prefix)
		for k, raw := c.Seek(p); k != nil && bytes.HasPrefix(k, p); k, raw = c.Next() {
			if len(out)%1024 == 0 && ctx.Err() != nil {
				return ctx.Err()
			}
			kv := store.KV{Key: string(k)}
			kv.ModRev, kv.Value = decode(raw)
			out = append(out, kv)
		}
		return nil
	})
	s.scanned(len(out))
	return out, rev, err
}

// ForEach implements store.Store.
func (s *Store) ForEach(ctx context.Context, prefix string, fn func(store.KV) error) (int64, error) {
	var rev int64
	n := 0
	err := s.db.View(func(tx *bolt.Tx) error {
		rev = readRev(tx)
		c := tx.Bucket(kvBucket).Cursor()
		p := []byte(prefix)
		for k, raw := c.Seek(p); k != nil && bytes.HasPrefix(k, p); k, raw = c.Next() {
			if n++; n%1024 == 0 && ctx.Err() != nil {
				return ctx.Err()
			}
			kv := store.KV{Key: string(k)}
			kv.ModRev, kv.Value = decode(raw)
			if err := fn(kv); err != nil {
				return err
			}
		}
		return nil
	})
	s.scanned(n)
	return rev, err
}

// Rev implements store.Store.
func (s *Store) Rev(ctx context.Context) (int64, error) { return s.rev.Load(), nil }

// Txn implements store.Store: it queues t for the writer and waits.
func (s *Store) Txn(ctx context.Context, t store.Txn) (int64, error) {
	r := &request{txn: t, done: make(chan struct{})}
	select {
	case s.reqs <- r:
	case <-s.quit:
		return 0, kerrors.New(kerrors.Unavailable, "store closed")
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	// Once queued the transaction will be decided; wait for the outcome
	// even if ctx ends so the caller never guesses.
	<-r.done
	return r.rev, r.err
}

// writer applies queued transactions in groups, one bbolt commit each.
func (s *Store) writer() {
	defer close(s.done)
	batch := make([]*request, 0, maxBatch)
	for {
		select {
		case r := <-s.reqs:
			batch = append(batch[:0], r)
		case <-s.quit:
			// Drain what is queued, then stop.
			for {
				select {
				case r := <-s.reqs:
					s.commit([]*request{r})
				default:
					return
				}
			}
		}
	fill:
		for len(batch) < maxBatch {
			select {
			case r := <-s.reqs:
				batch = append(batch, r)
			default:
				break fill
			}
		}
		s.commit(batch)
	}
}

type staged struct {
	val     []byte // nil when deleted
	deleted bool
	prev    []byte
	hadPrev bool
}

// commit runs one bbolt transaction for the batch.
func (s *Store) commit(batch []*request) {
	var rev int64
	var events []store.Event
	type result struct {
		rev int64
		err error
	}
	results := make([]result, len(batch))
	err := s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(kvBucket)
		rev = readRev(tx)
		for i, r := range batch {
			evs, err := apply(b, &r.txn, rev+1)
			if err != nil {
				results[i].err = err
				continue
			}
			rev++
			results[i].rev = rev
			events = append(events, evs...)
		}
		var rb [8]byte
		binary.BigEndian.PutUint64(rb[:], uint64(rev))
		return tx.Bucket(metaBucket).Put(revKey, rb[:])
	})
	if err != nil {
		s.log.Error("store commit failed", "err", err, "txns", len(batch))
		for _, r := range batch {
			r.err = fmt.Errorf("commit: %w", kerrors.New(kerrors.Unavailable, "%v", err))
			close(r.done)
		}
		return
	}
	s.rev.Store(rev)
	if len(events) > 0 {
		s.hub.publish(events, rev)
	}
	for i, r := range batch {
		r.rev, r.err = results[i].rev, results[i].err
		close(r.done)
	}
}

// apply checks and applies one transaction in b; on error nothing of it is
// written.
func apply(b *bolt.Bucket, t *store.Txn, rev int64) ([]store.Event, error) {
	for i := range t.Conds {
		c := &t.Conds[i]
		raw := b.Get([]byte(c.Key))
		ok := false
		switch c.Kind {
		case store.CondAbsent:
			ok = raw == nil
		case store.CondPresent:
			ok = raw != nil
		case store.CondModRev:
			ok = raw != nil && len(raw) >= 8 && int64(binary.BigEndian.Uint64(raw)) == c.Rev
		default:
			return nil, kerrors.New(kerrors.Invalid, "unknown condition kind %d", c.Kind)
		}
		if !ok {
			return nil, &store.TxnError{Cond: c}
		}
	}
	st := make(map[string]*staged, len(t.Ops))
	order := make([]string, 0, len(t.Ops))
	cur := func(k string) *staged {
		if s, ok := st[k]; ok {
			return s
		}
		s := &staged{}
		if raw := b.Get([]byte(k)); raw != nil {
			_, s.prev = decode(raw)
			s.hadPrev = true
			s.val = s.prev
		} else {
			s.deleted = true
		}
		st[k] = s
		order = append(order, k)
		return s
	}
	for i := range t.Ops {
		op := &t.Ops[i]
		if op.Key == "" {
			return nil, kerrors.New(kerrors.Invalid, "empty key")
		}
		s := cur(op.Key)
		switch op.Kind {
		case store.OpPut:
			s.val, s.deleted = op.Value, false
			if s.val == nil {
				s.val = []byte{}
			}
		case store.OpDelete:
			s.val, s.deleted = nil, true
		case store.OpSetBit, store.OpClearBit:
			var base []byte
			if !s.deleted {
				base = s.val
			}
			nv, zero, err := store.ApplyBitOp(base, op)
			if err != nil {
				return nil, err
			}
			if zero && op.Kind == store.OpClearBit {
				s.val, s.deleted = nil, true
			} else {
				s.val, s.deleted = nv, false
			}
		default:
			return nil, kerrors.New(kerrors.Invalid, "unknown op kind %d", op.Kind)
		}
	}
	evs := make([]store.Event, 0, len(order))
	for _, k := range order {
		s := st[k]
		if s.deleted {
			if !s.hadPrev {
				continue
			}
			if err := b.Delete([]byte(k)); err != nil {
				return nil, err
			}
			evs = append(evs, store.Event{Type: store.EventDelete, Key: k, PrevValue: s.prev, Rev: rev})
			continue
		}
		if err := b.Put([]byte(k), encode(rev, s.val)); err != nil {
			return nil, err
		}
		evs = append(evs, store.Event{Type: store.EventPut, Key: k, Value: s.val, PrevValue: s.prev, Rev: rev})
	}
	return evs, nil
}

// BulkLoad writes kvs directly in large transactions, bypassing the
// writer's queue and event history (benchmark preloading and restores). Each
// key gets a fresh revision; existing keys are overwritten.
func (s *Store) BulkLoad(ctx context.Context, kvs []store.KV) error {
	// bbolt serialises this Update against the writer's; both read the
	// revision inside their transaction.
	err := s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(kvBucket)
		rev := readRev(tx) + 1
		for i, kv := range kvs {
			if i%4096 == 0 && ctx.Err() != nil {
				return ctx.Err()
			}
			if err := b.Put([]byte(kv.Key), encode(rev, kv.Value)); err != nil {
				return err
			}
		}
		var rb [8]byte
		binary.BigEndian.PutUint64(rb[:], uint64(rev))
		if err := tx.Bucket(metaBucket).Put(revKey, rb[:]); err != nil {
			return err
		}
		s.rev.Store(rev)
		return nil
	})
	if err != nil {
		return fmt.Errorf("bulk load: %w", err)
	}
	s.scanned(len(kvs))
	return nil
}

// errClosed is what watches report when the store closes under them.
var errClosed = errors.New("store closed")

// committedRev reads the revision of the last commit from the database
// (s.rev can trail it for the moment between a commit and its Store).
func (s *Store) committedRev() (int64, error) {
	var rev int64
	if err := s.db.View(func(tx *bolt.Tx) error {
		rev = readRev(tx)
		return nil
	}); err != nil {
		return 0, fmt.Errorf("read revision: %w", err)
	}
	return rev, nil
}

func readRev(tx *bolt.Tx) int64 {
	if v := tx.Bucket(metaBucket).Get(revKey); len(v) == 8 {
		return int64(binary.BigEndian.Uint64(v))
	}
	return 0
}
