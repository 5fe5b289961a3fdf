package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"kurma.dev/kurma/internal/controller/ipam"
	"kurma.dev/kurma/internal/controller/store"
	capi "kurma.dev/kurma/pkg/controllerapi"
	"kurma.dev/kurma/pkg/kerrors"
)

func decodePort(kv store.KV) (capi.Port, error) {
	var p capi.Port
	if err := json.Unmarshal(kv.Value, &p); err != nil {
		return p, fmt.Errorf("decode stored port %s: %w", kv.Key, err)
	}
	p.RevisionNumber = kv.ModRev
	return p, nil
}

func (s *Server) readPort(ctx context.Context, pid, id string) (capi.Port, error) {
	kv, err := s.st.Get(ctx, portKey(pid, id))
	if err != nil {
		if errors.Is(err, kerrors.NotFound) {
			return capi.Port{}, kerrors.New(kerrors.NotFound, "port %q not found in project %q", id, pid)
		}
		return capi.Port{}, err
	}
	return decodePort(kv)
}

// parseWait reads wait_status and timeout; zero duration means no wait.
func (s *Server) parseWait(r *http.Request) (string, time.Duration, error) {
	q := r.URL.Query()
	ws, ts := q.Get("wait_status"), q.Get("timeout")
	if ws == "" && ts == "" {
		return "", 0, nil
	}
	switch ws {
	case "", capi.StatusUp, capi.StatusDown, capi.StatusError:
	default:
		return "", 0, kerrors.New(kerrors.Invalid, "wait_status %q: want UP, DOWN or ERROR", ws)
	}
	d := 60 * time.Second
	if ts != "" {
		var err error
		if d, err = time.ParseDuration(ts); err != nil {
			n, nerr := strconv.Atoi(ts)
			if nerr != nil {
				return "", 0, kerrors.New(kerrors.Invalid, "timeout %q: want a duration such as 60s", ts)
			}
			d = time.Duration(n) * time.Second
		}
		if d < 0 {
			return "", 0, kerrors.New(kerrors.Invalid, "timeout %q is negative", ts)
		}
	}
	return ws, min(d, s.maxWait), nil
}

func (s *Server) getPort(w http.ResponseWriter, r *http.Request) error {
	pid, id := r.PathValue("pid"), r.PathValue("id")
	if err := s.requireProject(r.Context(), pid); err != nil {
		return err
	}
	if err := validID("port", id); err != nil {
		return err
	}
	ws, d, err := s.parseWait(r)
	if err != nil {
		return err
	}
	if d == 0 {
		p, err := s.readPort(r.Context(), pid, id)
		if err != nil {
			return err
		}
		return writeJSON(w, http.StatusOK, capi.PortBody{Port: p})
	}
	p, err := s.WaitPort(r.Context(), pid, id, ws, d)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, capi.PortBody{Port: p})
}

// WaitPort returns the port once its status is not PENDING (or equals
// want), or as it is when d passes.
func (s *Server) WaitPort(ctx context.Context, pid, id, want string, d time.Duration) (capi.Port, error) {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	k := portKey(pid, id)
	wake := s.waiters.add(k)
	defer s.waiters.remove(k, wake)
	for {
		p, err := s.readPort(context.WithoutCancel(ctx), pid, id)
		if err != nil {
			return p, err
		}
		if p.Status != capi.StatusPending || (want != "" && p.Status == want) {
			return p, nil
		}
		select {
		case <-wake:
		case <-ctx.Done():
			return p, nil
		}
	}
}

func (s *Server) listPorts(w http.ResponseWriter, r *http.Request) error {
	pid := r.PathValue("pid")
	ctx := r.Context()
	if err := s.requireProject(ctx, pid); err != nil {
		return err
	}
	q := r.URL.Query()
	f := capi.PortFilter{HostID: q.Get("binding:host_id"), DeviceID: q.Get("device_id"), Name: q.Get("name"), NetworkID: q.Get("network_id")}
	match := func(p *capi.Port) bool {
		if f.HostID != "" && p.BindingHostID != f.HostID || f.DeviceID != "" && p.DeviceID != f.DeviceID || f.Name != "" && p.Name != f.Name {
			return false
		}
		if f.NetworkID != "" && p.NetworkID != f.NetworkID && p.VPCID != f.NetworkID && (len(p.FixedIPs) == 0 || p.FixedIPs[0].SubnetID != f.NetworkID) {
			return false
		}
		return true
	}
	out := []capi.Port{}
	var idx string
	switch {
	case f.HostID != "" && !strings.Contains(f.HostID, "/"):
		idx = "idx/host/" + f.HostID + "/" + pid + "/"
	case f.DeviceID != "" && !strings.Contains(f.DeviceID, "/"):
		idx = "idx/dev/" + pid + "/" + f.DeviceID + "/"
	case f.Name != "" && !strings.Contains(f.Name, "/"):
		idx = "idx/name/" + pid + "/" + f.Name + "/"
	}
	if idx != "" {
		var ids []string
		if _, err := s.st.ForEach(ctx, idx, func(kv store.KV) error {
			ids = append(ids, kv.Key[len(idx):])
			return nil
		}); err != nil {
			return err
		}
		for _, id := range ids {
			p, err := s.readPort(ctx, pid, id)
			if errors.Is(err, kerrors.NotFound) {
				continue // deleted meanwhile
			}
			if err != nil {
				return err
			}
			if match(&p) {
				out = append(out, p)
			}
		}
		return writeJSON(w, http.StatusOK, capi.PortsBody{Ports: out})
	}
	_, err := s.st.ForEach(ctx, "ports/"+pid+"/", func(kv store.KV) error {
		p, err := decodePort(kv)
		if err != nil {
			return err
		}
		if match(&p) {
			out = append(out, p)
		}
		return nil
	})
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, capi.PortsBody{Ports: out})
}

func (s *Server) deletePort(w http.ResponseWriter, r *http.Request) error {
	pid, id := r.PathValue("pid"), r.PathValue("id")
	if err := s.requireProject(r.Context(), pid); err != nil {
		return err
	}
	if err := validID("port", id); err != nil {
		return err
	}
	if err := s.DeletePort(r.Context(), pid, id); err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, struct{}{})
}

// DeletePort deletes a port and releases its address and MAC.
func (s *Server) DeletePort(ctx context.Context, pid, id string) error {
	k := portKey(pid, id)
	for try := 0; try < 8; try++ {
		p, err := s.readPort(ctx, pid, id)
		if err != nil {
			return err
		}
		txn := store.Txn{
			Conds: []store.Cond{{Kind: store.CondModRev, Key: k, Rev: p.RevisionNumber}},
			Ops:   []store.Op{{Kind: store.OpDelete, Key: k}, {Kind: store.OpDelete, Key: macKey(p.MACAddress)}},
		}
		type rel struct {
			tr  *ipam.Tracker // nil when the subnet is not cached
			off int64
		}
		var rels []rel
		for _, f := range p.FixedIPs {
			sub, tr, err := s.subnetForRelease(ctx, pid, f.SubnetID)
			if err != nil {
				return fmt.Errorf("port %s: subnet of %s: %w", id, f.IPAddress, err)
			}
			off, err := sub.Request(f.IPAddress)
			if err != nil {
				return fmt.Errorf("port %s: stored address: %w", id, err)
			}
			blk, bit := ipam.Block(off)
			txn.Ops = append(txn.Ops, store.Op{Kind: store.OpClearBit, Key: blockKey(pid, f.SubnetID, blk), Bit: bit})
			rels = append(rels, rel{tr, off})
		}
		if p.VPCID != "" {
			txn.Ops = append(txn.Ops, store.Op{Kind: store.OpDelete, Key: vpcIdxKey(pid, p.VPCID, id)})
		}
		if p.BindingHostID != "" {
			txn.Ops = append(txn.Ops, store.Op{Kind: store.OpDelete, Key: hostIdxKey(p.BindingHostID, pid, id)})
		}
		if p.DeviceID != "" {
			txn.Ops = append(txn.Ops, store.Op{Kind: store.OpDelete, Key: devIdxKey(pid, p.DeviceID, id)})
		}
		if p.Name != "" {
			txn.Ops = append(txn.Ops, store.Op{Kind: store.OpDelete, Key: nameIdxKey(pid, p.Name, id)})
		}
		_, err = s.st.Txn(ctx, txn)
		if txnFailedOn(err, k) {
			continue // changed (status update) or deleted meanwhile: re-read
		}
		if err != nil {
			return fmt.Errorf("delete port %s: %w", id, err)
		}
		for _, r := range rels {
			if r.tr != nil {
				r.tr.Release(r.off)
			}
		}
		return nil
	}
	return kerrors.New(kerrors.Unavailable, "delete port %s: too many concurrent changes", id)
}

func (s *Server) setPortStatus(w http.ResponseWriter, r *http.Request) error {
	pid, id := r.PathValue("pid"), r.PathValue("id")
	if err := s.requireProject(r.Context(), pid); err != nil {
		return err
	}
	if err := validID("port", id); err != nil {
		return err
	}
	b, err := readBody(r)
	if err != nil {
		return err
	}
	u, err := DecodeStatus(b)
	if err != nil {
		return err
	}
	p, err := s.SetPortStatus(r.Context(), pid, id, u)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, capi.PortBody{Port: p})
}

// DecodeStatus parses a PUT .../status body.
func DecodeStatus(b []byte) (capi.PortStatusUpdate, error) {
	var u capi.PortStatusUpdate
	if err := decodeStrict(b, &u); err != nil {
		return u, err
	}
	switch u.Status {
	case capi.StatusUp, capi.StatusDown, capi.StatusError, capi.StatusPending:
	default:
		return u, kerrors.New(kerrors.Invalid, "status %q: want UP, DOWN, ERROR or PENDING", u.Status)
	}
	if len(u.StatusReason) > 1024 {
		return u, kerrors.New(kerrors.Invalid, "status_reason longer than 1024 bytes")
	}
	return u, nil
}

// SetPortStatus records the agent's report (compare-and-swap, retried).
func (s *Server) SetPortStatus(ctx context.Context, pid, id string, u capi.PortStatusUpdate) (capi.Port, error) {
	k := portKey(pid, id)
	for try := 0; try < 16; try++ {
		p, err := s.readPort(ctx, pid, id)
		if err != nil {
			return p, err
		}
		if p.Status == u.Status && p.StatusReason == u.StatusReason {
			return p, nil
		}
		old := p.RevisionNumber
		p.Status, p.StatusReason = u.Status, u.StatusReason
		p.UpdatedAt = now()
		p.RevisionNumber = 0
		rev, err := s.st.Txn(ctx, store.Txn{Conds: []store.Cond{{Kind: store.CondModRev, Key: k, Rev: old}}, Ops: []store.Op{{Kind: store.OpPut, Key: k, Value: mustJSON(p)}}})
		if txnFailedOn(err, k) {
			continue
		}
		if err != nil {
			return p, err
		}
		p.RevisionNumber = rev
		return p, nil
	}
	return capi.Port{}, kerrors.New(kerrors.Unavailable, "port %s: too many concurrent changes", id)
}

// subnetForRelease returns the parsed subnet (and its tracker when cached)
// even while the subnet is marked for deletion, so ports can always be
// deleted.
func (s *Server) subnetForRelease(ctx context.Context, pid, sid string) (*ipam.Subnet, *ipam.Tracker, error) {
	s.mu.Lock()
	e := s.subnets[subnetKey(pid, sid)]
	s.mu.Unlock()
	if e != nil {
		return e.sub, e.tracker, nil
	}
	var sn storedSubnet
	if _, err := s.getJSON(ctx, subnetKey(pid, sid), "subnet", sid, &sn); err != nil {
		return nil, nil, err
	}
	var pools []ipam.Pool
	for _, p := range sn.AllocationPools {
		pools = append(pools, ipam.Pool{Start: p.Start, End: p.End})
	}
	sub, err := ipam.New(sn.CIDR, sn.IPVersion, sn.GatewayIP, pools)
	if err != nil {
		return nil, nil, fmt.Errorf("stored subnet %s: %w", sid, err)
	}
	return sub, nil, nil
}
