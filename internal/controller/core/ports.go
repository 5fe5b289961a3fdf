package core

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"kurma.dev/kurma/internal/controller/ipam"
	"kurma.dev/kurma/internal/controller/store"
	capi "kurma.dev/kurma/pkg/controllerapi"
	"kurma.dev/kurma/pkg/kerrors"
)

func decodePort(kv store.KV) (capi.Port, error) {
	var p capi.Port
	if err := json.Unmarshal(kv.Value, &p); err != nil {
		return p, fmt.Errorf("decode stored port %s: %w", kv.Key, err)
	}
	p.RevisionNumber = kv.ModRev
	return p, nil
}

func (s *Core) readPort(ctx context.Context, pid, id string) (capi.Port, error) {
	kv, err := s.st.Get(ctx, portKey(pid, id))
	if err != nil {
		if errors.Is(err, kerrors.NotFound) {
			return capi.Port{}, kerrors.New(kerrors.NotFound, "port %q not found in project %q", id, pid)
		}
		return capi.Port{}, err
	}
	return decodePort(kv)
}

// GetPort reads port id of project pid.
func (s *Core) GetPort(ctx context.Context, pid, id string) (capi.Port, error) {
	if err := s.requireProject(ctx, pid); err != nil {
		return capi.Port{}, err
	}
	if err := ValidID("port", id); err != nil {
		return capi.Port{}, err
	}
	return s.readPort(ctx, pid, id)
}

// WaitPort returns the port once its status is not PENDING (or equals
// want), or as it is when d passes.
func (s *Core) WaitPort(ctx context.Context, pid, id, want string, d time.Duration) (capi.Port, error) {
	if err := s.requireProject(ctx, pid); err != nil {
		return capi.Port{}, err
	}
	if err := ValidID("port", id); err != nil {
		return capi.Port{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	k := portKey(pid, id)
	wake := s.waiters.add(k)
	defer s.waiters.remove(k, wake)
	for {
		p, err := s.readPort(context.WithoutCancel(ctx), pid, id)
		if err != nil {
			return p, err
		}
		if p.Status != capi.StatusPending || (want != "" && p.Status == want) {
			return p, nil
		}
		select {
		case <-wake:
		case <-ctx.Done():
			return p, nil
		}
	}
}

// ListPorts lists the ports of project pid that match f, through an
// index when f names a host, device or name.
func (s *Core) ListPorts(ctx context.Context, pid string, f capi.PortFilter) ([]capi.Port, error) {
	if err := s.requireProject(ctx, pid); err != nil {
		return nil, err
	}
	match := func(p *capi.Port) bool {
		if f.HostID != "" && p.BindingHostID != f.HostID || f.DeviceID != "" && p.DeviceID != f.DeviceID || f.Name != "" && p.Name != f.Name {
			return false
		}
		if f.NetworkID != "" && p.NetworkID != f.NetworkID && p.VPCID != f.NetworkID && (len(p.FixedIPs) == 0 || p.FixedIPs[0].SubnetID != f.NetworkID) {
			return false
		}
		return true
	}
	out := []capi.Port{}
	var idx string
	switch {
	case f.HostID != "" && !strings.Contains(f.HostID, "/"):
		idx = "idx/host/" + f.HostID + "/" + pid + "/"
	case f.DeviceID != "" && !strings.Contains(f.DeviceID, "/"):
		idx = "idx/dev/" + pid + "/" + f.DeviceID + "/"
	case f.Name != "" && !strings.Contains(f.Name, "/"):
		idx = "idx/name/" + pid + "/" + f.Name + "/"
	}
	if idx != "" {
		var ids []string
		if _, err := s.st.ForEach(ctx, idx, func(kv store.KV) error {
			ids = append(ids, kv.Key[len(idx):])
			return nil
		}); err != nil {
			return nil, err
		}
		for _, id := range ids {
			p, err := s.readPort(ctx, pid, id)
			if errors.Is(err, kerrors.NotFound) {
				continue // deleted meanwhile
			}
			if err != nil {
				return nil, err
			}
			if match(&p) {
				out = append(out, p)
			}
		}
		return out, nil
	}
	_, err := s.st.ForEach(ctx, "ports/"+pid+"/", func(kv store.KV) error {
		p, err := decodePort(kv)
		if err != nil {
			return err
		}
		if match(&p) {
			out = append(out, p)
		}
		return nil
	})
	return out, err
}

// DeletePort deletes a port, releases its address and MAC and
// disassociates its floating IP, in one transaction.
func (s *Core) DeletePort(ctx context.Context, pid, id string) error {
	if err := s.requireProject(ctx, pid); err != nil {
		return err
	}
	if err := ValidID("port", id); err != nil {
		return err
	}
	k := portKey(pid, id)
	for try := 0; try < 8; try++ {
		p, err := s.readPort(ctx, pid, id)
		if err != nil {
			return err
		}
		txn := store.Txn{
			Conds: []store.Cond{{Kind: store.CondModRev, Key: k, Rev: p.RevisionNumber}},
			Ops:   []store.Op{{Kind: store.OpDelete, Key: k}, {Kind: store.OpDelete, Key: macKey(p.MACAddress)}},
		}
		type rel struct {
			tr  *ipam.Tracker // nil when the subnet is not cached
			off int64
		}
		var rels []rel
		for _, f := range p.FixedIPs {
			sub, tr, err := s.subnetForRelease(ctx, pid, f.SubnetID)
			if err != nil {
				return fmt.Errorf("port %s: subnet of %s: %w", id, f.IPAddress, err)
			}
			off, err := sub.Request(f.IPAddress)
			if err != nil {
				return fmt.Errorf("port %s: stored address: %w", id, err)
			}
			blk, bit := ipam.Block(off)
			txn.Ops = append(txn.Ops, store.Op{Kind: store.OpClearBit, Key: blockKey(pid, f.SubnetID, blk), Bit: bit})
			rels = append(rels, rel{tr, off})
		}
		if p.VPCID != "" {
			txn.Ops = append(txn.Ops, store.Op{Kind: store.OpDelete, Key: vpcIdxKey(pid, p.VPCID, id)})
		}
		if p.BindingHostID != "" {
			txn.Ops = append(txn.Ops, store.Op{Kind: store.OpDelete, Key: hostIdxKey(p.BindingHostID, pid, id)})
		}
		if p.DeviceID != "" {
			txn.Ops = append(txn.Ops, store.Op{Kind: store.OpDelete, Key: devIdxKey(pid, p.DeviceID, id)})
		}
		if p.Name != "" {
			txn.Ops = append(txn.Ops, store.Op{Kind: store.OpDelete, Key: nameIdxKey(pid, p.Name, id)})
		}
		if err := s.disassociateAll(ctx, &txn, "port", pid, id); err != nil {
			return err
		}
		_, err = s.st.Txn(ctx, txn)
		var te *store.TxnError
		if errors.As(err, &te) {
			continue // changed (status update, association) or deleted meanwhile: re-read
		}
		if err != nil {
			return fmt.Errorf("delete port %s: %w", id, err)
		}
		for _, r := range rels {
			if r.tr != nil {
				r.tr.Release(r.off)
			}
		}
		return nil
	}
	return kerrors.New(kerrors.Unavailable, "delete port %s: too many concurrent changes", id)
}

// ValidStatus checks an agent's status report.
func ValidStatus(u capi.PortStatusUpdate) error {
	switch u.Status {
	case capi.StatusUp, capi.StatusDown, capi.StatusError, capi.StatusPending:
	default:
		return kerrors.New(kerrors.Invalid, "status %q: want UP, DOWN, ERROR or PENDING", u.Status)
	}
	if len(u.StatusReason) > 1024 {
		return kerrors.New(kerrors.Invalid, "status_reason longer than 1024 bytes")
	}
	return nil
}

// SetPortStatus records the agent's report (compare-and-swap, retried).
func (s *Core) SetPortStatus(ctx context.Context, pid, id string, u capi.PortStatusUpdate) (capi.Port, error) {
	if err := ValidStatus(u); err != nil {
		return capi.Port{}, err
	}
	return s.updatePort(ctx, pid, id, func(p *capi.Port) []store.Op {
		if p.Status == u.Status && p.StatusReason == u.StatusReason {
			return nil
		}
		p.Status, p.StatusReason = u.Status, u.StatusReason
		return []store.Op{}
	})
}

// ValidBinding checks a binding update: a host id fit for a store key.
func ValidBinding(u capi.PortBindingUpdate) error {
	if err := checkLen("binding:host_id", u.BindingHostID, 255); err != nil {
		return err
	}
	if strings.ContainsAny(u.BindingHostID, "/\x00") {
		return kerrors.New(kerrors.Invalid, "binding:host_id must not contain '/' or NUL")
	}
	return nil
}

// SetPortBinding binds port id of project pid to another host (empty:
// none), keeping its addresses and MAC (compare-and-swap, retried): a
// node whose agent's host id changed keeps its running pods' ports, whose
// sandboxes were plugged once. The port goes back to PENDING until the
// new host's agent reports it; the host index follows, and the old host's
// port watch sees the port DELETED (Watch).
func (s *Core) SetPortBinding(ctx context.Context, pid, id string, u capi.PortBindingUpdate) (capi.Port, error) {
	if err := ValidBinding(u); err != nil {
		return capi.Port{}, err
	}
	return s.updatePort(ctx, pid, id, func(p *capi.Port) []store.Op {
		if p.BindingHostID == u.BindingHostID {
			return nil
		}
		var ops []store.Op
		if p.BindingHostID != "" {
			ops = append(ops, store.Op{Kind: store.OpDelete, Key: hostIdxKey(p.BindingHostID, pid, id)})
		}
		if u.BindingHostID != "" {
			ops = append(ops, store.Op{Kind: store.OpPut, Key: hostIdxKey(u.BindingHostID, pid, id)})
		}
		p.BindingHostID = u.BindingHostID
		p.Status, p.StatusReason = capi.StatusPending, "bound to host "+u.BindingHostID
		return ops
	})
}

// updatePort reads port id of project pid, lets change modify it, and
// writes it back if its revision has not moved since the read (retried
// on a conflict). change returns nil when the port already is as asked
// (nothing is written), or the store operations to commit with it.
func (s *Core) updatePort(ctx context.Context, pid, id string, change func(*capi.Port) []store.Op) (capi.Port, error) {
	if err := s.requireProject(ctx, pid); err != nil {
		return capi.Port{}, err
	}
	if err := ValidID("port", id); err != nil {
		return capi.Port{}, err
	}
	k := portKey(pid, id)
	for try := 0; try < 16; try++ {
		p, err := s.readPort(ctx, pid, id)
		if err != nil {
			return p, err
		}
		old := p.RevisionNumber
		ops := change(&p)
		if ops == nil {
			return p, nil
		}
		p.UpdatedAt = now()
		p.RevisionNumber = 0
		rev, err := s.st.Txn(ctx, store.Txn{Conds: []store.Cond{{Kind: store.CondModRev, Key: k, Rev: old}},
			Ops: append([]store.Op{{Kind: store.OpPut, Key: k, Value: mustJSON(p)}}, ops...)})
		if txnFailedOn(err, k) {
			continue
		}
		if err != nil {
			return p, err
		}
		p.RevisionNumber = rev
		return p, nil
	}
	return capi.Port{}, kerrors.New(kerrors.Unavailable, "port %s: too many concurrent changes", id)
}

// subnetForRelease returns the parsed subnet (and its tracker when cached)
// even while the subnet is marked for deletion, so ports can always be
// deleted.
func (s *Core) subnetForRelease(ctx context.Context, pid, sid string) (*ipam.Subnet, *ipam.Tracker, error) {
	s.mu.Lock()
	e := s.subnets[subnetKey(pid, sid)]
	s.mu.Unlock()
	if e != nil {
		return e.sub, e.tracker, nil
	}
	var sn storedSubnet
	if _, err := s.getJSON(ctx, subnetKey(pid, sid), "subnet", sid, &sn); err != nil {
		return nil, nil, err
	}
	var pools []ipam.Pool
	for _, p := range sn.AllocationPools {
		pools = append(pools, ipam.Pool{Start: p.Start, End: p.End})
	}
	sub, err := ipam.New(sn.CIDR, sn.IPVersion, sn.GatewayIP, pools)
	if err != nil {
		return nil, nil, fmt.Errorf("stored subnet %s: %w", sid, err)
	}
	return sub, nil, nil
}
