package main

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"kurma.dev/kurma/internal/debugpprof"
)

// newRegistry is the agent's Prometheus registry: the agent's own metrics
// (internal/agent/metrics.go) plus the Go runtime's and the process's.
func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// serveMetrics serves GET /metrics, GET /healthz (200 when ready says so,
// 503 with its reason before: the readiness probe), GET /livez (200 while
// the process serves: the liveness probe), and with pprof Go's
// /debug/pprof/, on addr until ctx ends. An address that
// cannot be bound (another agent's metrics on this host) is logged, not
// fatal: the datapath matters more than its figures.
func serveMetrics(ctx context.Context, addr string, reg *prometheus.Registry, ready func() error, pprof bool, log *slog.Logger) {
	if addr == "" {
		return
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		log.Error("metrics not served", "addr", addr, "err", err)
		return
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		if err := ready(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /livez", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	if pprof {
		debugpprof.Register(mux)
	}
	serve(ctx, l, mux, "metrics", log)
}

// serve serves h on l until ctx ends (then shuts the server down within
// 2 s); what names the server in the log.
func serve(ctx context.Context, l net.Listener, h http.Handler, what string, log *slog.Logger) {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	log.Info(what+" listening", "addr", l.Addr().String())
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	go func() {
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error(what+" server", "err", err)
		}
	}()
}
