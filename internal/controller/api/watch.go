package api

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"kurma.dev/kurma/internal/controller/store"
	"kurma.dev/kurma/internal/kerrors"
	capi "kurma.dev/kurma/pkg/controllerapi"
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
	host := q.Get("binding:host_id")
	if hosts && host != "" {
		return kerrors.New(kerrors.Invalid, "binding:host_id filters port watches only")
	}
	if strings.Contains(host, "/") {
		return kerrors.New(kerrors.Invalid, "binding:host_id %q contains '/'", host)
	}
	prefix := "ports/"
	if hosts {
		prefix = "hosts/"
	}
	keep := func(e *capi.Event) bool { return host == "" || (e.Port != nil && e.Port.BindingHostID == host) }

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
		rev, err := s.replay(ctx, enc, prefix, host, hosts)
		if err != nil {
			// Headers are out: end the stream with an error line.
			_ = enc.Encode(map[string]any{"type": "ERROR", "error": capi.ErrorDetail{Type: kerrors.Type(err), Message: err.Error()}})
			flush()
			return nil
		}
		_ = enc.Encode(capi.Event{Type: capi.EventSynced, Revision: rev})
		flush()
		if wt, err = s.st.Watch(ctx, prefix, rev); err != nil {
			_ = enc.Encode(map[string]any{"type": "ERROR", "error": capi.ErrorDetail{Type: kerrors.Type(err), Message: err.Error()}})
			flush()
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
					typ := kerrors.Type(err)
					if errors.Is(err, store.ErrCompacted) {
						typ = "Gone"
					}
					_ = enc.Encode(map[string]any{"type": "ERROR", "error": capi.ErrorDetail{Type: typ, Message: err.Error()}})
					flush()
				}
				return nil
			}
			e, err := toEvent(ev, hosts)
			if err != nil {
				s.log.Warn("undecodable stored object in watch", "key", ev.Key, "err", err)
				continue
			}
			if keep(&e) {
				if err := enc.Encode(e); err != nil {
					return nil // client gone
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
func (s *Server) replay(ctx context.Context, enc *json.Encoder, prefix, host string, hosts bool) (int64, error) {
	emit := func(kv store.KV) error {
		e, err := toEvent(store.Event{Type: store.EventPut, Key: kv.Key, Value: kv.Value, Rev: kv.ModRev}, hosts)
		if err != nil {
			return err
		}
		e.Type = capi.EventAdded
		return enc.Encode(e)
	}
	if host == "" {
		return s.st.ForEach(ctx, prefix, emit)
	}
	// Use the host index, then read each port; the watch that follows
	// starts at the index snapshot, so later changes arrive as events.
	idx := "idx/host/" + host + "/"
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
	return rev, nil
}
