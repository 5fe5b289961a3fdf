package core

import (
	"context"
	"testing"
	"time"

	capi "kurma.dev/kurma/pkg/controllerapi"
	"kurma.dev/kurma/pkg/kerrors"
)

// chanSink hands a watch's events to the test.
type chanSink struct{ ch chan capi.Event }

func (s chanSink) Start()     {}
func (s chanSink) Flush()     {}
func (s chanSink) KeepAlive() {}
func (s chanSink) Send(e capi.Event) error {
	s.ch <- e
	return nil
}

// watchHost starts a port watch of host (with peers) until the test ends.
func watchHost(t *testing.T, c *Core, host string) <-chan capi.Event {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan capi.Event, 64)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := c.Watch(ctx, WatchRequest{Kind: WatchPorts, Host: host, Peers: true}, chanSink{ch}); err != nil {
			t.Errorf("watch %s: %v", host, err)
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return ch
}

// next returns the next event of a watch that is not SYNCED.
func next(t *testing.T, ch <-chan capi.Event) capi.Event {
	t.Helper()
	for {
		select {
		case e := <-ch:
			if e.Type != capi.EventSynced {
				return e
			}
		case <-time.After(10 * time.Second):
			t.Fatal("no watch event within 10s")
		}
	}
}

// TestSetPortBinding: a port bound to another host keeps its addresses
// and MAC, goes back to PENDING, moves in the host index, and the old
// host's watch sees it DELETED while the new host's sees it.
func TestSetPortBinding(t *testing.T) {
	c := testCore(t)
	ctx := context.Background()
	network(t, c)
	p := must[[]capi.Port](t)(c.CreatePorts(ctx, "p", []capi.Port{{ID: "a", NetworkID: "s", BindingHostID: "h1"}}))[0]
	must[capi.Port](t)(c.SetPortStatus(ctx, "p", "a", capi.PortStatusUpdate{Status: capi.StatusUp}))
	oldW, newW := watchHost(t, c, "h1"), watchHost(t, c, "h2")
	if e := next(t, oldW); e.Type != capi.EventAdded || e.Port.ID != "a" {
		t.Fatalf("h1's watch: %+v", e)
	}

	got := must[capi.Port](t)(c.SetPortBinding(ctx, "p", "a", capi.PortBindingUpdate{BindingHostID: "h2"}))
	if got.BindingHostID != "h2" || got.MACAddress != p.MACAddress || got.FixedIPs[0].IPAddress != p.FixedIPs[0].IPAddress ||
		got.Status != capi.StatusPending || got.RevisionNumber <= p.RevisionNumber {
		t.Fatalf("rebound port %+v (was %+v)", got, p)
	}
	if e := next(t, oldW); e.Type != capi.EventDeleted || e.Port.ID != "a" {
		t.Fatalf("h1's watch after the rebinding: %+v, want DELETED", e)
	}
	if e := next(t, newW); e.Port.ID != "a" || e.Port.BindingHostID != "h2" || e.Type == capi.EventDeleted {
		t.Fatalf("h2's watch: %+v", e)
	}
	for host, want := range map[string]int{"h1": 0, "h2": 1} {
		if ps := must[[]capi.Port](t)(c.ListPorts(ctx, "p", capi.PortFilter{HostID: host})); len(ps) != want {
			t.Fatalf("host %s has %d ports, want %d", host, len(ps), want)
		}
	}
	// The same binding again changes nothing.
	same := must[capi.Port](t)(c.SetPortBinding(ctx, "p", "a", capi.PortBindingUpdate{BindingHostID: "h2"}))
	if same.RevisionNumber != got.RevisionNumber {
		t.Fatalf("a no-op rebinding wrote: rev %d -> %d", got.RevisionNumber, same.RevisionNumber)
	}
	for _, tc := range []struct {
		name, id, host string
		want           error
	}{
		{"missing port", "zz", "h3", kerrors.NotFound},
		{"bad port id", "a/b", "h3", kerrors.Invalid},
		{"host with a slash", "a", "h/3", kerrors.Invalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.SetPortBinding(ctx, "p", tc.id, capi.PortBindingUpdate{BindingHostID: tc.host})
			wantKind(t, "SetPortBinding", err, tc.want)
		})
	}
	// A deleted rebound port leaves no index entry behind.
	wantKind(t, "delete", c.DeletePort(ctx, "p", "a"), nil)
	if ps := must[[]capi.Port](t)(c.ListPorts(ctx, "p", capi.PortFilter{HostID: "h2"})); len(ps) != 0 {
		t.Fatalf("host h2 still lists %d ports", len(ps))
	}
}
