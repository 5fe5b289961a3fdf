package api

import (
	"encoding/json"
	"net/http"
	"net/netip"

	"kurma.dev/kurma/internal/controller/store"
	capi "kurma.dev/kurma/pkg/controllerapi"
	"kurma.dev/kurma/pkg/kerrors"
)

// DecodeHost parses a PUT hosts/<id> body for host id.
func DecodeHost(id string, b []byte) (capi.Host, error) {
	h, err := decodeWrapped[capi.Host](b, "host")
	if err != nil {
		return capi.Host{}, err
	}
	if h.ID == "" {
		h.ID = id
	}
	if h.ID != id {
		return h, kerrors.New(kerrors.Invalid, "host id %q does not match the URL's %q", h.ID, id)
	}
	a, err := netip.ParseAddr(h.UnderlayIP)
	if err != nil {
		return h, kerrors.New(kerrors.Invalid, "underlay_ip %q: %v", h.UnderlayIP, err)
	}
	h.UnderlayIP = a.String()
	return h, nil
}

func (s *Server) putHost(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	if err := validID("host", id); err != nil {
		return err
	}
	b, err := readBody(r)
	if err != nil {
		return err
	}
	h, err := DecodeHost(id, b)
	if err != nil {
		return err
	}
	k := hostKey(id)
	for try := 0; try < 16; try++ {
		var cur capi.Host
		rev, err := s.getJSON(r.Context(), k, "host", id, &cur)
		cond := store.Cond{Kind: store.CondModRev, Key: k, Rev: rev}
		h.UpdatedAt = now()
		if err != nil {
			if kerrors.Type(err) != "NotFound" {
				return err
			}
			cond = store.Cond{Kind: store.CondAbsent, Key: k}
			h.CreatedAt = h.UpdatedAt
		} else {
			h.CreatedAt = cur.CreatedAt
		}
		h.RevisionNumber = 0
		nrev, err := s.st.Txn(r.Context(), store.Txn{Conds: []store.Cond{cond}, Ops: []store.Op{{Kind: store.OpPut, Key: k, Value: mustJSON(h)}}})
		if txnFailedOn(err, k) {
			continue
		}
		if err != nil {
			return err
		}
		h.RevisionNumber = nrev
		return writeJSON(w, http.StatusOK, capi.HostBody{Host: h})
	}
	return kerrors.New(kerrors.Unavailable, "host %s: too many concurrent changes", id)
}

func (s *Server) getHost(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	if err := validID("host", id); err != nil {
		return err
	}
	var h capi.Host
	rev, err := s.getJSON(r.Context(), hostKey(id), "host", id, &h)
	if err != nil {
		return err
	}
	h.RevisionNumber = rev
	return writeJSON(w, http.StatusOK, capi.HostBody{Host: h})
}

func (s *Server) listHosts(w http.ResponseWriter, r *http.Request) error {
	out := []capi.Host{}
	_, err := s.st.ForEach(r.Context(), "hosts/", func(kv store.KV) error {
		var h capi.Host
		if err := json.Unmarshal(kv.Value, &h); err != nil {
			return err
		}
		h.RevisionNumber = kv.ModRev
		out = append(out, h)
		return nil
	})
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, capi.HostsBody{Hosts: out})
}

func (s *Server) deleteHost(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	if err := validID("host", id); err != nil {
		return err
	}
	k := hostKey(id)
	if _, err := s.st.Txn(r.Context(), store.Txn{Conds: []store.Cond{{Kind: store.CondPresent, Key: k}}, Ops: []store.Op{{Kind: store.OpDelete, Key: k}}}); err != nil {
		if txnFailedOn(err, k) {
			return kerrors.New(kerrors.NotFound, "host %q not found", id)
		}
		return err
	}
	return writeJSON(w, http.StatusOK, struct{}{})
}
