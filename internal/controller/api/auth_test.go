package api_test

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	capi "kurma.dev/kurma/pkg/controllerapi"
	"kurma.dev/kurma/pkg/kerrors"
)

func TestAuth(t *testing.T) {
	e := newServer(t, boltStore(t), "s3cret")
	tests := []struct {
		name, path string
		hdr        []string
		code       int
	}{
		{"no token", "/projects", nil, 401},
		{"wrong token", "/projects", []string{"Authorization", "Bearer nope"}, 401},
		{"wrong scheme", "/projects", []string{"Authorization", "Basic s3cret"}, 401},
		{"right token", "/projects", []string{"Authorization", "Bearer s3cret"}, 200},
		{"unknown path without token", "/nothing", nil, 401},
		{"metrics without token", "/metrics", nil, 401},
		{"watch without token", "/watch/ports?since=0", nil, 401},
		{"healthz is open", "/healthz", nil, 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, body := raw(t, "GET", e.url+tt.path, "", tt.hdr...)
			if code != tt.code {
				t.Fatalf("GET %s = %d %s, want %d", tt.path, code, body, tt.code)
			}
			if code == 401 && errType(body) != "Unauthorized" {
				t.Fatalf("401 body %s", body)
			}
		})
	}
	bad, _ := capi.New(e.url, capi.WithToken("wrong"))
	if _, err := bad.ListProjects(t.Context()); !errors.Is(err, kerrors.Unauthorized) {
		t.Fatalf("client with wrong token = %v", err)
	}
	if _, err := e.cli.CreateProject(t.Context(), capi.Project{ID: "p"}); err != nil {
		t.Fatalf("client with token: %v", err)
	}
}

func TestMetrics(t *testing.T) {
	e := newEnv(t, "")
	if _, err := e.cli.CreatePort(t.Context(), "p1", capi.Port{ID: "m", NetworkID: "s1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.cli.SetPortStatus(t.Context(), "p1", "m", capi.StatusUp, ""); err != nil {
		t.Fatal(err)
	}
	var body string
	for range 50 { // the gauge follows the change feed
		_, body = raw(t, "GET", e.url+"/metrics", "")
		if strings.Contains(body, `kurma_controller_ports{status="UP"} 1`) {
			break
		}
		sleep()
	}
	for _, want := range []string{
		`kurma_controller_request_duration_seconds_bucket{code="201",method="POST",route="ports"`,
		`kurma_controller_ports{status="UP"} 1`,
		`kurma_controller_ports{status="PENDING"} 0`,
		`kurma_controller_port_create_to_up_seconds_count 1`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	if t.Failed() {
		t.Log(body[:min(len(body), 3000)])
	}
	_ = http.StatusOK
}
