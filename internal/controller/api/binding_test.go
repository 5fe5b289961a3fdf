package api_test

import (
	"errors"
	"iter"
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
	// h1's agent (a watch without peers) sees the port go.
	pull, stop := iter.Pull2(e.cli.WatchPorts(ctx, 0, "h1"))
	defer stop()
	if ev := next(t, pull); ev.Type != capi.EventAdded || ev.Port.ID != "a" {
		t.Fatalf("replay %+v", ev)
	}
	if ev := next(t, pull); ev.Type != capi.EventSynced {
		t.Fatalf("want SYNCED, got %+v", ev)
	}
	got, err := e.cli.SetPortBinding(ctx, e.pid, "a", "h2")
	if err != nil {
		t.Fatal(err)
	}
	if got.BindingHostID != "h2" || got.MACAddress != p.MACAddress || got.FixedIPs[0].IPAddress != p.FixedIPs[0].IPAddress ||
		got.Status != capi.StatusPending {
		t.Fatalf("rebound %+v, was %+v", got, p)
	}
	if ev := next(t, pull); ev.Type != capi.EventDeleted || ev.Port.ID != "a" {
		t.Fatalf("h1's watch after the rebinding: %+v, want DELETED", ev)
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
