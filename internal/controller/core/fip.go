package core

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"kurma.dev/kurma/internal/controller/ipam"
	"kurma.dev/kurma/internal/controller/store"
	capi "kurma.dev/kurma/pkg/controllerapi"
	"kurma.dev/kurma/pkg/kerrors"
)

// A floating IP lives at svc/fip/<pid>/<id>, its address is a bit under
// ipamx/<ext>/, and its association (when it has one) is also recorded
// at fipref/<kind>/<pid>/<target> (see fipRefKey). Every write that
// changes an association rewrites the floating IP under a revision
// condition, so the floating IP and its reference change together.

// target is what a floating IP is associated with.
type target struct {
	kind, id  string // "port" or "lb"
	key       string // store key of the port or load balancer
	fixedIP   string
	vpcID     string
	vni       uint32
	refKey    string
	portOrLBs string // "port x" / "loadbalancer x", for messages
}

// resolveTarget reads the port or load balancer a wants (nil: none).
func (s *Core) resolveTarget(ctx context.Context, pid string, a capi.FloatingIPAssociation) (*target, error) {
	switch {
	case a.PortID != "" && a.LoadBalancerID != "":
		return nil, invalid("give port_id or loadbalancer_id, not both")
	case a.PortID != "":
		if err := ValidID("port_id", a.PortID); err != nil {
			return nil, err
		}
		p, err := s.readPort(ctx, pid, a.PortID)
		if err != nil {
			return nil, fmt.Errorf("port_id: %w", err)
		}
		if len(p.FixedIPs) == 0 {
			return nil, invalid("port_id %s has no address", p.ID)
		}
		return &target{kind: "port", id: p.ID, key: portKey(pid, p.ID), fixedIP: p.FixedIPs[0].IPAddress, vpcID: p.VPCID, vni: p.VNI,
			refKey: fipRefKey("port", pid, p.ID), portOrLBs: "port " + p.ID}, nil
	case a.LoadBalancerID != "":
		if err := ValidID("loadbalancer_id", a.LoadBalancerID); err != nil {
			return nil, err
		}
		lb, err := s.readLB(ctx, pid, a.LoadBalancerID)
		if err != nil {
			return nil, fmt.Errorf("loadbalancer_id: %w", err)
		}
		return &target{kind: "lb", id: lb.ID, key: lbKey(pid, lb.ID), fixedIP: lb.VIPAddress, vpcID: lb.VPCID, vni: lb.VNI,
			refKey: fipRefKey("lb", pid, lb.ID), portOrLBs: "loadbalancer " + lb.ID}, nil
	}
	return nil, nil
}

// associate sets f's association fields for t (nil: none).
func associate(f *capi.FloatingIP, t *target) {
	f.PortID, f.LoadBalancerID, f.FixedIPAddress, f.VPCID, f.VNI, f.Status = "", "", "", "", 0, capi.FIPDown
	if t == nil {
		return
	}
	if t.kind == "port" {
		f.PortID = t.id
	} else {
		f.LoadBalancerID = t.id
	}
	f.FixedIPAddress, f.VPCID, f.VNI, f.Status = t.fixedIP, t.vpcID, t.vni, capi.FIPActive
}

// refOf is the reference key of f's current association ("" : none).
func refOf(f *capi.FloatingIP) string {
	switch {
	case f.PortID != "":
		return fipRefKey("port", f.ProjectID, f.PortID)
	case f.LoadBalancerID != "":
		return fipRefKey("lb", f.ProjectID, f.LoadBalancerID)
	}
	return ""
}

// claimTarget adds to txn what associating a floating IP with t needs:
// t still exists and has no floating IP. A reference that already names
// fipID is fine (re-association).
func (s *Core) claimTarget(ctx context.Context, txn *store.Txn, t *target, fipID string) (already bool, err error) {
	kv, err := s.st.Get(ctx, t.refKey)
	switch {
	case err == nil && string(kv.Value) == fipID:
		return true, nil
	case err == nil:
		return false, kerrors.New(kerrors.Conflict, "%s already has floating IP %s", t.portOrLBs, kv.Value)
	case !errors.Is(err, kerrors.NotFound):
		return false, err
	}
	txn.Conds = append(txn.Conds, store.Cond{Kind: store.CondPresent, Key: t.key}, store.Cond{Kind: store.CondAbsent, Key: t.refKey})
	txn.Ops = append(txn.Ops, store.Op{Kind: store.OpPut, Key: t.refKey, Value: []byte(fipID)})
	return false, nil
}

// disassociateAll adds to txn (the deletion of port or load balancer id)
// the disassociation of its floating IP, conditioned so that an
// association committed meanwhile fails the transaction instead of being
// missed.
func (s *Core) disassociateAll(ctx context.Context, txn *store.Txn, kind, pid, id string) error {
	rk := fipRefKey(kind, pid, id)
	kv, err := s.st.Get(ctx, rk)
	if errors.Is(err, kerrors.NotFound) {
		txn.Conds = append(txn.Conds, store.Cond{Kind: store.CondAbsent, Key: rk})
		return nil
	}
	if err != nil {
		return err
	}
	txn.Conds = append(txn.Conds, store.Cond{Kind: store.CondModRev, Key: rk, Rev: kv.ModRev})
	txn.Ops = append(txn.Ops, store.Op{Kind: store.OpDelete, Key: rk})
	fid := string(kv.Value)
	f, err := s.readFIP(ctx, pid, fid)
	if errors.Is(err, kerrors.NotFound) {
		return nil // a dangling reference: dropped with its target
	}
	if err != nil {
		return err
	}
	fk := fipKey(pid, fid)
	txn.Conds = append(txn.Conds, store.Cond{Kind: store.CondModRev, Key: fk, Rev: f.RevisionNumber})
	associate(&f, nil)
	f.RevisionNumber, f.UpdatedAt = 0, now()
	txn.Ops = append(txn.Ops, store.Op{Kind: store.OpPut, Key: fk, Value: mustJSON(f)})
	return nil
}

// NormalizeFloatingIP checks the caller-settable fields of f (in project
// pid) that need no stored state and clears the output-only ones.
func NormalizeFloatingIP(pid string, f *capi.FloatingIP) error {
	var err error
	if f.ID, err = idOrNew("floatingip", f.ID); err != nil {
		return err
	}
	if f.ProjectID != "" && f.ProjectID != pid {
		return invalid("floatingip %s: project_id %q does not match the URL's project %q", f.ID, f.ProjectID, pid)
	}
	f.ProjectID = pid
	if err := checkLen("description", f.Description, 1024); err != nil {
		return err
	}
	if f.FloatingNetworkID == "" {
		return invalid("floatingip %s: floating_network_id is required", f.ID)
	}
	if err := ValidID("floating_network_id", f.FloatingNetworkID); err != nil {
		return err
	}
	if f.PortID != "" && f.LoadBalancerID != "" {
		return invalid("floatingip %s: give port_id or loadbalancer_id, not both", f.ID)
	}
	f.FixedIPAddress, f.VPCID, f.VNI, f.Status, f.RevisionNumber = "", "", 0, "", 0
	return nil
}

// CreateFloatingIP allocates a floating IP from its external network (the
// requested address when given) and associates it when it names a port
// or a load balancer.
func (s *Core) CreateFloatingIP(ctx context.Context, pid string, f capi.FloatingIP) (capi.FloatingIP, error) {
	if err := s.requireProject(ctx, pid); err != nil {
		return f, err
	}
	if err := NormalizeFloatingIP(pid, &f); err != nil {
		return f, err
	}
	e, rev, err := s.extnet(ctx, f.FloatingNetworkID)
	if err != nil {
		return f, fmt.Errorf("floating_network_id: %w", err)
	}
	a := &alloc{what: "floatingip " + f.ID, entry: e, subRev: rev}
	if f.FloatingIPAddress != "" {
		off, err := e.sub.Request(f.FloatingIPAddress)
		if err != nil {
			return f, fmt.Errorf("floating_ip_address: %w", err)
		}
		a.requested, a.off = true, off
	}
	if err := s.loadTracker(ctx, e, false); err != nil {
		return f, err
	}
	allocs := []*alloc{a}
	k := fipKey(pid, f.ID)
	for try := 0; ; try++ {
		t, err := s.resolveTarget(ctx, pid, capi.FloatingIPAssociation{PortID: f.PortID, LoadBalancerID: f.LoadBalancerID})
		if err != nil {
			return f, err
		}
		if err := s.reserve(ctx, allocs); err != nil {
			return f, err
		}
		blk, bit := ipam.Block(a.off)
		txn := store.Txn{
			Conds: []store.Cond{{Kind: store.CondModRev, Key: e.key, Rev: a.subRev}, {Kind: store.CondAbsent, Key: k}},
			Ops:   []store.Op{{Kind: store.OpSetBit, Key: a.entry.blockKey(blk), Bit: bit, Size: ipam.BlockBytes}},
		}
		if t != nil {
			if _, err := s.claimTarget(ctx, &txn, t, f.ID); err != nil {
				a.entry.tracker.Abort(a.off, false)
				a.reserved = false
				return f, err
			}
		}
		associate(&f, t)
		f.FloatingIPAddress = a.entry.sub.Addr(a.off).String()
		f.CreatedAt = now()
		f.UpdatedAt = f.CreatedAt
		txn.Ops = append(txn.Ops, store.Op{Kind: store.OpPut, Key: k, Value: mustJSON(f)})
		rev, err := s.st.Txn(ctx, txn)
		if err == nil {
			a.entry.tracker.Commit(a.off)
			a.reserved = false
			f.RevisionNumber = rev
			return f, nil
		}
		if t != nil && (txnFailedOn(err, t.key) || txnFailedOn(err, t.refKey)) {
			s.allocFailed(allocs, nil, func(int) string { return k }, "floating_ip_address")
			if try < maxCreateTries {
				continue // the target went or got a floating IP: resolve again
			}
		}
		retry, ferr := s.allocFailed(allocs, err, func(int) string { return k }, "floating_ip_address")
		if !a.requested {
			f.FloatingIPAddress = ""
		}
		if ferr == nil && retry && try < maxCreateTries {
			if ferr = s.refreshAllocs(ctx, allocs); ferr == nil {
				ferr = s.reloadTrackers(ctx, allocs)
			}
			if ferr == nil {
				e = a.entry
				continue
			}
		}
		if ferr == nil {
			ferr = fmt.Errorf("create floatingip %s: %w", f.ID, err)
		}
		return f, ferr
	}
}

func decodeFIP(kv store.KV) (capi.FloatingIP, error) {
	var f capi.FloatingIP
	if err := json.Unmarshal(kv.Value, &f); err != nil {
		return f, fmt.Errorf("decode stored floating IP %s: %w", kv.Key, err)
	}
	f.RevisionNumber = kv.ModRev
	return f, nil
}

func (s *Core) readFIP(ctx context.Context, pid, id string) (capi.FloatingIP, error) {
	kv, err := s.st.Get(ctx, fipKey(pid, id))
	if err != nil {
		if errors.Is(err, kerrors.NotFound) {
			return capi.FloatingIP{}, kerrors.New(kerrors.NotFound, "floatingip %q not found in project %q", id, pid)
		}
		return capi.FloatingIP{}, err
	}
	return decodeFIP(kv)
}

// GetFloatingIP reads floating IP id of project pid.
func (s *Core) GetFloatingIP(ctx context.Context, pid, id string) (capi.FloatingIP, error) {
	if err := s.requireProject(ctx, pid); err != nil {
		return capi.FloatingIP{}, err
	}
	if err := ValidID("floatingip", id); err != nil {
		return capi.FloatingIP{}, err
	}
	return s.readFIP(ctx, pid, id)
}

// ListFloatingIPs lists the floating IPs of project pid, or of every
// project when pid is "".
func (s *Core) ListFloatingIPs(ctx context.Context, pid string) ([]capi.FloatingIP, error) {
	prefix := "svc/fip/"
	if pid != "" {
		if err := s.requireProject(ctx, pid); err != nil {
			return nil, err
		}
		prefix += pid + "/"
	}
	out := []capi.FloatingIP{}
	_, err := s.st.ForEach(ctx, prefix, func(kv store.KV) error {
		f, err := decodeFIP(kv)
		out = append(out, f)
		return err
	})
	return out, err
}

// AssociateFloatingIP points floating IP id at the port or load balancer
// a names, or at nothing when a is empty (disassociation).
func (s *Core) AssociateFloatingIP(ctx context.Context, pid, id string, a capi.FloatingIPAssociation) (capi.FloatingIP, error) {
	if err := s.requireProject(ctx, pid); err != nil {
		return capi.FloatingIP{}, err
	}
	if err := ValidID("floatingip", id); err != nil {
		return capi.FloatingIP{}, err
	}
	k := fipKey(pid, id)
	for try := 0; try < 16; try++ {
		f, err := s.readFIP(ctx, pid, id)
		if err != nil {
			return f, err
		}
		t, err := s.resolveTarget(ctx, pid, a)
		if err != nil {
			return f, err
		}
		txn := store.Txn{Conds: []store.Cond{{Kind: store.CondModRev, Key: k, Rev: f.RevisionNumber}}}
		oldRef := refOf(&f)
		if t != nil && t.refKey == oldRef {
			return f, nil // already so
		}
		if t == nil && oldRef == "" {
			return f, nil
		}
		if oldRef != "" {
			txn.Ops = append(txn.Ops, store.Op{Kind: store.OpDelete, Key: oldRef})
		}
		if t != nil {
			if _, err := s.claimTarget(ctx, &txn, t, id); err != nil {
				return f, err
			}
		}
		associate(&f, t)
		f.RevisionNumber, f.UpdatedAt = 0, now()
		txn.Ops = append(txn.Ops, store.Op{Kind: store.OpPut, Key: k, Value: mustJSON(f)})
		rev, err := s.st.Txn(ctx, txn)
		var te *store.TxnError
		if errors.As(err, &te) {
			continue // the floating IP or the target changed: read again
		}
		if err != nil {
			return f, err
		}
		f.RevisionNumber = rev
		return f, nil
	}
	return capi.FloatingIP{}, kerrors.New(kerrors.Unavailable, "floatingip %s: too many concurrent changes", id)
}

// DeleteFloatingIP releases floating IP id (and its association).
func (s *Core) DeleteFloatingIP(ctx context.Context, pid, id string) error {
	if err := s.requireProject(ctx, pid); err != nil {
		return err
	}
	if err := ValidID("floatingip", id); err != nil {
		return err
	}
	k := fipKey(pid, id)
	for try := 0; try < 8; try++ {
		f, err := s.readFIP(ctx, pid, id)
		if err != nil {
			return err
		}
		sub, tr, err := s.extnetForRelease(ctx, f.FloatingNetworkID)
		if err != nil {
			return fmt.Errorf("floatingip %s: external network: %w", id, err)
		}
		off, err := sub.Request(f.FloatingIPAddress)
		if err != nil {
			return fmt.Errorf("floatingip %s: stored address: %w", id, err)
		}
		blk, bit := ipam.Block(off)
		txn := store.Txn{
			Conds: []store.Cond{{Kind: store.CondModRev, Key: k, Rev: f.RevisionNumber}},
			Ops:   []store.Op{{Kind: store.OpDelete, Key: k}, {Kind: store.OpClearBit, Key: extIpamPrefix(f.FloatingNetworkID) + fmt.Sprintf("%06d", blk), Bit: bit}},
		}
		if ref := refOf(&f); ref != "" {
			txn.Ops = append(txn.Ops, store.Op{Kind: store.OpDelete, Key: ref})
		}
		_, err = s.st.Txn(ctx, txn)
		if txnFailedOn(err, k) {
			continue
		}
		if err != nil {
			return fmt.Errorf("delete floatingip %s: %w", id, err)
		}
		if tr != nil {
			tr.Release(off)
		}
		return nil
	}
	return kerrors.New(kerrors.Unavailable, "delete floatingip %s: too many concurrent changes", id)
}
