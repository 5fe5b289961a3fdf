package core

import (
	"context"
	"testing"
	"time"

	capi "kurma.dev/kurma/pkg/controllerapi"
	"kurma.dev/kurma/pkg/kerrors"
)

func TestHosts(t *testing.T) {
	c := testCore(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		h    capi.Host
		want error
	}{
		{"ok", capi.Host{ID: "h1", UnderlayIP: "192.0.2.1"}, nil},
		{"bad address", capi.Host{ID: "h2", UnderlayIP: "host"}, kerrors.Invalid},
		{"bad id", capi.Host{ID: "h/2", UnderlayIP: "192.0.2.2"}, kerrors.Invalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.PutHost(ctx, tc.h)
			wantKind(t, "PutHost", err, tc.want)
		})
	}
	first := must[capi.Host](t)(c.GetHost(ctx, "h1"))
	again := must[capi.Host](t)(c.PutHost(ctx, capi.Host{ID: "h1", UnderlayIP: "192.0.2.9"}))
	if !again.CreatedAt.Equal(first.CreatedAt) || again.UnderlayIP != "192.0.2.9" {
		t.Fatalf("refresh: %+v, first %+v", again, first)
	}
	if hs := must[[]capi.Host](t)(c.ListHosts(ctx)); len(hs) != 1 {
		t.Fatalf("hosts %+v", hs)
	}
	wantKind(t, "delete", c.DeleteHost(ctx, "h1"), nil)
	wantKind(t, "delete again", c.DeleteHost(ctx, "h1"), kerrors.NotFound)
	_, err := c.GetHost(ctx, "h1")
	wantKind(t, "get deleted", err, kerrors.NotFound)
}

// TestWaitPort: a long poll returns at the agent's report (woken by the
// change feed, not by its deadline), and a port still PENDING at the
// deadline as it is.
func TestWaitPort(t *testing.T) {
	c := testCore(t)
	ctx, cancel := context.WithCancel(context.Background())
	feed := make(chan struct{})
	go func() { c.Run(ctx); close(feed) }()
	t.Cleanup(func() { cancel(); <-feed })
	network(t, c)
	must[[]capi.Port](t)(c.CreatePorts(ctx, "p", []capi.Port{{ID: "a", NetworkID: "s"}}))
	p := must[capi.Port](t)(c.WaitPort(ctx, "p", "a", "", 50*time.Millisecond))
	if p.Status != capi.StatusPending {
		t.Fatalf("status %q at the deadline", p.Status)
	}
	got := make(chan capi.Port, 1)
	start := time.Now()
	go func() {
		p, err := c.WaitPort(ctx, "p", "a", capi.StatusUp, time.Minute)
		if err != nil {
			t.Error(err)
		}
		got <- p
	}()
	// The report may come before the waiter registers: it then reads UP
	// at once; after, the change feed wakes it.
	must[capi.Port](t)(c.SetPortStatus(ctx, "p", "a", capi.PortStatusUpdate{Status: capi.StatusUp}))
	select {
	case p := <-got:
		if p.Status != capi.StatusUp || time.Since(start) > 30*time.Second {
			t.Fatalf("WaitPort: %+v after %v", p, time.Since(start))
		}
	case <-time.After(30 * time.Second):
		t.Fatal("WaitPort not woken by the report")
	}
	_, err := c.WaitPort(ctx, "p", "zz", "", time.Millisecond)
	wantKind(t, "missing port", err, kerrors.NotFound)
}

// TestWatchPeersJoin: a peers watch of a host learns the other ports of a
// VPC when the host's first port in it appears, and later ports of that
// VPC as they come.
func TestWatchPeersJoin(t *testing.T) {
	c := testCore(t)
	ctx := context.Background()
	network(t, c)
	must[[]capi.Port](t)(c.CreatePorts(ctx, "p", []capi.Port{{ID: "remote", NetworkID: "s", BindingHostID: "h1"}}))
	w := watchHost(t, c, "h3")
	must[[]capi.Port](t)(c.CreatePorts(ctx, "p", []capi.Port{{ID: "local", NetworkID: "s", BindingHostID: "h3"}}))
	for _, want := range []string{"local", "remote"} {
		if e := next(t, w); e.Port.ID != want || e.Type != capi.EventAdded {
			t.Fatalf("event %s %+v, want ADDED %s", e.Type, e.Port, want)
		}
	}
	must[[]capi.Port](t)(c.CreatePorts(ctx, "p", []capi.Port{{ID: "remote2", NetworkID: "s", BindingHostID: "h2"}}))
	if e := next(t, w); e.Port.ID != "remote2" {
		t.Fatalf("event %+v, want remote2", e.Port)
	}
}
