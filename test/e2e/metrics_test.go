package e2e

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"kurma.dev/kurma/internal/testutil"
)

// TestDaemonMetrics: kurmad answers /healthz and /metrics on its socket,
// with the pod start's phases, the starts by result, the API's requests and
// errors.
func TestDaemonMetrics(t *testing.T) {
	testutil.RequireRoot(t)
	if testing.Short() {
		t.Skip("end-to-end")
	}
	b := findBins(t)
	src := serveBusybox(t)
	d := startDaemon(t, b)
	d.ok(t, "run", "--rm", src.aci, "true")
	d.kurma("run", "--rm", src.aci, "/bin/kapi-nope")

	c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var dl net.Dialer
		return dl.DialContext(ctx, "unix", d.sock)
	}}}
	get := func(path string) string {
		resp, err := c.Get("http://kurmad" + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			t.Fatalf("GET %s: %d %s", path, resp.StatusCode, body)
		}
		return string(body)
	}
	if h := get("/healthz"); h != "ok\n" {
		t.Errorf("/healthz: %q", h)
	}
	m := get("/metrics")
	for _, want := range []string{
		`kurma_pod_start_step_duration_seconds_count{result="ok",step="ready"}`,
		`kurma_pod_start_step_duration_seconds_count{result="ok",step="total"}`,
		`kurma_pod_start_step_duration_seconds_count{result="error",step="ready"}`,
		`kurma_pod_starts_total{result="ok"}`,
		`kurma_pod_starts_total{result="error"}`,
		`kurma_api_request_duration_seconds_count{code="200",route="GET /v1/version"}`,
		`kurma_api_errors_total{code="400",route="POST /v1/pods"}`,
		"kurma_pods ",
	} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if t.Failed() {
		t.Logf("/metrics:\n%s", m)
	}
}
