package api

import (
	"bufio"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"

	"kurma.dev/kurma/internal/controller/core"
	"kurma.dev/kurma/internal/controller/store"
	capi "kurma.dev/kurma/pkg/controllerapi"
	"kurma.dev/kurma/pkg/kerrors"
)

// ndjsonSink writes a watch as newline-delimited JSON.
type ndjsonSink struct {
	w       http.ResponseWriter
	bw      *bufio.Writer
	enc     *json.Encoder
	started bool
}

func newSink(w http.ResponseWriter) *ndjsonSink {
	bw := bufio.NewWriterSize(w, 64<<10)
	return &ndjsonSink{w: w, bw: bw, enc: json.NewEncoder(bw)}
}

func (k *ndjsonSink) Start() {
	if !k.started {
		k.started = true
		k.w.Header().Set("Content-Type", "application/x-ndjson")
		k.w.Header().Set("Cache-Control", "no-cache")
		k.w.WriteHeader(http.StatusOK)
	}
}

func (k *ndjsonSink) Send(e capi.Event) error { return k.enc.Encode(e) }

func (k *ndjsonSink) Flush() {
	_ = k.bw.Flush()
	if f, ok := k.w.(http.Flusher); ok {
		f.Flush()
	}
}

func (k *ndjsonSink) KeepAlive() {
	_, _ = k.bw.WriteString("\n")
	k.Flush()
}

// fail ends a stream under way with an error line.
func (k *ndjsonSink) fail(err error) {
	typ := kerrors.Type(err)
	if errors.Is(err, store.ErrCompacted) {
		typ = "Gone"
	}
	_ = k.enc.Encode(map[string]any{"type": "ERROR", "error": capi.ErrorDetail{Type: typ, Message: err.Error()}})
	k.Flush()
}

var _ core.Sink = (*ndjsonSink)(nil)

func (s *Server) watchPorts(w http.ResponseWriter, r *http.Request) error {
	return s.watch(w, r, core.WatchPorts)
}

func (s *Server) watchHosts(w http.ResponseWriter, r *http.Request) error {
	return s.watch(w, r, core.WatchHosts)
}

func (s *Server) watchLBs(w http.ResponseWriter, r *http.Request) error {
	return s.watch(w, r, core.WatchLoadBalancers)
}

func (s *Server) watch(w http.ResponseWriter, r *http.Request, kind core.WatchKind) error {
	q := r.URL.Query()
	req := core.WatchRequest{Kind: kind, Host: q.Get("binding:host_id")}
	if v := q.Get("since"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return kerrors.New(kerrors.Invalid, "since %q: want a revision number >= 0", v)
		}
		req.Since = n
	}
	switch v := q.Get("vpc_peers"); v {
	case "", "false":
	case "true":
		req.Peers = true
	default:
		return kerrors.New(kerrors.Invalid, "vpc_peers %q: want true or false", v)
	}
	sink := newSink(w)
	err := s.core.Watch(r.Context(), req, sink)
	if err != nil && sink.started {
		if r.Context().Err() == nil {
			sink.fail(err) // headers are out: end the stream with an error line
		}
		return nil
	}
	return err
}
