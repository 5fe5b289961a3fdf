package api

import (
	"encoding/json"
	"errors"
	"net/http"

	"kurma.dev/kurma/internal/controller/store"
	capi "kurma.dev/kurma/pkg/controllerapi"
	"kurma.dev/kurma/pkg/kerrors"
)

func (s *Server) createProject(w http.ResponseWriter, r *http.Request) error {
	b, err := readBody(r)
	if err != nil {
		return err
	}
	p, err := decodeWrapped[capi.Project](b, "project")
	if err != nil {
		return err
	}
	if p.ID, err = idOrNew("project", p.ID); err != nil {
		return err
	}
	if err := checkLen("name", p.Name, 255); err != nil {
		return err
	}
	p.CreatedAt = now()
	p.UpdatedAt = p.CreatedAt
	p.RevisionNumber = 0
	k := projectKey(p.ID)
	rev, err := s.st.Txn(r.Context(), store.Txn{Conds: []store.Cond{{Kind: store.CondAbsent, Key: k}}, Ops: []store.Op{{Kind: store.OpPut, Key: k, Value: mustJSON(p)}}})
	if err != nil {
		if txnFailedOn(err, k) {
			return kerrors.New(kerrors.Conflict, "project %q already exists", p.ID)
		}
		return err
	}
	p.RevisionNumber = rev
	return writeJSON(w, http.StatusCreated, capi.ProjectBody{Project: p})
}

func (s *Server) getProject(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	if err := validID("project", id); err != nil {
		return err
	}
	var p capi.Project
	rev, err := s.getJSON(r.Context(), projectKey(id), "project", id, &p)
	if err != nil {
		return err
	}
	p.RevisionNumber = rev
	return writeJSON(w, http.StatusOK, capi.ProjectBody{Project: p})
}

func (s *Server) listProjects(w http.ResponseWriter, r *http.Request) error {
	out := []capi.Project{}
	_, err := s.st.ForEach(r.Context(), "projects/", func(kv store.KV) error {
		var p capi.Project
		if err := json.Unmarshal(kv.Value, &p); err != nil {
			return err
		}
		p.RevisionNumber = kv.ModRev
		out = append(out, p)
		return nil
	})
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, capi.ProjectsBody{Projects: out})
}

func (s *Server) deleteProject(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	if err := validID("project", id); err != nil {
		return err
	}
	k := projectKey(id)
	kv, err := s.st.Get(r.Context(), k)
	if err != nil {
		if errors.Is(err, kerrors.NotFound) {
			return kerrors.New(kerrors.NotFound, "project %q not found", id)
		}
		return err
	}
	vpcs, _, err := s.st.List(r.Context(), "vpcs/"+id+"/")
	if err != nil {
		return err
	}
	if len(vpcs) > 0 {
		return kerrors.New(kerrors.Conflict, "project %q still has %d VPC(s)", id, len(vpcs))
	}
	if _, err := s.st.Txn(r.Context(), store.Txn{Conds: []store.Cond{{Kind: store.CondModRev, Key: k, Rev: kv.ModRev}}, Ops: []store.Op{{Kind: store.OpDelete, Key: k}}}); err != nil {
		if txnFailedOn(err, k) {
			return kerrors.New(kerrors.Conflict, "project %q changed concurrently; retry", id)
		}
		return err
	}
	s.mu.Lock()
	delete(s.projects, id)
	s.mu.Unlock()
	return writeJSON(w, http.StatusOK, struct{}{})
}
