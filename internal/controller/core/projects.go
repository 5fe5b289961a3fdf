package core

import (
	"context"
	"encoding/json"
	"errors"

	"kurma.dev/kurma/internal/controller/store"
	capi "kurma.dev/kurma/pkg/controllerapi"
	"kurma.dev/kurma/pkg/kerrors"
)

// CreateProject creates project p (id: the caller's or a new one).
func (s *Core) CreateProject(ctx context.Context, p capi.Project) (capi.Project, error) {
	var err error
	if p.ID, err = idOrNew("project", p.ID); err != nil {
		return p, err
	}
	if err := checkLen("name", p.Name, 255); err != nil {
		return p, err
	}
	p.CreatedAt = now()
	p.UpdatedAt = p.CreatedAt
	p.RevisionNumber = 0
	k := projectKey(p.ID)
	rev, err := s.st.Txn(ctx, store.Txn{Conds: []store.Cond{{Kind: store.CondAbsent, Key: k}}, Ops: []store.Op{{Kind: store.OpPut, Key: k, Value: mustJSON(p)}}})
	if err != nil {
		if txnFailedOn(err, k) {
			return p, kerrors.New(kerrors.Conflict, "project %q already exists", p.ID)
		}
		return p, err
	}
	p.RevisionNumber = rev
	return p, nil
}

// GetProject reads project id.
func (s *Core) GetProject(ctx context.Context, id string) (capi.Project, error) {
	var p capi.Project
	if err := ValidID("project", id); err != nil {
		return p, err
	}
	rev, err := s.getJSON(ctx, projectKey(id), "project", id, &p)
	p.RevisionNumber = rev
	return p, err
}

// ListProjects lists every project.
func (s *Core) ListProjects(ctx context.Context) ([]capi.Project, error) {
	out := []capi.Project{}
	_, err := s.st.ForEach(ctx, "projects/", func(kv store.KV) error {
		var p capi.Project
		if err := json.Unmarshal(kv.Value, &p); err != nil {
			return err
		}
		p.RevisionNumber = kv.ModRev
		out = append(out, p)
		return nil
	})
	return out, err
}

// DeleteProject deletes a project that has no VPC left.
func (s *Core) DeleteProject(ctx context.Context, id string) error {
	if err := ValidID("project", id); err != nil {
		return err
	}
	k := projectKey(id)
	kv, err := s.st.Get(ctx, k)
	if err != nil {
		if errors.Is(err, kerrors.NotFound) {
			return kerrors.New(kerrors.NotFound, "project %q not found", id)
		}
		return err
	}
	vpcs, _, err := s.st.List(ctx, "vpcs/"+id+"/")
	if err != nil {
		return err
	}
	if len(vpcs) > 0 {
		return kerrors.New(kerrors.Conflict, "project %q still has %d VPC(s)", id, len(vpcs))
	}
	fips, _, err := s.st.List(ctx, "svc/fip/"+id+"/")
	if err != nil {
		return err
	}
	if len(fips) > 0 {
		return kerrors.New(kerrors.Conflict, "project %q still has %d floating IP(s)", id, len(fips))
	}
	if _, err := s.st.Txn(ctx, store.Txn{Conds: []store.Cond{{Kind: store.CondModRev, Key: k, Rev: kv.ModRev}}, Ops: []store.Op{{Kind: store.OpDelete, Key: k}}}); err != nil {
		if txnFailedOn(err, k) {
			return kerrors.New(kerrors.Conflict, "project %q changed concurrently; retry", id)
		}
		return err
	}
	s.mu.Lock()
	delete(s.projects, id)
	s.mu.Unlock()
	return nil
}
