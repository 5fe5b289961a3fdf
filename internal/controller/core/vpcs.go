package core

import (
	"context"
	"encoding/json"
	"net/netip"

	"kurma.dev/kurma/internal/controller/ipam"
	"kurma.dev/kurma/internal/controller/store"
	capi "kurma.dev/kurma/pkg/controllerapi"
	"kurma.dev/kurma/pkg/kerrors"
)

// checkChild validates the caller-set fields every child of project pid
// has (VPC, subnet, load balancer, floating IP): the project exists, the
// id is the caller's (checked) or a new one, a given project_id matches,
// the name fits.
func (s *Core) checkChild(ctx context.Context, pid, kind string, id *string, projectID, name string) error {
	if err := s.requireProject(ctx, pid); err != nil {
		return err
	}
	var err error
	if *id, err = idOrNew(kind, *id); err != nil {
		return err
	}
	if projectID != "" && projectID != pid {
		return kerrors.New(kerrors.Invalid, "project_id %q does not match the URL's project %q", projectID, pid)
	}
	return checkLen("name", name, 255)
}

// CreateVPC creates VPC v in project pid with a new unique VNI.
func (s *Core) CreateVPC(ctx context.Context, pid string, v capi.VPC) (capi.VPC, error) {
	if err := s.checkChild(ctx, pid, "vpc", &v.ID, v.ProjectID, v.Name); err != nil {
		return v, err
	}
	if v.CIDR != "" {
		p, err := netip.ParsePrefix(v.CIDR)
		if err != nil || p.Masked() != p {
			return v, kerrors.New(kerrors.Invalid, "vpc cidr %q is not a network prefix", v.CIDR)
		}
	}
	v.ProjectID = pid
	v.CreatedAt = now()
	v.UpdatedAt = v.CreatedAt
	v.RevisionNumber = 0
	k := vpcKey(pid, v.ID)
	for try := 0; ; try++ {
		v.VNI = ipam.RandomVNI()
		rev, err := s.st.Txn(ctx, store.Txn{
			Conds: []store.Cond{{Kind: store.CondAbsent, Key: k}, {Kind: store.CondAbsent, Key: vniKey(v.VNI)}, {Kind: store.CondPresent, Key: projectKey(pid)}},
			Ops:   []store.Op{{Kind: store.OpPut, Key: k, Value: mustJSON(v)}, {Kind: store.OpPut, Key: vniKey(v.VNI), Value: []byte(k)}},
		})
		switch {
		case err == nil:
			v.RevisionNumber = rev
			return v, nil
		case txnFailedOn(err, k):
			return v, kerrors.New(kerrors.Conflict, "vpc %q already exists", v.ID)
		case txnFailedOn(err, projectKey(pid)):
			return v, kerrors.New(kerrors.NotFound, "project %q not found", pid)
		case txnFailedOn(err, vniKey(v.VNI)) && try < 16:
			continue
		default:
			return v, err
		}
	}
}

// projectChild is an object of kind T read from the store, named as
// project/<pid>/<kind>s/<id>.
type projectChild[T any] struct {
	pid, id, key string
	v            T
	rev          int64
}

// loadChild checks the project and id and reads the object whose store
// key keyOf gives.
func loadChild[T any](ctx context.Context, s *Core, pid, id, kind string, keyOf func(pid, id string) string) (projectChild[T], error) {
	c := projectChild[T]{pid: pid, id: id}
	if err := s.requireProject(ctx, c.pid); err != nil {
		return c, err
	}
	if err := ValidID(kind, c.id); err != nil {
		return c, err
	}
	c.key = keyOf(c.pid, c.id)
	var err error
	c.rev, err = s.getJSON(ctx, c.key, kind, c.id, &c.v)
	return c, err
}

// GetVPC reads VPC id of project pid.
func (s *Core) GetVPC(ctx context.Context, pid, id string) (capi.VPC, error) {
	c, err := loadChild[capi.VPC](ctx, s, pid, id, "vpc", vpcKey)
	c.v.RevisionNumber = c.rev
	return c.v, err
}

// ListVPCs lists the VPCs of project pid.
func (s *Core) ListVPCs(ctx context.Context, pid string) ([]capi.VPC, error) {
	if err := s.requireProject(ctx, pid); err != nil {
		return nil, err
	}
	out := []capi.VPC{}
	_, err := s.st.ForEach(ctx, "vpcs/"+pid+"/", func(kv store.KV) error {
		var v capi.VPC
		if err := json.Unmarshal(kv.Value, &v); err != nil {
			return err
		}
		v.RevisionNumber = kv.ModRev
		out = append(out, v)
		return nil
	})
	return out, err
}

// DeleteVPC deletes a VPC that has no subnet left.
func (s *Core) DeleteVPC(ctx context.Context, pid, id string) error {
	c, err := loadChild[capi.VPC](ctx, s, pid, id, "vpc", vpcKey)
	if err != nil {
		return err
	}
	k, v, rev := c.key, c.v, c.rev
	subs, err := s.subnetsOf(ctx, pid, id)
	if err != nil {
		return err
	}
	if len(subs) > 0 {
		return kerrors.New(kerrors.Conflict, "vpc %q still has %d subnet(s)", id, len(subs))
	}
	_, err = s.st.Txn(ctx, store.Txn{
		Conds: []store.Cond{{Kind: store.CondModRev, Key: k, Rev: rev}},
		Ops:   []store.Op{{Kind: store.OpDelete, Key: k}, {Kind: store.OpDelete, Key: vniKey(v.VNI)}},
	})
	if txnFailedOn(err, k) {
		return kerrors.New(kerrors.Conflict, "vpc %q changed concurrently; retry", id)
	}
	return err
}
