package main

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
)

// TestProxyCompat: kube-proxy's health port answers 200 with lastUpdated
// when the agent is ready and 503 without it before; its status port
// names the proxy mode.
func TestProxyCompat(t *testing.T) {
	var notReady error = errors.New("load balancers not listed yet")
	health, status := proxyCompatHandlers(func() error { return notReady })
	for _, tc := range []struct {
		name    string
		ready   error
		path    string
		code    int
		updated bool
	}{
		{"not ready", notReady, "/healthz", http.StatusServiceUnavailable, false},
		{"ready", nil, "/healthz", http.StatusOK, true},
		{"livez", nil, "/livez", http.StatusOK, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			notReady = tc.ready
			rec := httptest.NewRecorder()
			health.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, tc.path, nil))
			var body struct {
				LastUpdated, CurrentTime string
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
				t.Fatalf("body %q: %v", rec.Body, err)
			}
			if rec.Code != tc.code || (body.LastUpdated != "") != tc.updated || body.CurrentTime == "" {
				t.Fatalf("got %d %+v, want %d with lastUpdated %v", rec.Code, body, tc.code, tc.updated)
			}
		})
	}
	rec := httptest.NewRecorder()
	status.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/proxyMode", nil))
	if rec.Code != http.StatusOK || rec.Body.String() != "kurma" {
		t.Fatalf("/proxyMode: %d %q", rec.Code, rec.Body)
	}
}
