package core

import (
	"context"
	"errors"
	"fmt"

	"kurma.dev/kurma/internal/controller/ipam"
	"kurma.dev/kurma/internal/controller/store"
	capi "kurma.dev/kurma/pkg/controllerapi"
	"kurma.dev/kurma/pkg/kerrors"
)

// maxCreateTries bounds retries of a port creation whose candidate
// addresses or MACs were taken meanwhile (by another replica).
const maxCreateTries = 16

// alloc is one address being allocated (for a port, a VIP or a floating
// IP) from a cached subnet or external network.
type alloc struct {
	what      string // "port x", for errors
	entry     *subnetEntry
	subRev    int64 // the revision of the subnet the transaction checks
	requested bool  // the caller named the address
	off       int64 // reserved offset
	reserved  bool
}

// plan is one port being created.
type plan struct {
	alloc
	port   capi.Port
	genMAC bool
}

// CreatePorts validates and creates ports in project pid, all or nothing.
func (s *Core) CreatePorts(ctx context.Context, pid string, ports []capi.Port) ([]capi.Port, error) {
	if err := s.requireProject(ctx, pid); err != nil {
		return nil, err
	}
	plans := make([]*plan, len(ports))
	ids := map[string]bool{}
	macs := map[string]bool{}
	for i := range ports {
		p := ports[i]
		if err := NormalizePort(pid, &p); err != nil {
			return nil, err
		}
		if ids[p.ID] {
			return nil, kerrors.New(kerrors.Invalid, "port id %q appears twice in the request", p.ID)
		}
		ids[p.ID] = true
		if p.MACAddress != "" {
			if macs[p.MACAddress] {
				return nil, kerrors.New(kerrors.Invalid, "mac_address %s appears twice in the request", p.MACAddress)
			}
			macs[p.MACAddress] = true
		}
		e, rev, err := s.resolveNetwork(ctx, pid, &p)
		if err != nil {
			return nil, err
		}
		pl := &plan{alloc: alloc{what: "port " + p.ID, entry: e, subRev: rev}, port: p, genMAC: p.MACAddress == ""}
		if len(p.FixedIPs) > 0 && p.FixedIPs[0].IPAddress != "" {
			off, err := e.sub.Request(p.FixedIPs[0].IPAddress)
			if err != nil {
				return nil, fmt.Errorf("port %s: %w", p.ID, err)
			}
			pl.requested, pl.off = true, off
		}
		plans[i] = pl
	}
	allocs := make([]*alloc, len(plans))
	for i, pl := range plans {
		allocs[i] = &pl.alloc
		if err := s.loadTracker(ctx, pl.entry, false); err != nil {
			return nil, err
		}
	}
	ts := now()
	for try := 0; ; try++ {
		if err := s.reserve(ctx, allocs); err != nil {
			return nil, err
		}
		txn := store.Txn{}
		seenSub := map[string]bool{}
		for _, pl := range plans {
			p := &pl.port
			if pl.genMAC {
				p.MACAddress = s.macs.Next()
			}
			sub := pl.entry.sub
			p.FixedIPs = []capi.FixedIP{{SubnetID: pl.entry.wire.ID, IPAddress: sub.Addr(pl.off).String(), CIDR: pl.entry.wire.CIDR, GatewayIP: pl.entry.wire.GatewayIP}}
			p.VPCID, p.VNI = pl.entry.vpc.ID, pl.entry.vpc.VNI
			p.CreatedAt, p.UpdatedAt = ts, ts
			pk := portKey(pid, p.ID)
			sk := pl.entry.key
			if !seenSub[sk] {
				seenSub[sk] = true
				txn.Conds = append(txn.Conds, store.Cond{Kind: store.CondModRev, Key: sk, Rev: pl.subRev})
			}
			txn.Conds = append(txn.Conds, store.Cond{Kind: store.CondAbsent, Key: pk}, store.Cond{Kind: store.CondAbsent, Key: macKey(p.MACAddress)})
			blk, bit := ipam.Block(pl.off)
			txn.Ops = append(txn.Ops,
				store.Op{Kind: store.OpPut, Key: pk, Value: mustJSON(p)},
				store.Op{Kind: store.OpSetBit, Key: pl.entry.blockKey(blk), Bit: bit, Size: ipam.BlockBytes},
				store.Op{Kind: store.OpPut, Key: macKey(p.MACAddress), Value: []byte(pk)})
			txn.Ops = append(txn.Ops, store.Op{Kind: store.OpPut, Key: vpcIdxKey(pid, p.VPCID, p.ID)})
			if p.BindingHostID != "" {
				txn.Ops = append(txn.Ops, store.Op{Kind: store.OpPut, Key: hostIdxKey(p.BindingHostID, pid, p.ID)})
			}
			if p.DeviceID != "" {
				txn.Ops = append(txn.Ops, store.Op{Kind: store.OpPut, Key: devIdxKey(pid, p.DeviceID, p.ID)})
			}
			if p.Name != "" {
				txn.Ops = append(txn.Ops, store.Op{Kind: store.OpPut, Key: nameIdxKey(pid, p.Name, p.ID)})
			}
		}
		rev, err := s.st.Txn(ctx, txn)
		if err == nil {
			out := make([]capi.Port, len(plans))
			for i, pl := range plans {
				pl.entry.tracker.Commit(pl.off)
				pl.reserved = false
				pl.port.RevisionNumber = rev
				out[i] = pl.port
			}
			return out, nil
		}
		retry, ferr := s.createFailed(plans, err)
		if ferr == nil && retry && try < maxCreateTries {
			if ferr = s.refreshAllocs(ctx, allocs); ferr != nil {
				return nil, ferr
			}
			// Another writer got there first (most often: took the
			// address), so this replica's cache of the subnet is stale,
			// likely by more than one address when another replica
			// allocates from it too: re-read it, or each retry would
			// learn one taken address at a time.
			if ferr = s.reloadTrackers(ctx, allocs); ferr != nil {
				return nil, ferr
			}
		}
		if ferr != nil || !retry || try >= maxCreateTries {
			if ferr == nil {
				ferr = fmt.Errorf("create ports: %w", err)
				if errors.Is(err, kerrors.Conflict) {
					ferr = kerrors.New(kerrors.Unavailable, "create ports: still contended after %d tries: %v", try+1, err)
				}
			}
			return nil, ferr
		}
	}
}

// reserve picks an address for every plan (refreshing the cache once when
// it looks exhausted); on error every reservation is released.
func (s *Core) reserve(ctx context.Context, plans []*alloc) error {
	for i, pl := range plans {
		if pl.reserved {
			continue
		}
		var err error
		if pl.requested {
			err = pl.entry.tracker.Claim(pl.off)
			if err != nil {
				// The cache may be stale (freed by another replica).
				if lerr := s.loadTracker(ctx, pl.entry, true); lerr != nil {
					err = lerr
				} else {
					err = pl.entry.tracker.Claim(pl.off)
				}
			}
			if err != nil {
				err = fmt.Errorf("%s: %w", pl.what, err)
			}
		} else {
			off, ok := pl.entry.tracker.Reserve()
			if !ok {
				if err = s.loadTracker(ctx, pl.entry, true); err == nil {
					off, ok = pl.entry.tracker.Reserve()
				}
			}
			if err == nil && !ok {
				err = kerrors.New(kerrors.Exhausted, "subnet %s (%s) has no free address", pl.entry.wire.ID, pl.entry.wire.CIDR)
			}
			pl.off = off
		}
		if err != nil {
			for _, o := range plans[:i] {
				if o.reserved {
					o.entry.tracker.Abort(o.off, false)
					o.reserved = false
				}
			}
			return err
		}
		pl.reserved = true
	}
	return nil
}

// createFailed releases reservations after a failed transaction and says
// whether a retry can succeed, or returns the error for the caller.
func (s *Core) createFailed(plans []*plan, err error) (bool, error) {
	var te *store.TxnError
	isTxn := errors.As(err, &te)
	retry := false
	var final error
	for _, pl := range plans {
		p := &pl.port
		pk := portKey(p.ProjectID, p.ID)
		blk, bit := ipam.Block(pl.off)
		taken := false
		switch {
		case !isTxn:
		case te.Cond != nil && te.Cond.Key == pk:
			final = kerrors.New(kerrors.Conflict, "port %q already exists", p.ID)
		case te.Cond != nil && te.Cond.Key == macKey(p.MACAddress):
			if pl.genMAC {
				retry = true
			} else {
				final = kerrors.New(kerrors.Conflict, "port %s: mac_address %s is in use", p.ID, p.MACAddress)
			}
		case te.Cond != nil && te.Cond.Key == pl.entry.key:
			// The subnet changed (a delete started?): re-resolve and retry.
			s.dropSubnet(te.Cond.Key)
			retry = true
		case te.Op != nil && te.Op.Key == pl.entry.blockKey(blk) && te.Op.Bit == bit:
			taken = true
			if pl.requested {
				final = kerrors.New(kerrors.Conflict, "port %s: address %s is in use", p.ID, pl.entry.sub.Addr(pl.off))
			} else {
				retry = true
			}
		}
		if pl.reserved {
			pl.entry.tracker.Abort(pl.off, taken)
			pl.reserved = false
		}
		if pl.genMAC {
			p.MACAddress = ""
		}
	}
	if final != nil {
		return false, final
	}
	return retry, nil
}

// reloadTrackers re-reads the address bitmaps of the allocations' ranges
// from the store (reservations in flight are kept).
func (s *Core) reloadTrackers(ctx context.Context, allocs []*alloc) error {
	done := map[*subnetEntry]bool{}
	for _, a := range allocs {
		if done[a.entry] {
			continue
		}
		done[a.entry] = true
		if err := s.loadTracker(ctx, a.entry, true); err != nil {
			return err
		}
	}
	return nil
}

// refreshAllocs re-resolves allocations whose subnet entry was dropped
// from the cache (the subnet changed under a transaction).
func (s *Core) refreshAllocs(ctx context.Context, allocs []*alloc) error {
	for _, a := range allocs {
		s.mu.Lock()
		cur := s.subnets[a.entry.key]
		s.mu.Unlock()
		if cur == a.entry {
			continue
		}
		var e *subnetEntry
		var rev int64
		var err error
		if a.entry.ext {
			e, rev, err = s.extnet(ctx, a.entry.wire.ID)
		} else {
			e, rev, err = s.subnet(ctx, a.entry.wire.ProjectID, a.entry.wire.ID)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", a.what, err)
		}
		if err := s.loadTracker(ctx, e, false); err != nil {
			return err
		}
		a.entry, a.subRev = e, rev
	}
	return nil
}
