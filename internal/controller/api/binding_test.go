package api_test

import (
	"errors"
	"net/http"
	"testing"

	capi "kurma.dev/kurma/pkg/controllerapi"
	"kurma.dev/kurma/pkg/kerrors"
)

// TestPortBinding: PUT .../binding rebinds a port keeping its address and
// MAC; bad bodies and unknown ports get the documented errors.
func TestPortBinding(t *testing.T) {
	e := newEnv(t, "")
	ctx := t.Context()
	p, err := e.cli.CreatePort(ctx, e.pid, capi.Port{ID: "a", NetworkID: "s1", BindingHostID: "h1"})
	if err != nil {
		t.Fatal(err)
	}
	got, err := e.cli.SetPortBinding(ctx, e.pid, "a", "h2")
	if err != nil {
		t.Fatal(err)
	}
	if got.BindingHostID != "h2" || got.MACAddress != p.MACAddress || got.FixedIPs[0].IPAddress != p.FixedIPs[0].IPAddress ||
		got.Status != capi.StatusPending {
		t.Fatalf("rebound %+v, was %+v", got, p)
	}
	if _, err := e.cli.SetPortBinding(ctx, e.pid, "zz", "h2"); !errors.Is(err, kerrors.NotFound) {
		t.Fatalf("missing port: %v", err)
	}
	for _, tc := range []struct{ body string }{
		{`{"binding:host_id":"a/b"}`},
		{`{"binding:host_id":"h3","extra":1}`},
		{`not json`},
	} {
		code, body := raw(t, http.MethodPut, e.url+"/project/p1/ports/a/binding", tc.body)
		if code != http.StatusBadRequest {
			t.Fatalf("PUT %s: %d %s, want 400", tc.body, code, body)
		}
	}
}
