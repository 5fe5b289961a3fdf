package api

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestMetricsAndHealth: /healthz answers without metrics; with a registry,
// /metrics counts requests by route and code, and errors apart.
func TestMetricsAndHealth(t *testing.T) {
	for _, withMetrics := range []bool{false, true} {
		opts := Options{Pods: newFakeManager(), Images: &fakeStore{}, Version: "test"}
		if withMetrics {
			opts.Metrics = prometheus.NewRegistry()
		}
		c, sock, _ := serve(t, opts)
		hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		}}}
		get := func(path string) (int, string) {
			resp, err := hc.Get("http://kurmad" + path)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, string(b)
		}
		if code, body := get("/healthz"); code != 200 || body != "ok\n" {
			t.Errorf("metrics %v: /healthz %d %q", withMetrics, code, body)
		}
		if _, err := c.GetPod(t.Context(), "kapi-none"); err == nil {
			t.Fatal("GetPod of a missing pod succeeded")
		}
		code, body := get("/metrics")
		if !withMetrics {
			if code != 404 {
				t.Errorf("/metrics without a registry: %d", code)
			}
			continue
		}
		for _, want := range []string{
			`kurma_api_request_duration_seconds_count{code="200",route="GET /healthz"} 1`,
			`kurma_api_request_duration_seconds_count{code="404",route="GET /v1/pods/{ref}"} 1`,
			`kurma_api_errors_total{code="404",route="GET /v1/pods/{ref}"} 1`,
		} {
			if !strings.Contains(body, want) {
				t.Errorf("/metrics lacks %s:\n%s", want, body)
			}
		}
	}
}
