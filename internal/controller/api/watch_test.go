package api_test

import (
	"context"
	"errors"
	"iter"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"kurma.dev/kurma/internal/controller/store/boltstore"
	capi "kurma.dev/kurma/pkg/controllerapi"
)

// next pulls one event with a deadline.
func next(t *testing.T, pull func() (capi.Event, error, bool)) capi.Event {
	t.Helper()
	type res struct {
		ev  capi.Event
		err error
		ok  bool
	}
	ch := make(chan res, 1)
	go func() { ev, err, ok := pull(); ch <- res{ev, err, ok} }()
	select {
	case r := <-ch:
		if !r.ok || r.err != nil {
			t.Fatalf("watch ended: %v", r.err)
		}
		return r.ev
	case <-time.After(10 * time.Second):
		t.Fatal("timed out waiting for a watch event")
	}
	return capi.Event{}
}

func TestWatchPorts(t *testing.T) {
	e := newEnv(t, "")
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	for _, p := range []capi.Port{{ID: "a", NetworkID: "s1", BindingHostID: "h1"}, {ID: "b", NetworkID: "s1", BindingHostID: "h2"}} {
		if _, err := e.cli.CreatePort(ctx, "p1", p); err != nil {
			t.Fatal(err)
		}
	}
	// Agent on h1: replay, SYNCED, then live events for h1 only.
	pull, stop := iter.Pull2(e.cli.WatchPorts(ctx, 0, "h1"))
	defer stop()
	ev := next(t, pull)
	if ev.Type != capi.EventAdded || ev.Port == nil || ev.Port.ID != "a" {
		t.Fatalf("replay = %+v", ev)
	}
	synced := next(t, pull)
	if synced.Type != capi.EventSynced || synced.Revision == 0 {
		t.Fatalf("want SYNCED, got %+v", synced)
	}
	if _, err := e.cli.CreatePort(ctx, "p1", capi.Port{ID: "c", NetworkID: "s1", BindingHostID: "h2"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.cli.SetPortStatus(ctx, "p1", "a", capi.StatusUp, ""); err != nil {
		t.Fatal(err)
	}
	ev = next(t, pull)
	if ev.Type != capi.EventModified || ev.Port.ID != "a" || ev.Port.Status != capi.StatusUp || ev.Revision <= synced.Revision {
		t.Fatalf("status event = %+v", ev)
	}
	if err := e.cli.DeletePort(ctx, "p1", "a"); err != nil {
		t.Fatal(err)
	}
	del := next(t, pull)
	if del.Type != capi.EventDeleted || del.Port.ID != "a" {
		t.Fatalf("delete event = %+v", del)
	}
	stop()

	// Resume from the SYNCED revision without a host filter: c's ADDED, a's
	// MODIFIED and DELETED, in order.
	pull2, stop2 := iter.Pull2(e.cli.WatchPorts(ctx, synced.Revision, ""))
	defer stop2()
	var got []string
	for range 3 {
		ev := next(t, pull2)
		got = append(got, ev.Type+":"+ev.Port.ID)
	}
	if strings.Join(got, " ") != "ADDED:c MODIFIED:a DELETED:a" {
		t.Fatalf("resumed events = %v", got)
	}
}

func TestWatchCompactedIsGone(t *testing.T) {
	st, err := boltstore.Open(filepath.Join(t.TempDir(), "w.db"), boltstore.Options{NoSync: true, History: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	e := newServer(t, st, "")
	e.setup(t, "")
	for range 20 {
		if _, err := e.cli.CreatePort(t.Context(), "p1", capi.Port{NetworkID: "s1"}); err != nil {
			t.Fatal(err)
		}
	}
	code, body := raw(t, "GET", e.url+"/watch/ports?since=1", "")
	if code != http.StatusGone || errType(body) != "Gone" {
		t.Fatalf("compacted watch = %d %s", code, body)
	}
	for _, err := range e.cli.WatchPorts(t.Context(), 1, "") {
		if !errors.Is(err, capi.ErrCompacted) {
			t.Fatalf("client error = %v, want ErrCompacted", err)
		}
		break
	}
}

func TestHostsAndWatch(t *testing.T) {
	e := newServer(t, boltStore(t), "")
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	h, err := e.cli.RegisterHost(ctx, capi.Host{ID: "node1", UnderlayIP: "192.0.2.10"})
	if err != nil || h.RevisionNumber == 0 {
		t.Fatalf("RegisterHost = %+v, %v", h, err)
	}
	pull, stop := iter.Pull2(e.cli.WatchHosts(ctx, 0))
	defer stop()
	if ev := next(t, pull); ev.Type != capi.EventAdded || ev.Host.ID != "node1" {
		t.Fatalf("replay = %+v", ev)
	}
	if ev := next(t, pull); ev.Type != capi.EventSynced {
		t.Fatalf("want SYNCED, got %+v", ev)
	}
	h2, err := e.cli.RegisterHost(ctx, capi.Host{ID: "node1", UnderlayIP: "192.0.2.11"})
	if err != nil || !h2.CreatedAt.Equal(h.CreatedAt) {
		t.Fatalf("refresh = %+v, %v", h2, err)
	}
	if ev := next(t, pull); ev.Type != capi.EventModified || ev.Host.UnderlayIP != "192.0.2.11" {
		t.Fatalf("modified = %+v", ev)
	}
	hs, err := e.cli.ListHosts(ctx)
	if err != nil || len(hs) != 1 {
		t.Fatalf("ListHosts = %+v, %v", hs, err)
	}
	if err := e.cli.DeleteHost(ctx, "node1"); err != nil {
		t.Fatal(err)
	}
	if ev := next(t, pull); ev.Type != capi.EventDeleted || ev.Host.ID != "node1" {
		t.Fatalf("deleted = %+v", ev)
	}
	if _, err := e.cli.GetHost(ctx, "node1"); err == nil {
		t.Fatal("deleted host still readable")
	}
}

// TestWatchHostPorts checks the vpc_peers filter: an agent gets its own
// ports and those of the VPCs it has ports in, nothing of other VPCs; a
// VPC that appears on the host later is listed at that point, and one the
// host leaves stops sending events.
func TestWatchHostPorts(t *testing.T) {
	e := newEnv(t, "")
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	if _, err := e.cli.CreateVPC(ctx, "p1", capi.VPC{ID: "v2"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.cli.CreateSubnet(ctx, "p1", capi.Subnet{ID: "s2", NetworkID: "v2", CIDR: "10.30.0.0/24"}); err != nil {
		t.Fatal(err)
	}
	create := func(id, sub, host string) {
		t.Helper()
		if _, err := e.cli.CreatePort(ctx, "p1", capi.Port{ID: id, NetworkID: sub, BindingHostID: host}); err != nil {
			t.Fatal(err)
		}
	}
	create("mine", "s1", "h1")
	create("peer", "s1", "h2")
	create("other", "s2", "h2")
	create("other2", "s2", "h3")

	pull, stop := iter.Pull2(e.cli.WatchHostPorts(ctx, "h1"))
	defer stop()
	var got []string
	for {
		ev := next(t, pull)
		if ev.Type == capi.EventSynced {
			break
		}
		got = append(got, ev.Type+":"+ev.Port.ID)
	}
	if strings.Join(got, " ") != "ADDED:mine ADDED:peer" {
		t.Fatalf("listing = %v, want mine and its VPC peer only", got)
	}
	// Live: a port of the unrelated VPC is not sent; the next event is
	// the peer VPC's new port.
	create("other3", "s2", "h2")
	create("peer2", "s1", "h3")
	if ev := next(t, pull); ev.Type != capi.EventAdded || ev.Port.ID != "peer2" {
		t.Fatalf("event = %s %+v, want ADDED peer2", ev.Type, ev.Port)
	}
	// A port on h1 in v2 brings v2's existing ports.
	create("mine2", "s2", "h1")
	got = nil
	for range 4 {
		ev := next(t, pull)
		got = append(got, ev.Type+":"+ev.Port.ID)
	}
	if strings.Join(got, " ") != "ADDED:mine2 ADDED:other ADDED:other2 ADDED:other3" {
		t.Fatalf("joining v2 = %v", got)
	}
	// Leaving v2 again: its events stop after mine2's DELETED.
	if err := e.cli.DeletePort(ctx, "p1", "mine2"); err != nil {
		t.Fatal(err)
	}
	if ev := next(t, pull); ev.Type != capi.EventDeleted || ev.Port.ID != "mine2" {
		t.Fatalf("event = %s %+v, want DELETED mine2", ev.Type, ev.Port)
	}
	if err := e.cli.DeletePort(ctx, "p1", "other"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.cli.SetPortStatus(ctx, "p1", "peer", capi.StatusUp, ""); err != nil {
		t.Fatal(err)
	}
	if ev := next(t, pull); ev.Type != capi.EventModified || ev.Port.ID != "peer" {
		t.Fatalf("event = %s %+v, want MODIFIED peer (nothing of v2)", ev.Type, ev.Port)
	}
}

func TestWatchHostPortsBadQuery(t *testing.T) {
	e := newEnv(t, "")
	tests := []struct{ name, query string }{
		{"peers without host", "since=0&vpc_peers=true"},
		{"peers resuming", "since=3&binding:host_id=h1&vpc_peers=true"},
		{"peers not a bool", "since=0&binding:host_id=h1&vpc_peers=yes"},
		{"host watch with peers", "hosts"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			u := e.url + "/watch/ports?" + tc.query
			if tc.query == "hosts" {
				u = e.url + "/watch/hosts?vpc_peers=true"
			}
			code, body := raw(t, "GET", u, "")
			if code != http.StatusBadRequest {
				t.Fatalf("%s = %d %s, want 400", tc.query, code, body)
			}
		})
	}
}
