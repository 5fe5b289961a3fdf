package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"kurma.dev/kurma/internal/controller/store"
	"kurma.dev/kurma/pkg/kerrors"
)

// Options configure a Store.
type Options struct {
	Endpoints   []string
	Prefix      string // default "/kurma/controller/"
	DialTimeout time.Duration
	// MaxRetries bounds retries of a transaction whose bitmaps changed
	// under it (default 64).
	MaxRetries int
}

// Store is an etcd-backed store.Store.
type Store struct {
	cli    *clientv3.Client
	prefix string
	tries  int
}

var _ store.Store = (*Store)(nil)

// Open connects to etcd and checks that it answers.
func Open(ctx context.Context, o Options) (*Store, error) {
	if len(o.Endpoints) == 0 {
		return nil, kerrors.New(kerrors.Invalid, "etcd: no endpoints")
	}
	if o.Prefix == "" {
		o.Prefix = "/kurma/controller/"
	}
	if o.DialTimeout == 0 {
		o.DialTimeout = 5 * time.Second
	}
	if o.MaxRetries == 0 {
		o.MaxRetries = 64
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: o.Endpoints, DialTimeout: o.DialTimeout, Logger: zap.NewNop()})
	if err != nil {
		return nil, fmt.Errorf("etcd connect: %w", kerrors.New(kerrors.Unavailable, "%v", err))
	}
	cctx, cancel := context.WithTimeout(ctx, o.DialTimeout)
	defer cancel()
	if _, err := cli.Get(cctx, o.Prefix+"\x00probe"); err != nil {
		_ = cli.Close()
		return nil, fmt.Errorf("etcd %v: %w", o.Endpoints, kerrors.New(kerrors.Unavailable, "%v", err))
	}
	return &Store{cli: cli, prefix: o.Prefix, tries: o.MaxRetries}, nil
}

// Close implements store.Store.
func (s *Store) Close() error { return s.cli.Close() }

func wrap(ctx context.Context, what string, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%s: %w", what, ctx.Err())
	}
	if errors.Is(err, rpctypes.ErrCompacted) {
		return fmt.Errorf("%s: %w", what, kerrors.New(store.ErrCompacted, "%v", err))
	}
	if errors.Is(err, rpctypes.ErrTooManyOps) || errors.Is(err, rpctypes.ErrRequestTooLarge) {
		return fmt.Errorf("%s: %w", what, kerrors.New(kerrors.Invalid, "%v (raise etcd --max-txn-ops / --max-request-bytes, or send smaller bulks)", err))
	}
	return fmt.Errorf("%s: %w", what, kerrors.New(kerrors.Unavailable, "%v", err))
}

// Get implements store.Store.
func (s *Store) Get(ctx context.Context, key string) (store.KV, error) {
	resp, err := s.cli.Get(ctx, s.prefix+key)
	if err != nil {
		return store.KV{}, wrap(ctx, "etcd get", err)
	}
	if len(resp.Kvs) == 0 {
		return store.KV{}, kerrors.New(kerrors.NotFound, "key %q not found", key)
	}
	kv := resp.Kvs[0]
	return store.KV{Key: key, Value: kv.Value, ModRev: kv.ModRevision}, nil
}

// List implements store.Store.
func (s *Store) List(ctx context.Context, prefix string) ([]store.KV, int64, error) {
	var out []store.KV
	rev, err := s.ForEach(ctx, prefix, func(kv store.KV) error {
		out = append(out, kv)
		return nil
	})
	return out, rev, err
}

// ForEach implements store.Store: pages of 2000 keys, all read at the
// revision of the first page.
func (s *Store) ForEach(ctx context.Context, prefix string, fn func(store.KV) error) (int64, error) {
	const page = 2000
	full := s.prefix + prefix
	end := clientv3.GetPrefixRangeEnd(full)
	var rev int64
	from := full
	for {
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(page)}
		if rev != 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		resp, err := s.cli.Get(ctx, from, opts...)
		if err != nil {
			return 0, wrap(ctx, "etcd list", err)
		}
		if rev == 0 {
			rev = resp.Header.Revision
		}
		for _, kv := range resp.Kvs {
			if err := fn(store.KV{Key: strings.TrimPrefix(string(kv.Key), s.prefix), Value: kv.Value, ModRev: kv.ModRevision}); err != nil {
				return rev, err
			}
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return rev, nil
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}

// Rev implements store.Store.
func (s *Store) Rev(ctx context.Context) (int64, error) {
	resp, err := s.cli.Get(ctx, s.prefix+"\x00rev")
	if err != nil {
		return 0, wrap(ctx, "etcd rev", err)
	}
	return resp.Header.Revision, nil
}

// Txn implements store.Store.
func (s *Store) Txn(ctx context.Context, t store.Txn) (int64, error) {
	for i := range t.Ops {
		if t.Ops[i].Key == "" {
			return 0, kerrors.New(kerrors.Invalid, "empty key")
		}
	}
	for try := 0; try < s.tries; try++ {
		cmps := make([]clientv3.Cmp, 0, len(t.Conds)+2)
		for _, c := range t.Conds {
			k := s.prefix + c.Key
			switch c.Kind {
			case store.CondAbsent:
				cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(k), "=", 0))
			case store.CondPresent:
				cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(k), ">", 0))
			case store.CondModRev:
				cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(k), "=", c.Rev))
			default:
				return 0, kerrors.New(kerrors.Invalid, "unknown condition kind %d", c.Kind)
			}
		}
		// Read current bitmaps, compute new values.
		bits := map[string][]byte{}
		bitRev := map[string]int64{}
		var order []string
		ops := make([]clientv3.Op, 0, len(t.Ops))
		puts := map[string]int{} // key -> index in ops of its final write
		for i := range t.Ops {
			op := &t.Ops[i]
			k := s.prefix + op.Key
			switch op.Kind {
			case store.OpPut:
				puts[k] = len(ops)
				ops = append(ops, clientv3.OpPut(k, string(op.Value)))
			case store.OpDelete:
				puts[k] = len(ops)
				ops = append(ops, clientv3.OpDelete(k))
			case store.OpSetBit, store.OpClearBit:
				cur, seen := bits[k]
				if !seen {
					resp, err := s.cli.Get(ctx, k)
					if err != nil {
						return 0, wrap(ctx, "etcd get bitmap", err)
					}
					if len(resp.Kvs) > 0 {
						cur, bitRev[k] = resp.Kvs[0].Value, resp.Kvs[0].ModRevision
					}
					order = append(order, k)
				}
				nv, zero, err := store.ApplyBitOp(cur, op)
				if err != nil {
					return 0, err
				}
				if zero {
					nv = nil
				}
				bits[k] = nv
			default:
				return 0, kerrors.New(kerrors.Invalid, "unknown op kind %d", op.Kind)
			}
		}
		for _, k := range order {
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(k), "=", bitRev[k]))
			if bits[k] == nil {
				ops = append(ops, clientv3.OpDelete(k))
			} else {
				ops = append(ops, clientv3.OpPut(k, string(bits[k])))
			}
		}
		resp, err := s.cli.Txn(ctx).If(cmps...).Then(ops...).Commit()
		if err != nil {
			return 0, wrap(ctx, "etcd txn", err)
		}
		if resp.Succeeded {
			return resp.Header.Revision, nil
		}
		// Which compare failed? A caller condition is final; a bitmap that
		// moved is retried.
		if err := s.failedCond(ctx, t.Conds); err != nil {
			return 0, err
		}
	}
	return 0, kerrors.New(kerrors.Unavailable, "etcd txn: too much contention after %d tries", s.tries)
}

func (s *Store) failedCond(ctx context.Context, conds []store.Cond) error {
	for i := range conds {
		c := &conds[i]
		resp, err := s.cli.Get(ctx, s.prefix+c.Key)
		if err != nil {
			return wrap(ctx, "etcd get", err)
		}
		exists := len(resp.Kvs) > 0
		ok := true
		switch c.Kind {
		case store.CondAbsent:
			ok = !exists
		case store.CondPresent:
			ok = exists
		case store.CondModRev:
			ok = exists && resp.Kvs[0].ModRevision == c.Rev
		}
		if !ok {
			return &store.TxnError{Cond: c}
		}
	}
	return nil
}

type watcher struct {
	ch  chan store.Event
	err error
}

func (w *watcher) Events() <-chan store.Event { return w.ch }
func (w *watcher) Err() error                 { return w.err }

// Watch implements store.Store.
func (s *Store) Watch(ctx context.Context, prefix string, since int64) (store.Watcher, error) {
	if since < 0 {
		return nil, kerrors.New(kerrors.Invalid, "negative revision %d", since)
	}
	if since > 0 {
		// Reading at the revision fails when it is compacted (or ahead of
		// the store): report that synchronously so the API can answer 410.
		if _, err := s.cli.Get(ctx, s.prefix+"\x00rev", clientv3.WithRev(since)); err != nil {
			if errors.Is(err, rpctypes.ErrCompacted) || errors.Is(err, rpctypes.ErrFutureRev) {
				return nil, kerrors.New(store.ErrCompacted, "revision %d: %v", since, err)
			}
			return nil, wrap(ctx, "etcd watch", err)
		}
	}
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	wch := s.cli.Watch(wctx, s.prefix+prefix, clientv3.WithPrefix(), clientv3.WithRev(since+1), clientv3.WithPrevKV())
	w := &watcher{ch: make(chan store.Event, 256)}
	go func() {
		defer cancel()
		defer close(w.ch)
		handle := func(r clientv3.WatchResponse) bool {
			if err := r.Err(); err != nil {
				if r.CompactRevision != 0 {
					w.err = kerrors.New(store.ErrCompacted, "watch compacted at %d", r.CompactRevision)
				} else if ctx.Err() == nil {
					w.err = wrap(ctx, "etcd watch", err)
				}
				return false
			}
			for _, e := range r.Events {
				ev := store.Event{Key: strings.TrimPrefix(string(e.Kv.Key), s.prefix), Rev: e.Kv.ModRevision}
				if e.PrevKv != nil {
					ev.PrevValue = e.PrevKv.Value
				}
				if e.Type == clientv3.EventTypeDelete {
					ev.Type = store.EventDelete
				} else {
					ev.Type, ev.Value = store.EventPut, e.Kv.Value
				}
				select {
				case w.ch <- ev:
				case <-ctx.Done():
					return false
				}
			}
			return true
		}
		for {
			select {
			case r, ok := <-wch:
				if !ok {
					if ctx.Err() == nil {
						w.err = kerrors.New(kerrors.Unavailable, "etcd watch closed")
					}
					return
				}
				if !handle(r) {
					return
				}
			case <-ctx.Done():
				return
			}
		}
	}()
	return w, nil
}
