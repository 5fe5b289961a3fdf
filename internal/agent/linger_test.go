package agent

import (
	"log/slog"
	"net"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"kurma.dev/kurma/internal/agent/nettest"
	"kurma.dev/kurma/internal/testutil"
	"kurma.dev/kurma/pkg/controllerapi"
)

// TestVPCLinger: a VPC outlives its last local port by Config.VPCLinger,
// so the next port plugs into the existing bridge; resyncs during the
// linger do not remove it early; after the linger it goes.
func TestVPCLinger(t *testing.T) {
	const linger = 1500 * time.Millisecond
	ctx := t.Context()
	dp, hostNS := newTestDatapath(t)
	ns1 := nettest.NewNS(t, testutil.UniqueName("kagt"))
	ns2 := nettest.NewNS(t, testutil.UniqueName("kagt"))
	port := func(id, ns, mac, ip string, rev int64) controllerapi.Port {
		return controllerapi.Port{ID: id, ProjectID: "proj", BindingHostID: "h1", VNI: 5, NetworkNS: ns, MACAddress: mac,
			Status: controllerapi.StatusPending, RevisionNumber: rev,
			FixedIPs: []controllerapi.FixedIP{{SubnetID: "s", IPAddress: ip, CIDR: "10.5.0.0/24", GatewayIP: "10.5.0.1"}}}
	}
	p1 := port("p1", ns1, "02:00:00:00:05:05", "10.5.0.5", 1)
	fc := &fakeController{statuses: map[string][]string{}, live: make(chan controllerapi.Event, 4),
		hosts: []controllerapi.Host{{ID: "h1", UnderlayIP: "192.0.2.1"}, {ID: "h2", UnderlayIP: "192.0.2.2"}}, ports: []controllerapi.Port{p1}}
	a, err := New(Config{HostID: "h1", UnderlayIP: net.ParseIP("192.0.2.1"), Controller: fc, Datapath: dp,
		Resync: time.Hour, BackoffBase: 10 * time.Millisecond, BackoffMax: 100 * time.Millisecond,
		VPCLinger: linger, Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		t.Fatal(err)
	}
	runAgent(ctx, t, a)

	until := func(t *testing.T, what string, f func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !f() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	vpcs := func() []uint32 { v, _ := dp.ListVPCs(ctx); return v }
	ports := func() int { p, _ := dp.ListPorts(ctx); return len(p) }
	up := func(id string) func() bool {
		return func() bool { s := fc.status(id); return len(s) > 0 && s[len(s)-1] == controllerapi.StatusUp }
	}
	// send hands the agent a live event and mirrors it in the fake's list.
	send := func(typ string, p controllerapi.Port) {
		fc.mu.Lock()
		fc.ports = slices.DeleteFunc(fc.ports, func(q controllerapi.Port) bool { return q.ID == p.ID })
		if typ != controllerapi.EventDeleted {
			fc.ports = append(fc.ports, p)
		}
		fc.mu.Unlock()
		fc.live <- controllerapi.Event{Type: typ, Revision: p.RevisionNumber, Port: &p}
	}

	until(t, "p1 UP", up("p1"))
	t.Run("vpc kept after its last port goes", func(t *testing.T) {
		p := p1
		p.RevisionNumber = 10
		send(controllerapi.EventDeleted, p)
		gone := time.Now()
		until(t, "p1 unplugged", func() bool { return ports() == 0 })
		// A remote port appears while the VPC lingers without local ports.
		r := port("r1", "/run/netns/elsewhere", "02:00:00:00:05:09", "10.5.0.9", 10)
		r.BindingHostID = "h2"
		send(controllerapi.EventAdded, r)
		// A resync during the linger finds the empty VPC: it stays.
		time.Sleep(linger / 4)
		a.resync(ctx)
		time.Sleep(linger / 4)
		if time.Since(gone) < linger && !slices.Equal(vpcs(), []uint32{5}) {
			t.Fatalf("vpc removed %v after its last port, linger is %v", time.Since(gone), linger)
		}
	})
	t.Run("next port reuses it and restarts the linger", func(t *testing.T) {
		send(controllerapi.EventAdded, port("p2", ns2, "02:00:00:00:05:06", "10.5.0.6", 11))
		until(t, "p2 UP", up("p2"))
		// The remote that came during the linger is programmed with the
		// plug, not only when the linger's timer fires (there is no
		// periodic resync in this test).
		fdb := func() bool {
			out := testutil.Run(t, "bridge", "-n", nettest.Name(hostNS), "fdb", "show", "dev", "kagtv000005")
			return strings.Contains(out, "02:00:00:00:05:09 dst 192.0.2.2")
		}
		deadline := time.Now().Add(300 * time.Millisecond)
		for !fdb() {
			if time.Now().After(deadline) {
				t.Fatal("remote r1 not programmed 300ms after p2 was plugged")
			}
			time.Sleep(10 * time.Millisecond)
		}
		time.Sleep(linger) // past the first linger: p2 keeps the VPC
		if !slices.Equal(vpcs(), []uint32{5}) {
			t.Fatalf("vpcs %v while p2 uses vni 5", vpcs())
		}
		if links := nettest.Links(t, ns2); !slices.Contains(links, "eth0") {
			t.Fatalf("p2 not plugged: %v", links)
		}
	})
	t.Run("removed after the linger", func(t *testing.T) {
		p := port("p2", ns2, "02:00:00:00:05:06", "10.5.0.6", 12)
		send(controllerapi.EventDeleted, p)
		gone := time.Now()
		until(t, "vpc removal", func() bool { return len(vpcs()) == 0 })
		if d := time.Since(gone); d < linger-50*time.Millisecond {
			t.Fatalf("vpc removed after %v, linger is %v", d, linger)
		}
	})
}
