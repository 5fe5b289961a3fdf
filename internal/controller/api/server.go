package api

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"kurma.dev/kurma/internal/controller/core"
	"kurma.dev/kurma/internal/controller/store"
	capi "kurma.dev/kurma/pkg/controllerapi"
	"kurma.dev/kurma/pkg/kerrors"
)

// Config configures a Server.
type Config struct {
	Store  store.Store
	Token  string // empty: no auth (the command only allows that on loopback)
	Logger *slog.Logger
	// MaxWait caps long-poll timeouts (default 5m).
	MaxWait time.Duration
}

// Server serves the controller API over a core.Core. Create with New,
// start its background work with Run, serve Handler.
type Server struct {
	core    *core.Core
	token   []byte
	log     *slog.Logger
	maxWait time.Duration
	mux     *http.ServeMux
	metrics *metrics
}

// New builds a server.
func New(cfg Config) (*Server, error) {
	if cfg.Store == nil {
		return nil, kerrors.New(kerrors.Invalid, "no store")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.MaxWait <= 0 {
		cfg.MaxWait = 5 * time.Minute
	}
	c, err := core.New(core.Config{Store: cfg.Store, Logger: cfg.Logger})
	if err != nil {
		return nil, err
	}
	s := &Server{
		core:    c,
		log:     cfg.Logger,
		maxWait: cfg.MaxWait,
		mux:     http.NewServeMux(),
		metrics: newMetrics(c.Collectors()),
	}
	if cfg.Token != "" {
		s.token = []byte(cfg.Token)
	}
	s.routes()
	return s, nil
}

// Registry exposes the server's metrics registry.
func (s *Server) Registry() *prometheus.Registry { return s.metrics.reg }

// Run runs background work (the port-change feed behind long polls and
// the ports-by-status gauge) until ctx ends.
func (s *Server) Run(ctx context.Context) { s.core.Run(ctx) }

// Core returns the core the server calls.
func (s *Server) Core() *core.Core { return s.core }

// Preload is core.Core.Preload (benchmarks fill a store with it).
func (s *Server) Preload(ctx context.Context, pid, sid string, n int, hostOf func(int) string, load func(context.Context, []store.KV) error) error {
	return s.core.Preload(ctx, pid, sid, n, hostOf, load)
}

func (s *Server) routes() {
	h := func(pattern, route string, fn func(http.ResponseWriter, *http.Request) error) {
		s.mux.Handle(pattern, s.instrument(route, fn))
	}
	h("POST /projects", "projects", s.createProject)
	h("GET /projects", "projects", s.listProjects)
	h("GET /projects/{id}", "project", s.getProject)
	h("DELETE /projects/{id}", "project", s.deleteProject)

	h("POST /project/{pid}/vpcs", "vpcs", s.createVPC)
	h("GET /project/{pid}/vpcs", "vpcs", s.listVPCs)
	h("GET /project/{pid}/vpcs/{id}", "vpc", s.getVPC)
	h("DELETE /project/{pid}/vpcs/{id}", "vpc", s.deleteVPC)

	h("POST /project/{pid}/subnets", "subnets", s.createSubnet)
	h("GET /project/{pid}/subnets", "subnets", s.listSubnets)
	h("GET /project/{pid}/subnets/{id}", "subnet", s.getSubnet)
	h("DELETE /project/{pid}/subnets/{id}", "subnet", s.deleteSubnet)

	h("POST /project/{pid}/ports", "ports", s.createPorts)
	h("GET /project/{pid}/ports", "ports", s.listPorts)
	h("GET /project/{pid}/ports/{id}", "port", s.getPort)
	h("DELETE /project/{pid}/ports/{id}", "port", s.deletePort)
	h("PUT /project/{pid}/ports/{id}/status", "port_status", s.setPortStatus)
	h("PUT /project/{pid}/ports/{id}/binding", "port_binding", s.setPortBinding)

	h("PUT /hosts/{id}", "host", s.putHost)
	h("GET /hosts", "hosts", s.listHosts)
	h("GET /hosts/{id}", "host", s.getHost)
	h("DELETE /hosts/{id}", "host", s.deleteHost)

	h("POST /project/{pid}/loadbalancers", "loadbalancers", s.createLBs)
	h("GET /project/{pid}/loadbalancers", "loadbalancers", s.listLBs)
	h("GET /loadbalancers", "all_loadbalancers", s.listLBs)
	h("GET /project/{pid}/loadbalancers/{id}", "loadbalancer", s.getLB)
	h("PUT /project/{pid}/loadbalancers/{id}", "loadbalancer", s.updateLB)
	h("DELETE /project/{pid}/loadbalancers/{id}", "loadbalancer", s.deleteLB)
	h("PUT /project/{pid}/loadbalancers/{id}/members", "loadbalancer_members", s.setMembers)

	h("POST /external-networks", "external_networks", s.createExtnet)
	h("GET /external-networks", "external_networks", s.listExtnets)
	h("GET /external-networks/{id}", "external_network", s.getExtnet)
	h("DELETE /external-networks/{id}", "external_network", s.deleteExtnet)

	h("POST /project/{pid}/floatingips", "floatingips", s.createFIP)
	h("GET /project/{pid}/floatingips", "floatingips", s.listFIPs)
	h("GET /floatingips", "all_floatingips", s.listFIPs)
	h("GET /project/{pid}/floatingips/{id}", "floatingip", s.getFIP)
	h("PUT /project/{pid}/floatingips/{id}", "floatingip", s.associateFIP)
	h("DELETE /project/{pid}/floatingips/{id}", "floatingip", s.deleteFIP)

	h("GET /watch/ports", "watch_ports", s.watchPorts)
	h("GET /watch/loadbalancers", "watch_loadbalancers", s.watchLBs)
	h("GET /watch/hosts", "watch_hosts", s.watchHosts)

	s.mux.Handle("GET /metrics", s.authOnly(promhttp.HandlerFor(s.metrics.reg, promhttp.HandlerOpts{})))
	s.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		if err := s.core.Healthy(r.Context()); err != nil {
			writeError(w, err)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if !s.authorized(r) {
			writeError(w, kerrors.New(kerrors.Unauthorized, "missing or wrong bearer token"))
			return
		}
		writeError(w, kerrors.New(kerrors.NotFound, "no route for %s %s", r.Method, r.URL.Path))
	})
}

// Handler returns the HTTP handler.
func (s *Server) Handler() http.Handler { return s.mux }

func (s *Server) authorized(r *http.Request) bool {
	if s.token == nil {
		return true
	}
	h := r.Header.Get("Authorization")
	tok, ok := strings.CutPrefix(h, "Bearer ")
	return ok && subtle.ConstantTimeCompare([]byte(tok), s.token) == 1
}

func (s *Server) authOnly(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !s.authorized(r) {
			writeError(w, kerrors.New(kerrors.Unauthorized, "missing or wrong bearer token"))
			return
		}
		h.ServeHTTP(w, r)
	})
}

type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(c int) {
	if w.code == 0 {
		w.code = c
	}
	w.ResponseWriter.WriteHeader(c)
}

func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (s *Server) instrument(route string, fn func(http.ResponseWriter, *http.Request) error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w}
		var err error
		if !s.authorized(r) {
			err = kerrors.New(kerrors.Unauthorized, "missing or wrong bearer token")
		} else {
			err = fn(sw, r)
		}
		if err != nil {
			if sw.code == 0 {
				writeError(sw, err)
			}
			lvl := slog.LevelDebug
			if kerrors.HTTPStatus(err) >= 500 {
				lvl = slog.LevelError
			}
			s.log.Log(r.Context(), lvl, "request failed", "method", r.Method, "path", r.URL.Path, "err", err)
		}
		code := sw.code
		if code == 0 {
			code = http.StatusOK
		}
		s.metrics.observe(route, r.Method, code, time.Since(start))
	})
}

// writeJSON writes v with status code.
func writeJSON(w http.ResponseWriter, code int, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode response: %w", err)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = w.Write(append(b, '\n'))
	return nil
}

// writeError writes the JSON error body for err.
func writeError(w http.ResponseWriter, err error) {
	code := kerrors.HTTPStatus(err)
	typ := kerrors.Type(err)
	if errors.Is(err, store.ErrCompacted) {
		code, typ = http.StatusGone, "Gone"
	}
	if code == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="kurma-controller"`)
	}
	msg := err.Error()
	if code == http.StatusInternalServerError {
		msg = "internal error: " + msg
	}
	_ = writeJSON(w, code, capi.ErrorBody{Error: capi.ErrorDetail{Type: typ, Message: msg}})
}
