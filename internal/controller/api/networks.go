package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/netip"

	"kurma.dev/kurma/internal/controller/ipam"
	"kurma.dev/kurma/internal/controller/store"
	capi "kurma.dev/kurma/pkg/controllerapi"
	"kurma.dev/kurma/pkg/kerrors"
)

// storedSubnet is a subnet as persisted; Deleting is set by the first step
// of a delete so that in-flight port creations (conditioned on the
// subnet's revision) fail instead of racing the emptiness check.
type storedSubnet struct {
	capi.Subnet
	Deleting bool `json:"deleting,omitempty"`
}

// childFields are the fields every child of a project (VPC, subnet) has.
type childFields struct {
	id        *string
	projectID string
	name      string
}

// decodeChild reads the create request of a child of the URL's project:
// the project exists, the body is {"<key>":{...}}, the id is the client's
// (checked) or a new one, a given project_id matches the URL and the name
// fits. It returns the child and the project id.
func decodeChild[T any](s *Server, r *http.Request, key string, fields func(*T) childFields) (T, string, error) {
	var zero T
	pid := r.PathValue("pid")
	if err := s.requireProject(r.Context(), pid); err != nil {
		return zero, "", err
	}
	b, err := readBody(r)
	if err != nil {
		return zero, "", err
	}
	v, err := decodeWrapped[T](b, key)
	if err != nil {
		return zero, "", err
	}
	f := fields(&v)
	if *f.id, err = idOrNew(key, *f.id); err != nil {
		return zero, "", err
	}
	if f.projectID != "" && f.projectID != pid {
		return zero, "", kerrors.New(kerrors.Invalid, "project_id %q does not match the URL's project %q", f.projectID, pid)
	}
	if err := checkLen("name", f.name, 255); err != nil {
		return zero, "", err
	}
	return v, pid, nil
}

func (s *Server) createVPC(w http.ResponseWriter, r *http.Request) error {
	v, pid, err := decodeChild[capi.VPC](s, r, "vpc", func(x *capi.VPC) childFields {
		return childFields{&x.ID, x.ProjectID, x.Name}
	})
	if err != nil {
		return err
	}
	if v.CIDR != "" {
		p, err := netip.ParsePrefix(v.CIDR)
		if err != nil || p.Masked() != p {
			return kerrors.New(kerrors.Invalid, "vpc cidr %q is not a network prefix", v.CIDR)
		}
	}
	v.ProjectID = pid
	v.CreatedAt = now()
	v.UpdatedAt = v.CreatedAt
	v.RevisionNumber = 0
	k := vpcKey(pid, v.ID)
	for try := 0; ; try++ {
		v.VNI = ipam.RandomVNI()
		rev, err := s.st.Txn(r.Context(), store.Txn{
			Conds: []store.Cond{{Kind: store.CondAbsent, Key: k}, {Kind: store.CondAbsent, Key: vniKey(v.VNI)}, {Kind: store.CondPresent, Key: projectKey(pid)}},
			Ops:   []store.Op{{Kind: store.OpPut, Key: k, Value: mustJSON(v)}, {Kind: store.OpPut, Key: vniKey(v.VNI), Value: []byte(k)}},
		})
		switch {
		case err == nil:
			v.RevisionNumber = rev
			return writeJSON(w, http.StatusCreated, capi.VPCBody{VPC: v})
		case txnFailedOn(err, k):
			return kerrors.New(kerrors.Conflict, "vpc %q already exists", v.ID)
		case txnFailedOn(err, projectKey(pid)):
			return kerrors.New(kerrors.NotFound, "project %q not found", pid)
		case txnFailedOn(err, vniKey(v.VNI)) && try < 16:
			continue
		default:
			return err
		}
	}
}

// projectChild is an object of kind T read from the store for a request
// naming it as project/<pid>/<kind>s/<id>.
type projectChild[T any] struct {
	pid, id, key string
	v            T
	rev          int64
}

// loadChild checks the URL's project and id and reads the object whose
// store key keyOf gives.
func loadChild[T any](s *Server, r *http.Request, kind string, keyOf func(pid, id string) string) (projectChild[T], error) {
	c := projectChild[T]{pid: r.PathValue("pid"), id: r.PathValue("id")}
	if err := s.requireProject(r.Context(), c.pid); err != nil {
		return c, err
	}
	if err := validID(kind, c.id); err != nil {
		return c, err
	}
	c.key = keyOf(c.pid, c.id)
	var err error
	c.rev, err = s.getJSON(r.Context(), c.key, kind, c.id, &c.v)
	return c, err
}

func (s *Server) getVPC(w http.ResponseWriter, r *http.Request) error {
	c, err := loadChild[capi.VPC](s, r, "vpc", vpcKey)
	if err != nil {
		return err
	}
	v, rev := c.v, c.rev
	v.RevisionNumber = rev
	return writeJSON(w, http.StatusOK, capi.VPCBody{VPC: v})
}

func (s *Server) listVPCs(w http.ResponseWriter, r *http.Request) error {
	pid := r.PathValue("pid")
	if err := s.requireProject(r.Context(), pid); err != nil {
		return err
	}
	out := []capi.VPC{}
	_, err := s.st.ForEach(r.Context(), "vpcs/"+pid+"/", func(kv store.KV) error {
		var v capi.VPC
		if err := json.Unmarshal(kv.Value, &v); err != nil {
			return err
		}
		v.RevisionNumber = kv.ModRev
		out = append(out, v)
		return nil
	})
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, capi.VPCsBody{VPCs: out})
}

func (s *Server) deleteVPC(w http.ResponseWriter, r *http.Request) error {
	c, err := loadChild[capi.VPC](s, r, "vpc", vpcKey)
	if err != nil {
		return err
	}
	pid, id, k, v, rev := c.pid, c.id, c.key, c.v, c.rev
	subs, err := s.subnetsOf(r.Context(), pid, id)
	if err != nil {
		return err
	}
	if len(subs) > 0 {
		return kerrors.New(kerrors.Conflict, "vpc %q still has %d subnet(s)", id, len(subs))
	}
	_, err = s.st.Txn(r.Context(), store.Txn{
		Conds: []store.Cond{{Kind: store.CondModRev, Key: k, Rev: rev}},
		Ops:   []store.Op{{Kind: store.OpDelete, Key: k}, {Kind: store.OpDelete, Key: vniKey(v.VNI)}},
	})
	if txnFailedOn(err, k) {
		return kerrors.New(kerrors.Conflict, "vpc %q changed concurrently; retry", id)
	}
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, struct{}{})
}

// subnetsOf lists the subnets of project pid in VPC vpc ("" : all).
func (s *Server) subnetsOf(ctx context.Context, pid, vpc string) ([]capi.Subnet, error) {
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

func (s *Server) createSubnet(w http.ResponseWriter, r *http.Request) error {
	sn, pid, err := decodeChild[capi.Subnet](s, r, "subnet", func(x *capi.Subnet) childFields {
		return childFields{&x.ID, x.ProjectID, x.Name}
	})
	if err != nil {
		return err
	}
	if sn.NetworkID == "" {
		return kerrors.New(kerrors.Invalid, "subnet network_id (the VPC) is required")
	}
	if err := validID("vpc", sn.NetworkID); err != nil {
		return err
	}
	var pools []ipam.Pool
	for _, p := range sn.AllocationPools {
		pools = append(pools, ipam.Pool{Start: p.Start, End: p.End})
	}
	sub, err := ipam.New(sn.CIDR, sn.IPVersion, sn.GatewayIP, pools)
	if err != nil {
		return err
	}
	for _, d := range sn.DNSNameservers {
		if _, err := netip.ParseAddr(d); err != nil {
			return kerrors.New(kerrors.Invalid, "dns_nameservers: %q is not an address", d)
		}
	}
	var vpc capi.VPC
	if _, err := s.getJSON(r.Context(), vpcKey(pid, sn.NetworkID), "vpc", sn.NetworkID, &vpc); err != nil {
		return err
	}
	if vpc.CIDR != "" {
		vp := netip.MustParsePrefix(vpc.CIDR)
		if !vp.Contains(sub.Prefix().Addr()) || vp.Bits() > sub.Prefix().Bits() {
			return kerrors.New(kerrors.Invalid, "subnet %s is not inside vpc cidr %s", sub.Prefix(), vp)
		}
	}
	others, err := s.subnetsOf(r.Context(), pid, sn.NetworkID)
	if err != nil {
		return err
	}
	for _, o := range others {
		if op, err := netip.ParsePrefix(o.CIDR); err == nil && op.Overlaps(sub.Prefix()) {
			return kerrors.New(kerrors.Conflict, "subnet %s overlaps subnet %s (%s) in vpc %s", sub.Prefix(), o.ID, op, sn.NetworkID)
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
	rev, err := s.st.Txn(r.Context(), store.Txn{
		Conds: []store.Cond{{Kind: store.CondAbsent, Key: k}, {Kind: store.CondPresent, Key: vpcKey(pid, sn.NetworkID)}},
		Ops:   []store.Op{{Kind: store.OpPut, Key: k, Value: mustJSON(storedSubnet{Subnet: sn})}},
	})
	switch {
	case txnFailedOn(err, k):
		return kerrors.New(kerrors.Conflict, "subnet %q already exists", sn.ID)
	case txnFailedOn(err, vpcKey(pid, sn.NetworkID)):
		return kerrors.New(kerrors.NotFound, "vpc %q not found", sn.NetworkID)
	case err != nil:
		return err
	}
	sn.RevisionNumber = rev
	return writeJSON(w, http.StatusCreated, capi.SubnetBody{Subnet: sn})
}

func (s *Server) getSubnet(w http.ResponseWriter, r *http.Request) error {
	c, err := loadChild[storedSubnet](s, r, "subnet", subnetKey)
	if err != nil {
		return err
	}
	sn, rev := c.v, c.rev
	sn.RevisionNumber = rev
	return writeJSON(w, http.StatusOK, capi.SubnetBody{Subnet: sn.Subnet})
}

func (s *Server) listSubnets(w http.ResponseWriter, r *http.Request) error {
	pid := r.PathValue("pid")
	if err := s.requireProject(r.Context(), pid); err != nil {
		return err
	}
	out, err := s.subnetsOf(r.Context(), pid, r.URL.Query().Get("network_id"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, capi.SubnetsBody{Subnets: out})
}

func (s *Server) deleteSubnet(w http.ResponseWriter, r *http.Request) error {
	c, err := loadChild[storedSubnet](s, r, "subnet", subnetKey)
	if err != nil {
		return err
	}
	ctx := r.Context()
	pid, id, k, sn, rev := c.pid, c.id, c.key, c.v, c.rev
	// Step 1: mark deleting (bumps the revision port creations depend on).
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
	return writeJSON(w, http.StatusOK, struct{}{})
}

// subnet returns the cached entry for subnet pid/sid, loading it (and its
// VPC) when needed. NotFound when it does not exist or is being deleted.
func (s *Server) subnet(ctx context.Context, pid, sid string) (*subnetEntry, int64, error) {
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
	var pools []ipam.Pool
	for _, p := range sn.AllocationPools {
		pools = append(pools, ipam.Pool{Start: p.Start, End: p.End})
	}
	sub, err := ipam.New(sn.CIDR, sn.IPVersion, sn.GatewayIP, pools)
	if err != nil {
		return nil, 0, fmt.Errorf("stored subnet %s: %w", sid, err)
	}
	sn.RevisionNumber = rev
	e = &subnetEntry{wire: sn.Subnet, vpc: vpc, sub: sub, tracker: ipam.NewTracker(sub)}
	s.mu.Lock()
	if cur := s.subnets[k]; cur != nil {
		e = cur
	} else {
		s.subnets[k] = e
	}
	s.mu.Unlock()
	return e, e.wire.RevisionNumber, nil
}

func (s *Server) dropSubnet(k string) {
	s.mu.Lock()
	delete(s.subnets, k)
	s.mu.Unlock()
}

// loadTracker (re)reads the subnet's bitmap blocks into its tracker.
func (s *Server) loadTracker(ctx context.Context, e *subnetEntry, force bool) error {
	e.loadMu.Lock()
	defer e.loadMu.Unlock()
	if e.loaded && !force {
		return nil
	}
	pid, sid := e.wire.ProjectID, e.wire.ID
	seen := map[int]bool{}
	_, err := s.st.ForEach(ctx, ipamPrefix(pid, sid), func(kv store.KV) error {
		var blk int
		if _, err := fmt.Sscanf(kv.Key[len(ipamPrefix(pid, sid)):], "%d", &blk); err != nil {
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
func (s *Server) resolveNetwork(ctx context.Context, pid string, p *capi.Port) (*subnetEntry, int64, error) {
	var want string
	if len(p.FixedIPs) > 0 {
		want = p.FixedIPs[0].SubnetID
	}
	e, rev, err := s.subnet(ctx, pid, p.NetworkID)
	if err == nil {
		if want != "" && want != e.wire.ID {
			return nil, 0, kerrors.New(kerrors.Invalid, "port %s: fixed_ips subnet %q differs from network_id subnet %q", p.ID, want, e.wire.ID)
		}
		return e, rev, nil
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
	return e, rev, nil
}
