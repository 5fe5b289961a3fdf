package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"kurma.dev/kurma/pkg/controllerapi"
	"kurma.dev/kurma/pkg/kerrors"
)

// The hand-written UUID v5 must give the ids earlier versions (which used
// github.com/google/uuid) gave, or DEL would miss their ports.
func TestUUIDv5(t *testing.T) {
	ns := uuid.Must(uuid.FromBytes(portNamespace[:]))
	if ns.String() != "6f1d3c2e-8a55-4f0b-9c7e-2b8e1d4a9f10" {
		t.Fatalf("namespace %s", ns)
	}
	for _, name := range []string{"", "a", "host\x00proj\x00sub\x00net\x00ctr\x00eth0", strings.Repeat("x", 1000)} {
		if got, want := uuidV5(portNamespace, []byte(name)), uuid.NewSHA1(ns, []byte(name)).String(); got != want {
			t.Errorf("uuidV5(%q) = %s, want %s", name, got, want)
		}
	}
}

// The plugin's wire types encode like pkg/controllerapi's for every field
// they share, and decode what the controller sends.
func TestWireTypesMatchControllerAPI(t *testing.T) {
	tr := true
	ours := port{ID: "i", ProjectID: "p", Name: "n", Description: "d", NetworkID: "s", DeviceID: "dev",
		VethName: "eth0", NetworkNS: "/ns", AdminStateUp: &tr, PortSecurityEnabled: &tr,
		BindingHostID: "h", BindingVNICType: "normal", FastPath: &tr, Status: "UP", StatusReason: "r",
		MACAddress: "02:00:00:00:00:01", FixedIPs: []fixedIP{{SubnetID: "s", IPAddress: "10.0.0.2", CIDR: "10.0.0.0/24", GatewayIP: "10.0.0.1"}}}
	theirs := controllerapi.Port{ID: "i", ProjectID: "p", Name: "n", Description: "d", NetworkID: "s", DeviceID: "dev",
		VethName: "eth0", NetworkNS: "/ns", AdminStateUp: &tr, PortSecurityEnabled: &tr,
		BindingHostID: "h", BindingVNICType: "normal", FastPath: &tr, Status: "UP", StatusReason: "r",
		MACAddress: "02:00:00:00:00:01", FixedIPs: []controllerapi.FixedIP{{SubnetID: "s", IPAddress: "10.0.0.2", CIDR: "10.0.0.0/24", GatewayIP: "10.0.0.1"}}}
	a, _ := json.Marshal(ours)
	b, _ := json.Marshal(theirs)
	if string(a) != string(b) {
		t.Fatalf("port encodings differ:\n ours   %s\n theirs %s", a, b)
	}
	sub := controllerapi.Subnet{ID: "s", CIDR: "10.0.0.0/24", GatewayIP: "10.0.0.1", DNSNameservers: []string{"10.0.0.53"}, VNI: 7}
	raw, _ := json.Marshal(sub)
	var got subnet
	if err := json.Unmarshal(raw, &got); err != nil || got.ID != "s" || got.CIDR != sub.CIDR || got.GatewayIP != sub.GatewayIP || len(got.DNSNameservers) != 1 {
		t.Fatalf("subnet decode = %+v, %v", got, err)
	}
}

func TestReadResponse(t *testing.T) {
	tests := []struct {
		name, raw string
		status    int
		body      string
		keep      bool
		wantErr   string
	}{
		{"content-length", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}", 200, "{}", true, ""},
		{"chunked", "HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\nT: v\r\n\r\n", 201, "abcde", true, ""},
		{"connection close", "HTTP/1.1 404 Not Found\r\nConnection: close\r\nContent-Length: 1\r\n\r\nx", 404, "x", false, ""},
		{"until close", "HTTP/1.0 200 OK\r\n\r\nall of it", 200, "all of it", false, ""},
		{"no content", "HTTP/1.1 204 No Content\r\n\r\n", 204, "", true, ""},
		{"bad status", "HTTP/2 200\r\n\r\n", 0, "", false, "malformed status line"},
		{"bad length", "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", 0, "", false, "Content-Length"},
		{"huge length", "HTTP/1.1 200 OK\r\nContent-Length: 999999999999\r\n\r\n", 0, "", false, "exceeds"},
		{"short body", "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nab", 0, "", false, "read body"},
		{"bad chunk", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 0, "", false, "chunk size"},
		{"gzip", "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", 0, "", false, "unsupported"},
		{"header without colon", "HTTP/1.1 200 OK\r\nbogus\r\n\r\n", 0, "", false, "malformed header"},
		{"eof in headers", "HTTP/1.1 200 OK\r\nA: b\r\n", 0, "", false, "unexpected EOF"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := readResponse(bufio.NewReader(strings.NewReader(tt.raw)))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || r.status != tt.status || string(r.body) != tt.body || r.keepAlive != tt.keep {
				t.Fatalf("readResponse = %+v (body %q), %v", r, r.body, err)
			}
		})
	}
}

// FuzzReadResponse: any bytes from the controller give a response or an
// error, never a panic or an unbounded allocation.
func FuzzReadResponse(f *testing.F) {
	f.Add([]byte("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"))
	f.Add([]byte("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"))
	f.Add([]byte("HTTP/1.0 500 x\r\n\r\nbody"))
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := readResponse(bufio.NewReader(strings.NewReader(string(data))))
		if err == nil && (r.status < 100 || r.status > 999 || len(r.body) > maxBody) {
			t.Fatalf("accepted %+v", r)
		}
	})
}

// The client against a real net/http server: keep-alive reuse, error
// bodies to categories, a server that closes idle connections, a deadline.
func TestAPIClient(t *testing.T) {
	var conns atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Header.Get("Authorization") != "Bearer tok":
			w.WriteHeader(401)
			fmt.Fprint(w, `{"error":{"type":"Unauthorized","message":"no token"}}`)
		case r.URL.Path == "/base/project/p/subnets/s":
			fmt.Fprint(w, `{"subnet":{"id":"s","cidr":"10.0.0.0/24"}}`)
		case r.URL.Path == "/base/project/p/ports/gone":
			w.WriteHeader(404)
			fmt.Fprint(w, `{"error":{"type":"NotFound","message":"port gone not found"}}`)
		case r.URL.Path == "/base/project/p/ports/plain":
			w.WriteHeader(503)
			fmt.Fprint(w, "busy")
		case r.URL.Path == "/base/project/p/ports/slow":
			time.Sleep(500 * time.Millisecond)
		case r.URL.Path == "/base/project/p/ports" && r.Method == "GET":
			// Big enough that net/http answers chunked.
			var ps []string
			for i := range 300 {
				ps = append(ps, fmt.Sprintf(`{"id":"p%d"}`, i))
			}
			fmt.Fprintf(w, `{"ports":[%s]}`, strings.Join(ps, ","))
		default:
			w.WriteHeader(400)
		}
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	base, _ := url.Parse(srv.URL + "/base/")
	c := newAPIClient(base, "tok", time.Second, nil)
	ctx := t.Context()

	for range 3 {
		s, err := c.GetSubnet(ctx, "p", "s")
		if err != nil || s.CIDR != "10.0.0.0/24" {
			t.Fatalf("GetSubnet = %+v, %v", s, err)
		}
	}
	ps, err := c.ListPorts(ctx, "p", portFilter{HostID: "h"})
	if err != nil || len(ps) != 300 {
		t.Fatalf("ListPorts = %d ports, %v", len(ps), err)
	}
	if _, err := c.GetPort(ctx, "p", "gone"); !errors.Is(err, kerrors.NotFound) || !strings.Contains(err.Error(), "port gone not found") {
		t.Errorf("404 = %v", err)
	}
	if _, err := c.GetPort(ctx, "p", "plain"); !errors.Is(err, kerrors.Unavailable) {
		t.Errorf("503 = %v", err)
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("%d connections for sequential requests, want 1", n)
	}
	// The server drops idle connections: the next GET redials.
	srv.CloseClientConnections()
	if _, err := c.GetSubnet(ctx, "p", "s"); err != nil {
		t.Errorf("GET after the server closed the idle connection: %v", err)
	}
	bad := newAPIClient(base, "wrong", time.Second, nil)
	if _, err := bad.GetSubnet(ctx, "p", "s"); !errors.Is(err, kerrors.Unauthorized) {
		t.Errorf("401 = %v", err)
	}
	dctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if _, err := c.GetPort(dctx, "p", "slow"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("deadline = %v", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead, _ := url.Parse("http://" + l.Addr().String())
	_ = l.Close()
	if _, err := newAPIClient(dead, "", time.Second, nil).GetSubnet(ctx, "p", "s"); !errors.Is(err, kerrors.Unavailable) {
		t.Errorf("refused = %v", err)
	}
}
