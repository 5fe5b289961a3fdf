package api_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"kurma.dev/kurma/internal/controller/api"
	"kurma.dev/kurma/internal/controller/store"
	"kurma.dev/kurma/internal/controller/store/boltstore"
	capi "kurma.dev/kurma/pkg/controllerapi"
)

type env struct {
	url    string
	cli    *capi.Client
	srv    *api.Server
	st     store.Store
	pid    string
	vpc    *capi.VPC
	subnet *capi.Subnet
}

// newServer serves an api.Server over st on a loopback HTTP server.
func newServer(t *testing.T, st store.Store, token string) *env {
	t.Helper()
	srv, err := api.New(api.Config{Store: st, Token: token})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { srv.Run(ctx); close(done) }()
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		hs.CloseClientConnections()
		hs.Close()
		cancel()
		<-done
	})
	cli, err := capi.New(hs.URL, capi.WithToken(token))
	if err != nil {
		t.Fatal(err)
	}
	return &env{url: hs.URL, cli: cli, srv: srv, st: st}
}

func boltStore(t *testing.T) store.Store {
	t.Helper()
	st, err := boltstore.Open(filepath.Join(t.TempDir(), "ctl.db"), boltstore.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	return st
}

// newEnv is a bbolt-backed server with project "p1", VPC "v1" and subnet
// "s1" (cidr, "" : 10.20.0.0/24).
func newEnv(t *testing.T, cidr string) *env {
	t.Helper()
	e := newServer(t, boltStore(t), "")
	e.setup(t, cidr)
	return e
}

func (e *env) setup(t *testing.T, cidr string) {
	t.Helper()
	if cidr == "" {
		cidr = "10.20.0.0/24"
	}
	ctx := t.Context()
	if _, err := e.cli.CreateProject(ctx, capi.Project{ID: "p1", Name: "one"}); err != nil {
		t.Fatal(err)
	}
	v, err := e.cli.CreateVPC(ctx, "p1", capi.VPC{ID: "v1", Name: "vpc"})
	if err != nil {
		t.Fatal(err)
	}
	sn, err := e.cli.CreateSubnet(ctx, "p1", capi.Subnet{ID: "s1", NetworkID: "v1", CIDR: cidr})
	if err != nil {
		t.Fatal(err)
	}
	e.pid, e.vpc, e.subnet = "p1", v, sn
}

// raw sends a request and returns status and body.
func raw(t *testing.T, method, url, body string, hdr ...string) (int, string) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(t.Context(), method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// errType extracts error.type from an error body ("" if none).
func errType(body string) string {
	var eb capi.ErrorBody
	_ = json.Unmarshal([]byte(body), &eb)
	return eb.Error.Type
}

func listAll(t *testing.T, e *env) []capi.Port {
	t.Helper()
	ps, err := e.cli.ListPorts(t.Context(), e.pid, capi.PortFilter{})
	if err != nil {
		t.Fatal(err)
	}
	return ps
}

func sleep() { time.Sleep(20 * time.Millisecond) }
