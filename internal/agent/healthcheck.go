package agent

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// healthChecks serves the health check node ports of load balancers with
// ExternalLocal (Kubernetes' healthCheckNodePort): HTTP GET on each port
// answers 200 while this host has a local member and 503 otherwise, so
// that an external load balancer sends traffic only to nodes that keep
// it (the body is kube-proxy's JSON). The syncs of load balancers update
// it with the records they handle; a port opens with its first load
// balancer and closes with its last.
type healthChecks struct {
	addr string // the address to listen on ("" : every address)
	log  *slog.Logger

	mu    sync.Mutex         // guards byLB, ports and retry
	byLB  map[string]hcWant  // load balancer id -> what it asks for
	ports map[uint16]*hcPort // open ports
	retry map[uint16]bool    // ports whose listen failed (tried again at the next apply)
}

type hcWant struct {
	port  uint16
	name  string // "namespace/name" of the Service
	local int
}

type hcPort struct {
	srv  *http.Server
	want hcWant // as last set (guarded by healthChecks.mu)
}

func newHealthChecks(addr string, log *slog.Logger) *healthChecks {
	return &healthChecks{addr: addr, log: log, byLB: map[string]hcWant{}, ports: map[uint16]*hcPort{}, retry: map[uint16]bool{}}
}

// set records what load balancer id asks for (r nil or without a health
// check port: nothing).
func (h *healthChecks) set(id string, r *lbRec) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if r == nil || r.hcNodePort == 0 {
		delete(h.byLB, id)
		return
	}
	n := 0
	for _, m := range r.members {
		if m.Local && !m.Backup {
			n++
		}
	}
	h.byLB[id] = hcWant{port: r.hcNodePort, name: r.name, local: n}
}

// retain forgets the load balancers keep rejects (after a full listing).
func (h *healthChecks) retain(keep func(id string) bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for id := range h.byLB {
		if !keep(id) {
			delete(h.byLB, id)
		}
	}
}

// apply opens and closes listeners to match what is recorded. A port
// that cannot be opened (in use) is logged and tried again at the next
// apply.
func (h *healthChecks) apply() {
	h.mu.Lock()
	want := map[uint16]hcWant{}
	for _, w := range h.byLB {
		want[w.port] = w
	}
	var closing []*http.Server
	for port, p := range h.ports {
		if w, ok := want[port]; ok {
			p.want = w
			continue
		}
		closing = append(closing, p.srv)
		delete(h.ports, port)
	}
	var opening []uint16
	for port := range want {
		if _, ok := h.ports[port]; !ok {
			opening = append(opening, port)
		}
	}
	h.mu.Unlock()
	for _, s := range closing {
		_ = s.Close()
	}
	for _, port := range opening {
		ln, err := net.Listen("tcp", net.JoinHostPort(h.addr, strconv.Itoa(int(port))))
		h.mu.Lock()
		if err != nil {
			if !h.retry[port] {
				h.log.Warn("health check node port", "port", port, "err", err)
			}
			h.retry[port] = true
			h.mu.Unlock()
			continue
		}
		delete(h.retry, port)
		p := &hcPort{want: want[port]}
		p.srv = &http.Server{Handler: h.handler(port), ReadHeaderTimeout: 5 * time.Second}
		h.ports[port] = p
		h.mu.Unlock()
		go func() {
			if err := p.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				h.log.Warn("health check node port stopped", "port", port, "err", err)
			}
		}()
	}
}

func (h *healthChecks) handler(port uint16) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		h.mu.Lock()
		var want hcWant
		if p := h.ports[port]; p != nil {
			want = p.want
		}
		h.mu.Unlock()
		ns, name, _ := strings.Cut(want.name, "/")
		body, _ := json.Marshal(map[string]any{
			"service":             map[string]string{"namespace": ns, "name": name},
			"localEndpoints":      want.local,
			"serviceProxyHealthy": true,
		})
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		if want.local == 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_, _ = w.Write(body)
	})
}

// close stops every listener.
func (h *healthChecks) close(ctx context.Context) {
	h.mu.Lock()
	ports := h.ports
	h.ports = map[uint16]*hcPort{}
	h.mu.Unlock()
	for _, p := range ports {
		_ = p.srv.Shutdown(ctx)
	}
}
