package controllerapi_test

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	capi "kurma.dev/kurma/pkg/controllerapi"
	"kurma.dev/kurma/pkg/kerrors"
)

func TestNewValidatesURL(t *testing.T) {
	for _, u := range []string{"", "127.0.0.1:9696", "ftp://x", "http://"} {
		if _, err := capi.New(u); !errors.Is(err, kerrors.Invalid) {
			t.Errorf("New(%q) = %v, want Invalid", u, err)
		}
	}
	if _, err := capi.New("http://127.0.0.1:9696/"); err != nil {
		t.Fatal(err)
	}
}

// The error mapping is pure client logic; a loopback server plays canned
// answers.
func TestErrorMapping(t *testing.T) {
	tests := []struct {
		name   string
		status int
		body   string
		want   error
	}{
		{"typed not found", 404, `{"error":{"type":"NotFound","message":"port x"}}`, kerrors.NotFound},
		{"typed exhausted", 409, `{"error":{"type":"Exhausted","message":"full"}}`, kerrors.Exhausted},
		{"typed gone", 410, `{"error":{"type":"Gone","message":"old"}}`, capi.ErrCompacted},
		{"untyped 401", 401, `nope`, kerrors.Unauthorized},
		{"untyped 503", 503, ``, kerrors.Unavailable},
		{"untyped 502", 502, `<html>`, kerrors.Unavailable},
		{"untyped 400", 400, `bad`, kerrors.Invalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(tt.status)
				fmt.Fprint(w, tt.body)
			}))
			t.Cleanup(srv.Close)
			c, _ := capi.New(srv.URL)
			_, err := c.GetPort(t.Context(), "p", "x")
			if !errors.Is(err, tt.want) {
				t.Fatalf("GetPort = %v, want %v", err, tt.want)
			}
		})
	}
}

func TestWatchStreamParsing(t *testing.T) {
	tests := []struct {
		name    string
		stream  string
		types   []string
		wantErr error
	}{
		{"events then eof", "{\"type\":\"ADDED\",\"revision\":3,\"port\":{\"id\":\"a\"}}\n\n{\"type\":\"SYNCED\",\"revision\":3}\n", []string{"ADDED", "SYNCED"}, kerrors.Unavailable},
		{"error line", "{\"type\":\"ADDED\",\"revision\":3,\"port\":{\"id\":\"a\"}}\n{\"type\":\"ERROR\",\"error\":{\"type\":\"Unavailable\",\"message\":\"x\"}}\n", []string{"ADDED"}, kerrors.Unavailable},
		{"gone line", "{\"type\":\"ERROR\",\"error\":{\"type\":\"Gone\",\"message\":\"x\"}}\n", nil, capi.ErrCompacted},
		{"garbage", "{nope\n", nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Query().Get("since") != "7" || r.URL.Query().Get("binding:host_id") != "h1" {
					w.WriteHeader(400)
					return
				}
				fmt.Fprint(w, tt.stream)
			}))
			t.Cleanup(srv.Close)
			c, _ := capi.New(srv.URL)
			var got []string
			var last error
			for ev, err := range c.WatchPorts(t.Context(), 7, "h1") {
				if err != nil {
					last = err
					break
				}
				got = append(got, ev.Type)
			}
			if fmt.Sprint(got) != fmt.Sprint(tt.types) {
				t.Fatalf("events %v, want %v", got, tt.types)
			}
			if last == nil || (tt.wantErr != nil && !errors.Is(last, tt.wantErr)) {
				t.Fatalf("final error %v, want %v", last, tt.wantErr)
			}
		})
	}
}
