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

// An external network is a range of addresses outside every VPC, owned by
// no project, from which floating IPs are allocated. It is stored under
// extnets/<id> and its address bitmap under ipamx/<id>/, with the same
// IPAM (ipam.Subnet, ipam.Tracker, bit operations in the store) as a
// subnet's; floating IPs are its only users.

// storedExtnet is an external network as persisted; Deleting plays the
// part it plays for subnets.
type storedExtnet struct {
	capi.ExternalNetwork
	Deleting bool `json:"deleting,omitempty"`
}

// CreateExternalNetwork creates n. It may not overlap another external
// network.
func (s *Core) CreateExternalNetwork(ctx context.Context, n capi.ExternalNetwork) (capi.ExternalNetwork, error) {
	var err error
	if n.ID, err = idOrNew("external network", n.ID); err != nil {
		return n, err
	}
	if err := checkLen("name", n.Name, 255); err != nil {
		return n, err
	}
	if err := checkLen("description", n.Description, 1024); err != nil {
		return n, err
	}
	sub, err := ipam.New(n.CIDR, n.IPVersion, n.GatewayIP, parsePools(n.AllocationPools))
	if err != nil {
		return n, err
	}
	others, err := s.ListExternalNetworks(ctx)
	if err != nil {
		return n, err
	}
	for _, o := range others {
		if op, err := netip.ParsePrefix(o.CIDR); err == nil && op.Overlaps(sub.Prefix()) {
			return n, kerrors.New(kerrors.Conflict, "external network %s overlaps external network %s (%s)", sub.Prefix(), o.ID, op)
		}
	}
	n.CIDR = sub.Prefix().String()
	n.IPVersion = 4
	if !sub.Prefix().Addr().Is4() {
		n.IPVersion = 6
	}
	n.GatewayIP = sub.Gateway().String()
	n.AllocationPools = nil
	for _, p := range sub.Pools() {
		n.AllocationPools = append(n.AllocationPools, capi.AllocationPool{Start: p.Start, End: p.End})
	}
	n.CreatedAt = now()
	n.UpdatedAt = n.CreatedAt
	n.RevisionNumber = 0
	k := extnetKey(n.ID)
	rev, err := s.st.Txn(ctx, store.Txn{
		Conds: []store.Cond{{Kind: store.CondAbsent, Key: k}},
		Ops:   []store.Op{{Kind: store.OpPut, Key: k, Value: mustJSON(storedExtnet{ExternalNetwork: n})}},
	})
	if txnFailedOn(err, k) {
		return n, kerrors.New(kerrors.Conflict, "external network %q already exists", n.ID)
	}
	if err != nil {
		return n, err
	}
	n.RevisionNumber = rev
	return n, nil
}

// GetExternalNetwork reads external network id.
func (s *Core) GetExternalNetwork(ctx context.Context, id string) (capi.ExternalNetwork, error) {
	var n storedExtnet
	if err := ValidID("external network", id); err != nil {
		return n.ExternalNetwork, err
	}
	rev, err := s.getJSON(ctx, extnetKey(id), "external network", id, &n)
	n.RevisionNumber = rev
	return n.ExternalNetwork, err
}

// ListExternalNetworks lists every external network.
func (s *Core) ListExternalNetworks(ctx context.Context) ([]capi.ExternalNetwork, error) {
	out := []capi.ExternalNetwork{}
	_, err := s.st.ForEach(ctx, "extnets/", func(kv store.KV) error {
		var n storedExtnet
		if err := json.Unmarshal(kv.Value, &n); err != nil {
			return err
		}
		n.RevisionNumber = kv.ModRev
		out = append(out, n.ExternalNetwork)
		return nil
	})
	return out, err
}

// DeleteExternalNetwork deletes an external network that holds no
// floating IP.
func (s *Core) DeleteExternalNetwork(ctx context.Context, id string) error {
	if err := ValidID("external network", id); err != nil {
		return err
	}
	k := extnetKey(id)
	var n storedExtnet
	rev, err := s.getJSON(ctx, k, "external network", id, &n)
	if err != nil {
		return err
	}
	// As for subnets: mark, check for allocated addresses, delete.
	n.Deleting = true
	rev, err = s.st.Txn(ctx, store.Txn{Conds: []store.Cond{{Kind: store.CondModRev, Key: k, Rev: rev}}, Ops: []store.Op{{Kind: store.OpPut, Key: k, Value: mustJSON(n)}}})
	if err != nil {
		if txnFailedOn(err, k) {
			return kerrors.New(kerrors.Conflict, "external network %q changed concurrently; retry", id)
		}
		return err
	}
	s.dropSubnet(k)
	blocks, _, err := s.st.List(ctx, extIpamPrefix(id))
	if err == nil && len(blocks) > 0 {
		n.Deleting = false
		if _, uerr := s.st.Txn(ctx, store.Txn{Conds: []store.Cond{{Kind: store.CondModRev, Key: k, Rev: rev}}, Ops: []store.Op{{Kind: store.OpPut, Key: k, Value: mustJSON(n)}}}); uerr != nil {
			s.log.Warn("could not clear external network deleting mark", "external_network", id, "err", uerr)
		}
		return kerrors.New(kerrors.Conflict, "external network %q still has floating IPs", id)
	}
	if err != nil {
		return err
	}
	if _, err := s.st.Txn(ctx, store.Txn{Conds: []store.Cond{{Kind: store.CondModRev, Key: k, Rev: rev}}, Ops: []store.Op{{Kind: store.OpDelete, Key: k}}}); err != nil {
		return fmt.Errorf("delete external network %s: %w", id, err)
	}
	return nil
}

// extnet returns the cached entry of external network id, loading it when
// needed. NotFound when it does not exist or is being deleted.
func (s *Core) extnet(ctx context.Context, id string) (*subnetEntry, int64, error) {
	k := extnetKey(id)
	s.mu.Lock()
	e := s.subnets[k]
	s.mu.Unlock()
	if e != nil {
		return e, e.wire.RevisionNumber, nil
	}
	var n storedExtnet
	rev, err := s.getJSON(ctx, k, "external network", id, &n)
	if err != nil {
		return nil, 0, err
	}
	if n.Deleting {
		return nil, 0, kerrors.New(kerrors.NotFound, "external network %q is being deleted", id)
	}
	sub, err := ipam.New(n.CIDR, n.IPVersion, n.GatewayIP, parsePools(n.AllocationPools))
	if err != nil {
		return nil, 0, fmt.Errorf("stored external network %s: %w", id, err)
	}
	wire := capi.Subnet{ID: id, CIDR: n.CIDR, GatewayIP: n.GatewayIP, RevisionNumber: rev}
	e = &subnetEntry{wire: wire, sub: sub, tracker: ipam.NewTracker(sub), ipamPfx: extIpamPrefix(id), key: k, ext: true}
	s.mu.Lock()
	if cur := s.subnets[k]; cur != nil {
		e = cur
	} else {
		s.subnets[k] = e
	}
	s.mu.Unlock()
	return e, e.wire.RevisionNumber, nil
}

// extnetForRelease returns the parsed range of external network id (and
// its tracker when cached), even while it is marked for deletion.
func (s *Core) extnetForRelease(ctx context.Context, id string) (*ipam.Subnet, *ipam.Tracker, error) {
	s.mu.Lock()
	e := s.subnets[extnetKey(id)]
	s.mu.Unlock()
	if e != nil {
		return e.sub, e.tracker, nil
	}
	var n storedExtnet
	if _, err := s.getJSON(ctx, extnetKey(id), "external network", id, &n); err != nil {
		return nil, nil, err
	}
	sub, err := ipam.New(n.CIDR, n.IPVersion, n.GatewayIP, parsePools(n.AllocationPools))
	if err != nil {
		return nil, nil, fmt.Errorf("stored external network %s: %w", id, err)
	}
	return sub, nil, nil
}
