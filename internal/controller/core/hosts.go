package core

import (
	"context"
	"encoding/json"
	"net/netip"

	"kurma.dev/kurma/internal/controller/store"
	capi "kurma.dev/kurma/pkg/controllerapi"
	"kurma.dev/kurma/pkg/kerrors"
)

// PutHost registers or refreshes host h.
func (s *Core) PutHost(ctx context.Context, h capi.Host) (capi.Host, error) {
	id := h.ID
	if err := ValidID("host", id); err != nil {
		return h, err
	}
	a, err := netip.ParseAddr(h.UnderlayIP)
	if err != nil {
		return h, kerrors.New(kerrors.Invalid, "underlay_ip %q: %v", h.UnderlayIP, err)
	}
	h.UnderlayIP = a.String()
	k := hostKey(id)
	for try := 0; try < 16; try++ {
		var cur capi.Host
		rev, err := s.getJSON(ctx, k, "host", id, &cur)
		cond := store.Cond{Kind: store.CondModRev, Key: k, Rev: rev}
		h.UpdatedAt = now()
		if err != nil {
			if kerrors.Type(err) != "NotFound" {
				return h, err
			}
			cond = store.Cond{Kind: store.CondAbsent, Key: k}
			h.CreatedAt = h.UpdatedAt
		} else {
			h.CreatedAt = cur.CreatedAt
		}
		h.RevisionNumber = 0
		nrev, err := s.st.Txn(ctx, store.Txn{Conds: []store.Cond{cond}, Ops: []store.Op{{Kind: store.OpPut, Key: k, Value: mustJSON(h)}}})
		if txnFailedOn(err, k) {
			continue
		}
		if err != nil {
			return h, err
		}
		h.RevisionNumber = nrev
		return h, nil
	}
	return h, kerrors.New(kerrors.Unavailable, "host %s: too many concurrent changes", id)
}

// GetHost reads host id.
func (s *Core) GetHost(ctx context.Context, id string) (capi.Host, error) {
	var h capi.Host
	if err := ValidID("host", id); err != nil {
		return h, err
	}
	rev, err := s.getJSON(ctx, hostKey(id), "host", id, &h)
	h.RevisionNumber = rev
	return h, err
}

// ListHosts lists every host.
func (s *Core) ListHosts(ctx context.Context) ([]capi.Host, error) {
	out := []capi.Host{}
	_, err := s.st.ForEach(ctx, "hosts/", func(kv store.KV) error {
		var h capi.Host
		if err := json.Unmarshal(kv.Value, &h); err != nil {
			return err
		}
		h.RevisionNumber = kv.ModRev
		out = append(out, h)
		return nil
	})
	return out, err
}

// DeleteHost forgets host id.
func (s *Core) DeleteHost(ctx context.Context, id string) error {
	if err := ValidID("host", id); err != nil {
		return err
	}
	k := hostKey(id)
	if _, err := s.st.Txn(ctx, store.Txn{Conds: []store.Cond{{Kind: store.CondPresent, Key: k}}, Ops: []store.Op{{Kind: store.OpDelete, Key: k}}}); err != nil {
		if txnFailedOn(err, k) {
			return kerrors.New(kerrors.NotFound, "host %q not found", id)
		}
		return err
	}
	return nil
}
