package core

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"

	"kurma.dev/kurma/internal/controller/ipam"
	"kurma.dev/kurma/internal/controller/store"
	capi "kurma.dev/kurma/pkg/controllerapi"
	"kurma.dev/kurma/pkg/kerrors"
)

// storedSubnet is a subnet as persisted; Deleting is set by the first step
// of a delete so that in-flight allocations (conditioned on the subnet's
// revision) fail instead of racing the emptiness check.
type storedSubnet struct {
	capi.Subnet
	Deleting bool `json:"deleting,omitempty"`
}

// subnetsOf lists the subnets of project pid in VPC vpc ("" : all).
func (s *Core) subnetsOf(ctx context.Context, pid, vpc string) ([]capi.Subnet, error) {
	out := []capi.Subnet{}
	_, err := s.st.ForEach(ctx, "subnets/"+pid+"/", func(kv store.KV) error {
		var sn storedSubnet
		if err := json.Unmarshal(kv.Value, &sn); err != nil {
			return err
		}
		if vpc == "" || sn.NetworkID == vpc {
			sn.RevisionNumber = kv.ModRev
			out = append(out, sn.Subnet)
		}
		return nil
	})
	return out, err
}

// parsePools converts wire allocation pools.
func parsePools(in []capi.AllocationPool) []ipam.Pool {
	var pools []ipam.Pool
	for _, p := range in {
		pools = append(pools, ipam.Pool{Start: p.Start, End: p.End})
	}
	return pools
}

// CreateSubnet creates subnet sn in its VPC (sn.NetworkID) of project pid.
// A subnet of ports lies inside the VPC's CIDR (when the VPC has one); a
// service subnet may lie outside it. Neither may overlap another subnet of
// the VPC.
func (s *Core) CreateSubnet(ctx context.Context, pid string, sn capi.Subnet) (capi.Subnet, error) {
	if err := s.checkChild(ctx, pid, "subnet", &sn.ID, sn.ProjectID, sn.Name); err != nil {
		return sn, err
	}
	if sn.NetworkID == "" {
		return sn, kerrors.New(kerrors.Invalid, "subnet network_id (the VPC) is required")
	}
	if err := ValidID("vpc", sn.NetworkID); err != nil {
		return sn, err
	}
	switch sn.Purpose {
	case capi.SubnetPurposePorts, capi.SubnetPurposeService:
	default:
		return sn, kerrors.New(kerrors.Invalid, "subnet purpose %q: want \"\" (ports) or %q", sn.Purpose, capi.SubnetPurposeService)
	}
	sub, err := ipam.New(sn.CIDR, sn.IPVersion, sn.GatewayIP, parsePools(sn.AllocationPools))
	if err != nil {
		return sn, err
	}
	for _, d := range sn.DNSNameservers {
		if _, err := netip.ParseAddr(d); err != nil {
			return sn, kerrors.New(kerrors.Invalid, "dns_nameservers: %q is not an address", d)
		}
	}
	var vpc capi.VPC
	if _, err := s.getJSON(ctx, vpcKey(pid, sn.NetworkID), "vpc", sn.NetworkID, &vpc); err != nil {
		return sn, err
	}
	if vpc.CIDR != "" && sn.Purpose != capi.SubnetPurposeService {
		vp := netip.MustParsePrefix(vpc.CIDR)
		if !vp.Contains(sub.Prefix().Addr()) || vp.Bits() > sub.Prefix().Bits() {
			return sn, kerrors.New(kerrors.Invalid, "subnet %s is not inside vpc cidr %s", sub.Prefix(), vp)
		}
	}
	others, err := s.subnetsOf(ctx, pid, sn.NetworkID)
	if err != nil {
		return sn, err
	}
	for _, o := range others {
		if op, err := netip.ParsePrefix(o.CIDR); err == nil && op.Overlaps(sub.Prefix()) {
			return sn, kerrors.New(kerrors.Conflict, "subnet %s overlaps subnet %s (%s) in vpc %s", sub.Prefix(), o.ID, op, sn.NetworkID)
		}
	}
	sn.ProjectID = pid
	sn.CIDR = sub.Prefix().String()
	sn.IPVersion = 4
	if !sub.Prefix().Addr().Is4() {
		sn.IPVersion = 6
	}
	sn.GatewayIP = sub.Gateway().String()
	sn.AllocationPools = nil
	for _, p := range sub.Pools() {
		sn.AllocationPools = append(sn.AllocationPools, capi.AllocationPool{Start: p.Start, End: p.End})
	}
	sn.VNI = vpc.VNI
	sn.CreatedAt = now()
	sn.UpdatedAt = sn.CreatedAt
	sn.RevisionNumber = 0
	k := subnetKey(pid, sn.ID)
	rev, err := s.st.Txn(ctx, store.Txn{
		Conds: []store.Cond{{Kind: store.CondAbsent, Key: k}, {Kind: store.CondPresent, Key: vpcKey(pid, sn.NetworkID)}},
		Ops:   []store.Op{{Kind: store.OpPut, Key: k, Value: mustJSON(storedSubnet{Subnet: sn})}},
	})
	switch {
	case txnFailedOn(err, k):
		return sn, kerrors.New(kerrors.Conflict, "subnet %q already exists", sn.ID)
	case txnFailedOn(err, vpcKey(pid, sn.NetworkID)):
		return sn, kerrors.New(kerrors.NotFound, "vpc %q not found", sn.NetworkID)
	case err != nil:
		return sn, err
	}
	sn.RevisionNumber = rev
	return sn, nil
}

// GetSubnet reads subnet id of project pid.
func (s *Core) GetSubnet(ctx context.Context, pid, id string) (capi.Subnet, error) {
	c, err := loadChild[storedSubnet](ctx, s, pid, id, "subnet", subnetKey)
	c.v.RevisionNumber = c.rev
	return c.v.Subnet, err
}

// ListSubnets lists the subnets of project pid, of VPC networkID only when
// it is not empty.
func (s *Core) ListSubnets(ctx context.Context, pid, networkID string) ([]capi.Subnet, error) {
	if err := s.requireProject(ctx, pid); err != nil {
		return nil, err
	}
	return s.subnetsOf(ctx, pid, networkID)
}

// DeleteSubnet deletes a subnet in which no address (port or VIP) is
// allocated.
func (s *Core) DeleteSubnet(ctx context.Context, pid, id string) error {
	c, err := loadChild[storedSubnet](ctx, s, pid, id, "subnet", subnetKey)
	if err != nil {
		return err
	}
	k, sn, rev := c.key, c.v, c.rev
	// Step 1: mark deleting (bumps the revision allocations depend on).
	sn.Deleting = true
	rev, err = s.st.Txn(ctx, store.Txn{Conds: []store.Cond{{Kind: store.CondModRev, Key: k, Rev: rev}}, Ops: []store.Op{{Kind: store.OpPut, Key: k, Value: mustJSON(sn)}}})
	if err != nil {
		if txnFailedOn(err, k) {
			return kerrors.New(kerrors.Conflict, "subnet %q changed concurrently; retry", id)
		}
		return err
	}
	s.dropSubnet(k)
	// Step 2: refuse while any address is allocated; undo the mark.
	blocks, _, err := s.st.List(ctx, ipamPrefix(pid, id))
	if err == nil && len(blocks) > 0 {
		sn.Deleting = false
		_, uerr := s.st.Txn(ctx, store.Txn{Conds: []store.Cond{{Kind: store.CondModRev, Key: k, Rev: rev}}, Ops: []store.Op{{Kind: store.OpPut, Key: k, Value: mustJSON(sn)}}})
		if uerr != nil {
			s.log.Warn("could not clear subnet deleting mark", "subnet", id, "err", uerr)
		}
		return kerrors.New(kerrors.Conflict, "subnet %q still has ports", id)
	}
	if err != nil {
		return err
	}
	if _, err := s.st.Txn(ctx, store.Txn{Conds: []store.Cond{{Kind: store.CondModRev, Key: k, Rev: rev}}, Ops: []store.Op{{Kind: store.OpDelete, Key: k}}}); err != nil {
		return fmt.Errorf("delete subnet %s: %w", id, err)
	}
	return nil
}
