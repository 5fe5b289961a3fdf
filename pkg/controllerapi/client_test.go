package controllerapi_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
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

// TestEachLoadBalancer: the streamed listing yields what the whole-body
// listing does, one at a time, and fn's error stops it.
func TestEachLoadBalancer(t *testing.T) {
	lbs := []capi.LoadBalancer{
		{ID: "a", VIPAddress: "10.96.0.1", Listeners: []capi.Listener{{Protocol: "TCP", Port: 80}},
			Members: []capi.Member{{Address: "10.0.0.5", PortID: "p"}}},
		{ID: "b", VIPAddress: "10.96.0.2", SessionPersistence: &capi.SessionPersistence{Type: "SOURCE_IP"}},
		{ID: "c"},
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Another member before and after the array is skipped.
		fmt.Fprint(w, `{"next":{"x":[1,2]},"loadbalancers":`)
		_ = json.NewEncoder(w).Encode(lbs)
		fmt.Fprint(w, `,"count":3}`)
	}))
	t.Cleanup(srv.Close)
	c, _ := capi.New(srv.URL)
	var got []capi.LoadBalancer
	if err := c.EachLoadBalancer(t.Context(), "p", func(lb *capi.LoadBalancer) error {
		got = append(got, *lb)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, lbs) {
		t.Fatalf("streamed %+v\nwant %+v", got, lbs)
	}
	stop := errors.New("stop")
	n := 0
	if err := c.EachLoadBalancer(t.Context(), "p", func(*capi.LoadBalancer) error { n++; return stop }); !errors.Is(err, stop) || n != 1 {
		t.Fatalf("fn error: got %v after %d, want stop after 1", err, n)
	}
}

func TestEachInArray(t *testing.T) {
	tests := []struct {
		body string
		n    int
		bad  bool
	}{
		{body: `{"items":[{},{},{}]}`, n: 3},
		{body: `{"items":null}`},
		{body: `{}`},
		{body: `{"other":"x"}`},
		{body: `{"items":{}}`, bad: true},
		{body: `[]`, bad: true},
		{body: `{"items":[{}`, bad: true},
		{body: ``, bad: true},
	}
	for _, tc := range tests {
		n := 0
		err := capi.EachInArray(strings.NewReader(tc.body), "items", func(dec *json.Decoder) error {
			n++
			var v json.RawMessage
			return dec.Decode(&v)
		})
		if (err != nil) != tc.bad || (!tc.bad && n != tc.n) {
			t.Errorf("%s: %d elements, err %v; want %d, bad %v", tc.body, n, err, tc.n, tc.bad)
		}
	}
}

// FuzzEachInArray: any body gives elements or an error, never a panic,
// and a body json.Unmarshal reads as {"items":[...]} streams as many
// elements as it holds.
func FuzzEachInArray(f *testing.F) {
	for _, s := range []string{`{"items":[{"id":"a"},{"id":"b"}]}`, `{"items":null,"x":1}`, `{"items":[1,"x",null]}`, `{"a":{"items":[]}}`, `[`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		n := 0
		err := capi.EachInArray(bytes.NewReader(b), "items", func(dec *json.Decoder) error {
			n++
			var v json.RawMessage
			return dec.Decode(&v)
		})
		var whole map[string]json.RawMessage
		if err != nil || json.Unmarshal(b, &whole) != nil {
			return
		}
		var items []json.RawMessage
		if json.Unmarshal(whole["items"], &items) == nil && bytes.Count(b, []byte(`"items"`)) == 1 && len(items) != n {
			t.Fatalf("streamed %d elements, the body holds %d", n, len(items))
		}
	})
}
