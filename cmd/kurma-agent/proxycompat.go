package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"net/http"
	"time"
)

// In Kubernetes mode the agent takes kube-proxy's place, and tools and
// cloud load balancers probe kube-proxy's two well-known ports: the
// health port (10256: GET /healthz and /livez, JSON with lastUpdated and
// currentTime, 200 or 503) and the status port (10249: GET /proxyMode).
// serveProxyCompat answers them the same way, the health answer meaning
// what the agent's own /healthz means (its datapath programmed from the
// controller's state). The upstream spec "Networking should check
// kube-proxy urls" reads both. A port that cannot be bound (kube-proxy
// still running) is logged, not fatal.
func serveProxyCompat(ctx context.Context, healthzAddr, statusAddr string, ready func() error, log *slog.Logger) {
	health, status := proxyCompatHandlers(ready)
	for _, s := range []struct {
		addr, what string
		h          http.Handler
	}{{healthzAddr, "kube-proxy health port", health}, {statusAddr, "kube-proxy status port", status}} {
		if s.addr == "" {
			continue
		}
		l, err := net.Listen("tcp", s.addr)
		if err != nil {
			log.Warn(s.what+" not served (is kube-proxy still running?)", "addr", s.addr, "err", err)
			continue
		}
		serve(ctx, l, s.h, s.what, log)
	}
}

// proxyCompatHandlers are the handlers of kube-proxy's health and status
// ports.
func proxyCompatHandlers(ready func() error) (health, status http.Handler) {
	hm := http.NewServeMux()
	answer := func(w http.ResponseWriter, _ *http.Request) {
		now := time.Now().UTC()
		body := struct {
			LastUpdated  string `json:"lastUpdated"`
			CurrentTime  string `json:"currentTime"`
			NodeEligible bool   `json:"nodeEligible"`
		}{CurrentTime: now.Format(time.RFC3339Nano), NodeEligible: true}
		code := http.StatusOK
		if err := ready(); err != nil {
			code = http.StatusServiceUnavailable
		} else {
			body.LastUpdated = body.CurrentTime
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(body)
	}
	hm.HandleFunc("GET /healthz", answer)
	hm.HandleFunc("GET /livez", answer)
	sm := http.NewServeMux()
	sm.HandleFunc("GET /proxyMode", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("kurma"))
	})
	return hm, sm
}
