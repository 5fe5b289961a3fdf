package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"kurma.dev/kurma/pkg/controllerapi"
)

// stubController is a scripted stand-in for the controller used to test
// the plugin's HTTP behaviour (request shapes, long poll and fallback,
// rollback, error mapping). Conformance against the real controller lives
// in test/cniconformance.
type stubController struct {
	t       testing.TB
	srv     *httptest.Server
	subnet  controllerapi.Subnet
	project string

	// onCreate decides what happens to a new port (default: UP at once).
	onCreate func(p *controllerapi.Port)
	// longPoll: honour wait_status (false: answer at once, like spec 003).
	longPoll bool
	// fail, when set, answers a request with its status instead of
	// serving it (0: serve).
	fail func(r *http.Request) int
	// loseCreates is how many creates are stored and then answered by
	// closing the connection (a controller killed mid-request).
	loseCreates int

	mu    sync.Mutex // guards ports and log
	ports map[string]*controllerapi.Port
	log   []string
	cond  *sync.Cond
}

func newStub(t testing.TB) *stubController {
	s := &stubController{
		t: t, project: "p1", longPoll: true, ports: map[string]*controllerapi.Port{},
		subnet: controllerapi.Subnet{ID: "s1", CIDR: "10.77.0.0/24", GatewayIP: "10.77.0.1", DNSNameservers: []string{"10.77.0.53"}},
	}
	s.cond = sync.NewCond(&s.mu)
	s.onCreate = func(p *controllerapi.Port) { p.Status = controllerapi.StatusUp }
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *stubController) setStatus(id, status string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if p := s.ports[id]; p != nil {
		p.Status = status
		s.cond.Broadcast()
	}
}

func (s *stubController) requests() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.log...)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func notFound(w http.ResponseWriter) {
	writeJSON(w, 404, controllerapi.ErrorBody{Error: controllerapi.ErrorDetail{Type: "NotFound", Message: "no such object"}})
}

// waitLocked waits (s.mu held) until port id leaves PENDING, is deleted
// (nil) or the request's timeout passes.
func (s *stubController) waitLocked(r *http.Request, id string) *controllerapi.Port {
	d, _ := time.ParseDuration(r.URL.Query().Get("timeout"))
	deadline := time.Now().Add(d)
	stop := time.AfterFunc(d, func() { s.mu.Lock(); s.cond.Broadcast(); s.mu.Unlock() })
	defer stop.Stop()
	p := s.ports[id]
	for p != nil && p.Status == controllerapi.StatusPending && time.Now().Before(deadline) {
		s.cond.Wait()
		p = s.ports[id]
	}
	return p
}

func (s *stubController) serve(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.log = append(s.log, r.Method+" "+r.URL.Path)
	s.mu.Unlock()
	if s.fail != nil {
		if code := s.fail(r); code != 0 {
			typ := map[int]string{403: "Unauthorized", 502: "Unavailable", 503: "Unavailable"}[code]
			writeJSON(w, code, controllerapi.ErrorBody{Error: controllerapi.ErrorDetail{Type: typ, Message: "scripted failure"}})
			return
		}
	}
	base := "/project/" + s.project + "/"
	if !strings.HasPrefix(r.URL.Path, base) {
		notFound(w)
		return
	}
	rest := strings.TrimPrefix(r.URL.Path, base)
	switch {
	case r.Method == "GET" && rest == "subnets/"+s.subnet.ID:
		writeJSON(w, 200, controllerapi.SubnetBody{Subnet: s.subnet})
	case r.Method == "POST" && rest == "ports":
		var b controllerapi.PortBody
		if err := json.NewDecoder(r.Body).Decode(&b); err != nil {
			writeJSON(w, 400, controllerapi.ErrorBody{Error: controllerapi.ErrorDetail{Type: "Invalid", Message: err.Error()}})
			return
		}
		s.mu.Lock()
		if _, dup := s.ports[b.Port.ID]; dup {
			s.mu.Unlock()
			writeJSON(w, 409, controllerapi.ErrorBody{Error: controllerapi.ErrorDetail{Type: "Conflict", Message: "duplicate id"}})
			return
		}
		p := b.Port
		p.Status = controllerapi.StatusPending
		p.MACAddress = fmt.Sprintf("02:00:00:00:00:%02x", len(s.ports)+1)
		p.FixedIPs = []controllerapi.FixedIP{{SubnetID: s.subnet.ID, IPAddress: fmt.Sprintf("10.77.0.%d", len(s.ports)+2)}}
		s.ports[p.ID] = &p
		created := p
		lose := s.loseCreates > 0
		if lose {
			s.loseCreates--
		}
		s.mu.Unlock()
		go func() {
			s.mu.Lock()
			if q := s.ports[p.ID]; q != nil {
				s.onCreate(q)
				s.cond.Broadcast()
			}
			s.mu.Unlock()
		}()
		if lose {
			conn, _, err := http.NewResponseController(w).Hijack()
			if err != nil {
				s.t.Errorf("hijack: %v", err)
				return
			}
			_ = conn.Close()
			return
		}
		if s.longPoll && r.URL.Query().Get("wait_status") != "" {
			s.mu.Lock()
			if q := s.waitLocked(r, p.ID); q != nil {
				created = *q
			}
			s.mu.Unlock()
		}
		writeJSON(w, 201, controllerapi.PortBody{Port: created})
	case r.Method == "GET" && rest == "ports":
		s.mu.Lock()
		var out []controllerapi.Port
		q := r.URL.Query()
		for _, p := range s.ports {
			if (q.Get("device_id") == "" || q.Get("device_id") == p.DeviceID) &&
				(q.Get("binding:host_id") == "" || q.Get("binding:host_id") == p.BindingHostID) &&
				(q.Get("network_id") == "" || q.Get("network_id") == p.NetworkID) {
				out = append(out, *p)
			}
		}
		s.mu.Unlock()
		writeJSON(w, 200, controllerapi.PortsBody{Ports: out})
	case strings.HasPrefix(rest, "ports/"):
		id := strings.TrimPrefix(rest, "ports/")
		s.mu.Lock()
		p := s.ports[id]
		if p == nil {
			s.mu.Unlock()
			notFound(w)
			return
		}
		if r.Method == "DELETE" {
			delete(s.ports, id)
			s.mu.Unlock()
			writeJSON(w, 200, struct{}{})
			return
		}
		if s.longPoll && r.URL.Query().Get("wait_status") != "" {
			p = s.waitLocked(r, id)
		}
		var out controllerapi.Port
		if p != nil {
			out = *p
		}
		s.mu.Unlock()
		if p == nil {
			notFound(w)
			return
		}
		writeJSON(w, 200, controllerapi.PortBody{Port: out})
	default:
		notFound(w)
	}
}
