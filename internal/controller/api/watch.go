package api

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"kurma.dev/kurma/internal/controller/store"
	capi "kurma.dev/kurma/pkg/controllerapi"
	"kurma.dev/kurma/pkg/kerrors"
)

// keepAlive is how often an idle watch stream gets an empty line.
const keepAlive = 15 * time.Second

// toEvent converts a store event under "ports/" or "hosts/".
func toEvent(ev store.Event, hosts bool) (capi.Event, error) {
	out := capi.Event{Revision: ev.Rev}
	raw := ev.Value
	switch {
	case ev.Type == store.EventDelete:
		out.Type, raw = capi.EventDeleted, ev.PrevValue
	case ev.PrevValue == nil:
		out.Type = capi.EventAdded
	default:
		out.Type = capi.EventModified
	}
	if hosts {
		var h capi.Host
		if err := json.Unmarshal(raw, &h); err != nil {
			return out, err
		}
		h.RevisionNumber = ev.Rev
		out.Host = &h
		return out, nil
	}
	var p capi.Port
	if err := json.Unmarshal(raw, &p); err != nil {
		return out, err
	}
	p.RevisionNumber = ev.Rev
	out.Port = &p
	return out, nil
}

func (s *Server) watchPorts(w http.ResponseWriter, r *http.Request) error {
	return s.watch(w, r, false)
}

func (s *Server) watchHosts(w http.ResponseWriter, r *http.Request) error {
	return s.watch(w, r, true)
}

// portFilter decides which port events a watch sends. With a host it
// keeps that host's ports; with peers as well, also every port of a VPC
// in which the host has a port (what an agent needs for its remote FDB
// and neighbour entries). It tracks the host's ports from the stream
// itself, so it sees a VPC appear on or leave the host at the event that
// does it.
type portFilter struct {
	host  string
	peers bool
	local map[string]string // port key -> VPC key (pid/vpc) of host's ports
	vpcs  map[string]int    // VPC key -> number of host's ports in it
}

func vpcOf(p *capi.Port) string { return p.ProjectID + "/" + p.VPCID }

// track updates the host's ports for an event. It returns the VPC key
// when the event brought the first host port into that VPC.
func (f *portFilter) track(e *capi.Event, key string) (joined string) {
	if !f.peers || e.Port == nil || e.Port.BindingHostID != f.host {
		return ""
	}
	if e.Type == capi.EventDeleted {
		if v, ok := f.local[key]; ok {
			delete(f.local, key)
			if f.vpcs[v]--; f.vpcs[v] <= 0 {
				delete(f.vpcs, v)
			}
		}
		return ""
	}
	if _, ok := f.local[key]; ok {
		return ""
	}
	v := vpcOf(e.Port)
	f.local[key] = v
	f.vpcs[v]++
	if f.vpcs[v] == 1 {
		return v
	}
	return ""
}

func (f *portFilter) keep(e *capi.Event) bool {
	switch {
	case f.host == "":
		return true
	case e.Port == nil:
		return false
	case e.Port.BindingHostID == f.host:
		return true
	default:
		return f.peers && f.vpcs[vpcOf(e.Port)] > 0
	}
}

func (s *Server) watch(w http.ResponseWriter, r *http.Request, hosts bool) error {
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	q := r.URL.Query()
	since := int64(0)
	if v := q.Get("since"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return kerrors.New(kerrors.Invalid, "since %q: want a revision number >= 0", v)
		}
		since = n
	}
	f := &portFilter{host: q.Get("binding:host_id"), local: map[string]string{}, vpcs: map[string]int{}}
	switch v := q.Get("vpc_peers"); v {
	case "", "false":
	case "true":
		f.peers = true
	default:
		return kerrors.New(kerrors.Invalid, "vpc_peers %q: want true or false", v)
	}
	if hosts && (f.host != "" || f.peers) {
		return kerrors.New(kerrors.Invalid, "binding:host_id and vpc_peers filter port watches only")
	}
	if strings.Contains(f.host, "/") {
		return kerrors.New(kerrors.Invalid, "binding:host_id %q contains '/'", f.host)
	}
	if f.peers && f.host == "" {
		return kerrors.New(kerrors.Invalid, "vpc_peers needs binding:host_id")
	}
	if f.peers && since > 0 {
		// The filter's state (which VPCs the host is in) is built from
		// the listing; it cannot be rebuilt for an old revision.
		return kerrors.New(kerrors.Invalid, "a vpc_peers watch cannot resume: watch with since=0 (it lists the host's ports and their VPCs first)")
	}
	prefix := "ports/"
	if hosts {
		prefix = "hosts/"
	}

	bw := bufio.NewWriterSize(w, 64<<10)
	enc := json.NewEncoder(bw)
	flush := func() {
		_ = bw.Flush()
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
	}
	started := false
	start := func() {
		if !started {
			started = true
			w.Header().Set("Content-Type", "application/x-ndjson")
			w.Header().Set("Cache-Control", "no-cache")
			w.WriteHeader(http.StatusOK)
		}
	}
	fail := func(err error) {
		typ := kerrors.Type(err)
		if errors.Is(err, store.ErrCompacted) {
			typ = "Gone"
		}
		_ = enc.Encode(map[string]any{"type": "ERROR", "error": capi.ErrorDetail{Type: typ, Message: err.Error()}})
		flush()
	}
	var wt store.Watcher
	if since > 0 {
		var err error
		if wt, err = s.st.Watch(ctx, prefix, since); err != nil {
			return err // 410 for compacted, before anything is written
		}
		start()
		flush()
	} else {
		start()
		rev, err := s.replay(ctx, enc, prefix, f, hosts)
		if err != nil {
			fail(err) // headers are out: end the stream with an error line
			return nil
		}
		_ = enc.Encode(capi.Event{Type: capi.EventSynced, Revision: rev})
		flush()
		if wt, err = s.st.Watch(ctx, prefix, rev); err != nil {
			fail(err)
			return nil
		}
	}
	tick := time.NewTicker(keepAlive)
	defer tick.Stop()
	for {
		select {
		case ev, ok := <-wt.Events():
			if !ok {
				if err := wt.Err(); err != nil && ctx.Err() == nil {
					fail(err)
				}
				return nil
			}
			e, err := toEvent(ev, hosts)
			if err != nil {
				s.log.Warn("undecodable stored object in watch", "key", ev.Key, "err", err)
				continue
			}
			joined := f.track(&e, ev.Key)
			if f.keep(&e) {
				if err := enc.Encode(e); err != nil {
					return nil // client gone
				}
			}
			if joined != "" {
				// The host's first port in this VPC: send the VPC's other
				// ports as they are now. Events for them older than what
				// is sent may follow; revision numbers order them.
				if err := s.replayVPC(ctx, enc, joined, f.host, e.Revision); err != nil {
					fail(err)
					return nil
				}
			}
			if len(wt.Events()) == 0 {
				flush()
			}
		case <-tick.C:
			_, _ = bw.WriteString("\n")
			flush()
		case <-ctx.Done():
			return nil
		}
	}
}

// replay writes the current objects as ADDED events and returns the
// revision to watch from.
func (s *Server) replay(ctx context.Context, enc *json.Encoder, prefix string, f *portFilter, hosts bool) (int64, error) {
	emit := func(kv store.KV) error {
		e, err := toEvent(store.Event{Type: store.EventPut, Key: kv.Key, Value: kv.Value, Rev: kv.ModRev}, hosts)
		if err != nil {
			return err
		}
		e.Type = capi.EventAdded
		f.track(&e, kv.Key)
		return enc.Encode(e)
	}
	if f.host == "" {
		return s.st.ForEach(ctx, prefix, emit)
	}
	// Use the host index, then read each port; the watch that follows
	// starts at the index snapshot, so later changes arrive as events.
	idx := "idx/host/" + f.host + "/"
	var keys []string
	rev, err := s.st.ForEach(ctx, idx, func(kv store.KV) error {
		keys = append(keys, "ports/"+kv.Key[len(idx):])
		return nil
	})
	if err != nil {
		return 0, err
	}
	for _, k := range keys {
		kv, err := s.st.Get(ctx, k)
		if errors.Is(err, kerrors.NotFound) {
			continue
		}
		if err != nil {
			return 0, err
		}
		if err := emit(kv); err != nil {
			return 0, err
		}
	}
	vpcs := make([]string, 0, len(f.vpcs))
	for v := range f.vpcs {
		vpcs = append(vpcs, v)
	}
	slices.Sort(vpcs)
	for _, v := range vpcs {
		if err := s.replayVPC(ctx, enc, v, f.host, 0); err != nil {
			return 0, err
		}
	}
	return rev, nil
}

// replayVPC writes the ports of VPC key v (pid/vpc) not bound to host as
// ADDED events with stream revision rev (0 while listing: then each event
// carries its port's revision, as the other listed ports do).
func (s *Server) replayVPC(ctx context.Context, enc *json.Encoder, v, host string, rev int64) error {
	idx := "idx/vpc/" + v + "/"
	pid, _, _ := strings.Cut(v, "/")
	var keys []string
	if _, err := s.st.ForEach(ctx, idx, func(kv store.KV) error {
		keys = append(keys, portKey(pid, kv.Key[len(idx):]))
		return nil
	}); err != nil {
		return err
	}
	for _, k := range keys {
		kv, err := s.st.Get(ctx, k)
		if errors.Is(err, kerrors.NotFound) {
			continue
		}
		if err != nil {
			return err
		}
		p, err := decodePort(kv)
		if err != nil {
			return err
		}
		if p.BindingHostID == host {
			continue
		}
		ev := capi.Event{Type: capi.EventAdded, Revision: rev, Port: &p}
		if rev == 0 {
			ev.Revision = p.RevisionNumber // listing: as the other listed ports
		}
		if err := enc.Encode(ev); err != nil {
			return err
		}
	}
	return nil
}
