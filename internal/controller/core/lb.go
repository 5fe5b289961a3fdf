package core

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"

	"kurma.dev/kurma/internal/controller/ipam"
	"kurma.dev/kurma/internal/controller/store"
	capi "kurma.dev/kurma/pkg/controllerapi"
	"kurma.dev/kurma/pkg/kerrors"
)

// lbPlan is one load balancer being created.
type lbPlan struct {
	alloc
	lb capi.LoadBalancer
}

// vpcRanges says which addresses lie inside a VPC: its CIDR when it has
// one, else the union of its subnets of ports.
type vpcRanges struct {
	vpc      capi.VPC
	prefixes []netip.Prefix
}

func (v *vpcRanges) contains(a netip.Addr) bool {
	for _, p := range v.prefixes {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// vpcRanges reads what checkMembers needs about VPC vpc of project pid.
func (s *Core) vpcRanges(ctx context.Context, pid string, vpc capi.VPC) (*vpcRanges, error) {
	r := &vpcRanges{vpc: vpc}
	if vpc.CIDR != "" {
		r.prefixes = []netip.Prefix{netip.MustParsePrefix(vpc.CIDR)}
		return r, nil
	}
	subs, err := s.subnetsOf(ctx, pid, vpc.ID)
	if err != nil {
		return nil, err
	}
	for _, sn := range subs {
		if sn.Purpose == capi.SubnetPurposeService {
			continue
		}
		if p, err := netip.ParsePrefix(sn.CIDR); err == nil {
			r.prefixes = append(r.prefixes, p)
		}
	}
	return r, nil
}

// checkMembers refuses members outside the VPC that are not marked
// external (Invalid, naming the member).
func checkMembers(r *vpcRanges, members []capi.Member) error {
	for i, m := range members {
		if !m.External && !r.contains(netip.MustParseAddr(m.Address)) {
			return invalid("members[%d].address %s is outside vpc %s (a host address must be marked external)", i, m.Address, r.vpc.ID)
		}
	}
	return nil
}

// CreateLoadBalancers validates and creates load balancers in project
// pid, all or nothing, allocating each VIP from its subnet (or taking the
// requested vip_address).
func (s *Core) CreateLoadBalancers(ctx context.Context, pid string, lbs []capi.LoadBalancer) ([]capi.LoadBalancer, error) {
	if err := s.requireProject(ctx, pid); err != nil {
		return nil, err
	}
	plans := make([]*lbPlan, len(lbs))
	allocs := make([]*alloc, len(lbs))
	ids := map[string]bool{}
	ranges := map[string]*vpcRanges{}
	for i := range lbs {
		lb := lbs[i]
		if err := NormalizeLoadBalancer(pid, &lb); err != nil {
			return nil, err
		}
		if ids[lb.ID] {
			return nil, invalid("loadbalancer id %q appears twice in the request", lb.ID)
		}
		ids[lb.ID] = true
		e, rev, err := s.subnet(ctx, pid, lb.VIPSubnetID)
		if err != nil {
			return nil, fmt.Errorf("loadbalancer %s: vip_subnet_id: %w", lb.ID, err)
		}
		r := ranges[e.vpc.ID]
		if r == nil {
			if r, err = s.vpcRanges(ctx, pid, e.vpc); err != nil {
				return nil, err
			}
			ranges[e.vpc.ID] = r
		}
		if err := checkMembers(r, lb.Members); err != nil {
			return nil, fmt.Errorf("loadbalancer %s: %w", lb.ID, err)
		}
		pl := &lbPlan{alloc: alloc{what: "loadbalancer " + lb.ID, entry: e, subRev: rev}, lb: lb}
		if lb.VIPAddress != "" {
			off, err := e.sub.Request(lb.VIPAddress)
			if err != nil {
				return nil, fmt.Errorf("loadbalancer %s: vip_address: %w", lb.ID, err)
			}
			pl.requested, pl.off = true, off
		}
		plans[i], allocs[i] = pl, &pl.alloc
		if err := s.loadTracker(ctx, e, false); err != nil {
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
			lb := &pl.lb
			lb.VIPAddress = pl.entry.sub.Addr(pl.off).String()
			lb.VPCID, lb.VNI = pl.entry.vpc.ID, pl.entry.vpc.VNI
			lb.ProvisioningStatus, lb.OperatingStatus = capi.ProvisioningActive, operating(len(lb.Members))
			lb.CreatedAt, lb.UpdatedAt = ts, ts
			if !seenSub[pl.entry.key] {
				seenSub[pl.entry.key] = true
				txn.Conds = append(txn.Conds, store.Cond{Kind: store.CondModRev, Key: pl.entry.key, Rev: pl.subRev})
			}
			k := lbKey(pid, lb.ID)
			blk, bit := ipam.Block(pl.off)
			txn.Conds = append(txn.Conds, store.Cond{Kind: store.CondAbsent, Key: k})
			txn.Ops = append(txn.Ops,
				store.Op{Kind: store.OpPut, Key: k, Value: mustJSON(lb)},
				store.Op{Kind: store.OpSetBit, Key: pl.entry.blockKey(blk), Bit: bit, Size: ipam.BlockBytes})
		}
		rev, err := s.st.Txn(ctx, txn)
		if err == nil {
			out := make([]capi.LoadBalancer, len(plans))
			for i, pl := range plans {
				pl.entry.tracker.Commit(pl.off)
				pl.reserved = false
				pl.lb.RevisionNumber = rev
				out[i] = pl.lb
			}
			return out, nil
		}
		retry, ferr := s.allocFailed(allocs, err, func(i int) string { return lbKey(pid, plans[i].lb.ID) }, "vip_address")
		for _, pl := range plans {
			if !pl.requested {
				pl.lb.VIPAddress = ""
			}
		}
		if ferr == nil && retry && try < maxCreateTries {
			if ferr = s.refreshAllocs(ctx, allocs); ferr == nil {
				ferr = s.reloadTrackers(ctx, allocs)
			}
			if ferr == nil {
				continue
			}
		}
		if ferr == nil {
			ferr = fmt.Errorf("create load balancers: %w", err)
			if errors.Is(err, kerrors.Conflict) {
				ferr = kerrors.New(kerrors.Unavailable, "create load balancers: still contended after %d tries: %v", try+1, err)
			}
		}
		return nil, ferr
	}
}

// allocFailed releases the reservations of allocs after a failed
// transaction and says whether a retry can succeed, or returns the error
// for the caller. keyOf gives the store key of the object allocation i is
// for; field names the address in messages.
func (s *Core) allocFailed(allocs []*alloc, err error, keyOf func(int) string, field string) (bool, error) {
	var te *store.TxnError
	isTxn := errors.As(err, &te)
	retry := false
	var final error
	for i, a := range allocs {
		blk, bit := ipam.Block(a.off)
		taken := false
		switch {
		case !isTxn:
		case te.Cond != nil && te.Cond.Key == keyOf(i):
			final = kerrors.New(kerrors.Conflict, "%s already exists", a.what)
		case te.Cond != nil && te.Cond.Key == a.entry.key:
			s.dropSubnet(a.entry.key) // changed (a delete started?): re-resolve
			retry = true
		case te.Op != nil && te.Op.Key == a.entry.blockKey(blk) && te.Op.Bit == bit:
			taken = true
			if a.requested {
				final = kerrors.New(kerrors.Conflict, "%s: %s %s is in use", a.what, field, a.entry.sub.Addr(a.off))
			} else {
				retry = true
			}
		}
		if a.reserved {
			a.entry.tracker.Abort(a.off, taken)
			a.reserved = false
		}
	}
	if final != nil {
		return false, final
	}
	return retry, nil
}

func decodeLB(kv store.KV) (capi.LoadBalancer, error) {
	var lb capi.LoadBalancer
	if err := json.Unmarshal(kv.Value, &lb); err != nil {
		return lb, fmt.Errorf("decode stored load balancer %s: %w", kv.Key, err)
	}
	lb.RevisionNumber = kv.ModRev
	return lb, nil
}

func (s *Core) readLB(ctx context.Context, pid, id string) (capi.LoadBalancer, error) {
	if err := s.requireProject(ctx, pid); err != nil {
		return capi.LoadBalancer{}, err
	}
	if err := ValidID("loadbalancer", id); err != nil {
		return capi.LoadBalancer{}, err
	}
	kv, err := s.st.Get(ctx, lbKey(pid, id))
	if err != nil {
		if errors.Is(err, kerrors.NotFound) {
			return capi.LoadBalancer{}, kerrors.New(kerrors.NotFound, "loadbalancer %q not found in project %q", id, pid)
		}
		return capi.LoadBalancer{}, err
	}
	return decodeLB(kv)
}

// GetLoadBalancer reads load balancer id of project pid.
func (s *Core) GetLoadBalancer(ctx context.Context, pid, id string) (capi.LoadBalancer, error) {
	return s.readLB(ctx, pid, id)
}

// ListLoadBalancers lists the load balancers of project pid, or of every
// project when pid is "".
func (s *Core) ListLoadBalancers(ctx context.Context, pid string) ([]capi.LoadBalancer, error) {
	prefix := "svc/lb/"
	if pid != "" {
		if err := s.requireProject(ctx, pid); err != nil {
			return nil, err
		}
		prefix += pid + "/"
	}
	out := []capi.LoadBalancer{}
	_, err := s.st.ForEach(ctx, prefix, func(kv store.KV) error {
		lb, err := decodeLB(kv)
		out = append(out, lb)
		return err
	})
	return out, err
}

// UpdateLoadBalancer replaces the fields of u that are set. Its cost is
// that of the one load balancer (and, for members, the VPC's subnets).
func (s *Core) UpdateLoadBalancer(ctx context.Context, pid, id string, u capi.LoadBalancerUpdate) (capi.LoadBalancer, error) {
	var err error
	if u.Name != nil {
		if err := checkLen("name", *u.Name, 255); err != nil {
			return capi.LoadBalancer{}, err
		}
	}
	if u.Description != nil {
		if err := checkLen("description", *u.Description, 1024); err != nil {
			return capi.LoadBalancer{}, err
		}
	}
	var ls []capi.Listener
	var ms []capi.Member
	if u.Listeners != nil {
		if ls, err = capi.NormalizeListeners(*u.Listeners); err != nil {
			return capi.LoadBalancer{}, err
		}
	}
	if u.Members != nil {
		if ms, err = capi.NormalizeMembers(*u.Members); err != nil {
			return capi.LoadBalancer{}, err
		}
	}
	if u.SessionPersistence != nil {
		if u.ClearSessionPersistence {
			return capi.LoadBalancer{}, invalid("session_persistence and clear_session_persistence both given")
		}
		if err := capi.NormalizePersistence(u.SessionPersistence); err != nil {
			return capi.LoadBalancer{}, err
		}
	}
	if u.Policy != nil {
		if err := capi.NormalizePolicy(u.Policy); err != nil {
			return capi.LoadBalancer{}, err
		}
	}
	return s.modifyLB(ctx, pid, id, u.Members != nil, ms, func(lb *capi.LoadBalancer) {
		if u.Name != nil {
			lb.Name = *u.Name
		}
		if u.Description != nil {
			lb.Description = *u.Description
		}
		if u.Listeners != nil {
			lb.Listeners = ls
		}
		if u.SessionPersistence != nil {
			lb.SessionPersistence = u.SessionPersistence
		}
		if u.ClearSessionPersistence {
			lb.SessionPersistence = nil
		}
		if u.Policy != nil {
			lb.Policy = *u.Policy
		}
	})
}

// SetMembers replaces the member set of load balancer id: one read and one
// conditional write of that load balancer, O(its members).
func (s *Core) SetMembers(ctx context.Context, pid, id string, members []capi.Member) (capi.LoadBalancer, error) {
	ms, err := capi.NormalizeMembers(members)
	if err != nil {
		return capi.LoadBalancer{}, err
	}
	return s.modifyLB(ctx, pid, id, true, ms, nil)
}

// modifyLB applies fn (and the member set ms when setMembers) to the
// stored load balancer with a compare-and-swap, retried.
func (s *Core) modifyLB(ctx context.Context, pid, id string, setMembers bool, ms []capi.Member, fn func(*capi.LoadBalancer)) (capi.LoadBalancer, error) {
	k := lbKey(pid, id)
	var ranges *vpcRanges
	for try := 0; try < 16; try++ {
		lb, err := s.readLB(ctx, pid, id)
		if err != nil {
			return lb, err
		}
		if setMembers {
			if ranges == nil {
				var vpc capi.VPC
				if _, err := s.getJSON(ctx, vpcKey(pid, lb.VPCID), "vpc", lb.VPCID, &vpc); err != nil {
					return lb, err
				}
				if ranges, err = s.vpcRanges(ctx, pid, vpc); err != nil {
					return lb, err
				}
			}
			if err := checkMembers(ranges, ms); err != nil {
				return lb, err
			}
			lb.Members = ms
			lb.OperatingStatus = operating(len(ms))
		}
		if fn != nil {
			fn(&lb)
		}
		if err := capi.CheckMemberListeners(lb.Listeners, lb.Members); err != nil {
			return lb, err
		}
		old := lb.RevisionNumber
		lb.RevisionNumber = 0
		lb.UpdatedAt = now()
		rev, err := s.st.Txn(ctx, store.Txn{Conds: []store.Cond{{Kind: store.CondModRev, Key: k, Rev: old}}, Ops: []store.Op{{Kind: store.OpPut, Key: k, Value: mustJSON(lb)}}})
		if txnFailedOn(err, k) {
			continue
		}
		if err != nil {
			return lb, err
		}
		lb.RevisionNumber = rev
		return lb, nil
	}
	return capi.LoadBalancer{}, kerrors.New(kerrors.Unavailable, "loadbalancer %s: too many concurrent changes", id)
}

// DeleteLoadBalancer deletes a load balancer, releases its VIP and
// disassociates its floating IPs in the same transaction.
func (s *Core) DeleteLoadBalancer(ctx context.Context, pid, id string) error {
	k := lbKey(pid, id)
	for try := 0; try < 8; try++ {
		lb, err := s.readLB(ctx, pid, id)
		if err != nil {
			return err
		}
		sub, tr, err := s.subnetForRelease(ctx, pid, lb.VIPSubnetID)
		if err != nil {
			return fmt.Errorf("loadbalancer %s: vip subnet: %w", id, err)
		}
		off, err := sub.Request(lb.VIPAddress)
		if err != nil {
			return fmt.Errorf("loadbalancer %s: stored vip: %w", id, err)
		}
		blk, bit := ipam.Block(off)
		txn := store.Txn{
			Conds: []store.Cond{{Kind: store.CondModRev, Key: k, Rev: lb.RevisionNumber}},
			Ops:   []store.Op{{Kind: store.OpDelete, Key: k}, {Kind: store.OpClearBit, Key: blockKey(pid, lb.VIPSubnetID, blk), Bit: bit}},
		}
		if err := s.disassociateAll(ctx, &txn, "lb", pid, id); err != nil {
			return err
		}
		_, err = s.st.Txn(ctx, txn)
		var te *store.TxnError
		if errors.As(err, &te) {
			continue // changed meanwhile (members, an association): re-read
		}
		if err != nil {
			return fmt.Errorf("delete loadbalancer %s: %w", id, err)
		}
		if tr != nil {
			tr.Release(off)
		}
		return nil
	}
	return kerrors.New(kerrors.Unavailable, "delete loadbalancer %s: too many concurrent changes", id)
}
