package core

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"kurma.dev/kurma/internal/controller/ipam"
	"kurma.dev/kurma/internal/controller/store"
	capi "kurma.dev/kurma/pkg/controllerapi"
	"kurma.dev/kurma/pkg/kerrors"
)

// This file is the IPAM cache: a subnetEntry per subnet (or external
// network) holds the parsed range and an ipam.Tracker mirroring the
// stored address bitmap, so that an allocation reads nothing from the
// store in the common case; the store's bit operations decide.

// blockKey names bitmap block blk of the entry's range.
func (e *subnetEntry) blockKey(blk int) string { return fmt.Sprintf("%s%06d", e.ipamPfx, blk) }

// subnet returns the cached entry for subnet pid/sid, loading it (and its
// VPC) when needed. NotFound when it does not exist or is being deleted.
func (s *Core) subnet(ctx context.Context, pid, sid string) (*subnetEntry, int64, error) {
	k := subnetKey(pid, sid)
	s.mu.Lock()
	e := s.subnets[k]
	s.mu.Unlock()
	if e != nil {
		return e, e.wire.RevisionNumber, nil
	}
	var sn storedSubnet
	rev, err := s.getJSON(ctx, k, "subnet", sid, &sn)
	if err != nil {
		return nil, 0, err
	}
	if sn.Deleting {
		return nil, 0, kerrors.New(kerrors.NotFound, "subnet %q is being deleted", sid)
	}
	var vpc capi.VPC
	if _, err := s.getJSON(ctx, vpcKey(pid, sn.NetworkID), "vpc", sn.NetworkID, &vpc); err != nil {
		return nil, 0, err
	}
	sub, err := ipam.New(sn.CIDR, sn.IPVersion, sn.GatewayIP, parsePools(sn.AllocationPools))
	if err != nil {
		return nil, 0, fmt.Errorf("stored subnet %s: %w", sid, err)
	}
	sn.RevisionNumber = rev
	e = &subnetEntry{wire: sn.Subnet, vpc: vpc, sub: sub, tracker: ipam.NewTracker(sub), ipamPfx: ipamPrefix(pid, sid), key: k}
	s.mu.Lock()
	if cur := s.subnets[k]; cur != nil {
		e = cur
	} else {
		s.subnets[k] = e
	}
	s.mu.Unlock()
	return e, e.wire.RevisionNumber, nil
}

func (s *Core) dropSubnet(k string) {
	s.mu.Lock()
	delete(s.subnets, k)
	s.mu.Unlock()
}

// loadTracker (re)reads the subnet's bitmap blocks into its tracker.
func (s *Core) loadTracker(ctx context.Context, e *subnetEntry, force bool) error {
	e.loadMu.Lock()
	defer e.loadMu.Unlock()
	if e.loaded && !force {
		return nil
	}
	sid := e.wire.ID
	seen := map[int]bool{}
	_, err := s.st.ForEach(ctx, e.ipamPfx, func(kv store.KV) error {
		var blk int
		if _, err := fmt.Sscanf(kv.Key[len(e.ipamPfx):], "%d", &blk); err != nil {
			return fmt.Errorf("bad ipam key %q: %w", kv.Key, err)
		}
		e.tracker.Load(blk, kv.Value)
		seen[blk] = true
		return nil
	})
	if err != nil {
		return fmt.Errorf("load addresses of subnet %s: %w", sid, err)
	}
	if force {
		for blk := range e.sub.Blocks() {
			if !seen[blk] {
				e.tracker.Load(blk, nil)
			}
		}
	}
	e.loaded = true
	return nil
}

// resolveNetwork maps a port's network_id (a subnet, or a VPC plus an
// optional fixed_ips subnet) to the subnet to allocate from.
func (s *Core) resolveNetwork(ctx context.Context, pid string, p *capi.Port) (*subnetEntry, int64, error) {
	var want string
	if len(p.FixedIPs) > 0 {
		want = p.FixedIPs[0].SubnetID
	}
	e, rev, err := s.subnet(ctx, pid, p.NetworkID)
	if err == nil {
		if want != "" && want != e.wire.ID {
			return nil, 0, kerrors.New(kerrors.Invalid, "port %s: fixed_ips subnet %q differs from network_id subnet %q", p.ID, want, e.wire.ID)
		}
		return e, rev, portSubnet(p, e)
	}
	if !errors.Is(err, kerrors.NotFound) {
		return nil, 0, err
	}
	// network_id may name a VPC.
	var vpc capi.VPC
	if _, verr := s.getJSON(ctx, vpcKey(pid, p.NetworkID), "vpc", p.NetworkID, &vpc); verr != nil {
		if errors.Is(verr, kerrors.NotFound) {
			return nil, 0, kerrors.New(kerrors.NotFound, "port %s: network %q is neither a subnet nor a vpc of project %s", p.ID, p.NetworkID, pid)
		}
		return nil, 0, verr
	}
	if want == "" {
		subs, err := s.subnetsOf(ctx, pid, vpc.ID)
		if err != nil {
			return nil, 0, err
		}
		subs = slices.DeleteFunc(subs, func(sn capi.Subnet) bool { return sn.Purpose == capi.SubnetPurposeService })
		if len(subs) != 1 {
			return nil, 0, kerrors.New(kerrors.Invalid, "port %s: vpc %s has %d subnets; name one in fixed_ips", p.ID, vpc.ID, len(subs))
		}
		want = subs[0].ID
	}
	e, rev, err = s.subnet(ctx, pid, want)
	if err != nil {
		return nil, 0, err
	}
	if e.wire.NetworkID != vpc.ID {
		return nil, 0, kerrors.New(kerrors.Invalid, "port %s: subnet %s is not in vpc %s", p.ID, want, vpc.ID)
	}
	return e, rev, portSubnet(p, e)
}

// portSubnet refuses a service subnet (VIPs only) for a port.
func portSubnet(p *capi.Port, e *subnetEntry) error {
	if e.wire.Purpose == capi.SubnetPurposeService {
		return kerrors.New(kerrors.Invalid, "port %s: subnet %s is a service subnet (load balancer VIPs only)", p.ID, e.wire.ID)
	}
	return nil
}
