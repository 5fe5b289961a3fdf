package agent

import (
	"log/slog"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"kurma.dev/kurma/internal/agent/nettest"
	"kurma.dev/kurma/internal/testutil"
	"kurma.dev/kurma/pkg/controllerapi"
)

// TestVPCLinger: a VPC outlives its last local port by Config.VPCLinger,
// so the next port plugs into the existing bridge; resyncs during the
// linger do not remove it early; after the linger it goes.
//
// The linger runs on a clock the test moves (hooks.now), and its real
// timer is an hour, which never fires here: every sync of the VPC is one
// the test queued, and once the queue is idle whatever it would do is
// done. The test never sleeps to show that the VPC stays.
func TestVPCLinger(t *testing.T) {
	const linger = time.Hour
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

	start := time.Now()
	var elapsed atomic.Int64 // the test's clock: start + elapsed
	advance := func(d time.Duration) { elapsed.Add(int64(d)) }
	var (
		mu     sync.Mutex
		lefts  []time.Duration // what syncVPC decided on VPC 5 without local ports, in order
		others []uint32
	)
	a, err := New(Config{HostID: "h1", UnderlayIP: net.ParseIP("192.0.2.1"), Controller: fc, Datapath: dp,
		Resync: time.Hour, BackoffBase: 10 * time.Millisecond, BackoffMax: 100 * time.Millisecond,
		VPCLinger: linger, Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		hooks: hooks{
			now: func() time.Time { return start.Add(time.Duration(elapsed.Load())) },
			lingered: func(vni uint32, left time.Duration) {
				mu.Lock()
				defer mu.Unlock()
				if vni != 5 {
					others = append(others, vni)
					return
				}
				lefts = append(lefts, left)
			},
		}})
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
			time.Sleep(5 * time.Millisecond)
		}
	}
	// take returns the decisions on empty VPCs made since the last take.
	take := func(t *testing.T) []time.Duration {
		t.Helper()
		mu.Lock()
		defer mu.Unlock()
		if len(others) > 0 {
			t.Fatalf("linger decisions on VPCs %v, only 5 exists", others)
		}
		out := lefts
		lefts = nil
		return out
	}
	// after runs do once the agent's queue is idle (what came before is
	// done and its decisions taken) and returns the decisions that what
	// do queued made, once they are all done.
	after := func(t *testing.T, do func()) []time.Duration {
		t.Helper()
		until(t, "an idle queue", a.q.Idle)
		take(t)
		do()
		until(t, "an idle queue", a.q.Idle)
		return take(t)
	}
	// kept fails unless the VPC is there and every decision kept it
	// for left more (there is at least one).
	vpcs := func() []uint32 { v, _ := dp.ListVPCs(ctx); return v }
	kept := func(t *testing.T, got []time.Duration, left time.Duration) {
		t.Helper()
		if len(got) == 0 || slices.ContainsFunc(got, func(d time.Duration) bool { return d != left }) {
			t.Fatalf("linger decisions %v, want the VPC kept for %v more", got, left)
		}
		if v := vpcs(); !slices.Equal(v, []uint32{5}) {
			t.Fatalf("vpcs %v during the linger, want [5]", v)
		}
	}
	queueVPC := func() { a.q.Add(vpcKey(5)) } // what the linger's timer does when it fires
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
		kept(t, after(t, func() {
			send(controllerapi.EventDeleted, p)
			until(t, "p1 unplugged", func() bool { return ports() == 0 })
		}), linger)
		// Half way through the linger a remote port appears (its event
		// queues a sync of the VPC) and a resync finds the empty VPC:
		// it stays, and the linger still counts from p1's leaving.
		advance(linger / 2)
		r := port("r1", "/run/netns/elsewhere", "02:00:00:00:05:09", "10.5.0.9", 10)
		r.BindingHostID = "h2"
		kept(t, after(t, func() {
			send(controllerapi.EventAdded, r)
			until(t, "r1 in the agent's cache", func() bool { _, ok := a.ports.get("r1"); return ok })
			a.resync(ctx)
		}), linger/2)
	})
	t.Run("next port reuses it and restarts the linger", func(t *testing.T) {
		after(t, func() {
			send(controllerapi.EventAdded, port("p2", ns2, "02:00:00:00:05:06", "10.5.0.6", 11))
			until(t, "p2 UP", up("p2"))
		})
		// The remote that came during the linger is programmed with the
		// plug (which queued the VPC's sync before reporting UP), not
		// when the linger's timer fires: it has not.
		out := testutil.Run(t, "bridge", "-n", nettest.Name(hostNS), "fdb", "show", "dev", "kagtv000005")
		if !strings.Contains(out, "02:00:00:00:05:09 dst 192.0.2.2") {
			t.Fatalf("remote r1 not programmed once p2 was plugged and the queue idle:\n%s", out)
		}
		// The first linger's timer fires past its end: p2 keeps the VPC.
		advance(linger)
		if got := after(t, queueVPC); len(got) > 0 {
			t.Fatalf("linger decisions %v while p2 uses vni 5", got)
		}
		if v := vpcs(); !slices.Equal(v, []uint32{5}) {
			t.Fatalf("vpcs %v while p2 uses vni 5", v)
		}
		if links := nettest.Links(t, ns2); !slices.Contains(links, "eth0") {
			t.Fatalf("p2 not plugged: %v", links)
		}
	})
	t.Run("removed after the linger", func(t *testing.T) {
		p := port("p2", ns2, "02:00:00:00:05:06", "10.5.0.6", 12)
		// The linger starts again from p2's leaving.
		kept(t, after(t, func() {
			send(controllerapi.EventDeleted, p)
			until(t, "p2 unplugged", func() bool { return ports() == 0 })
		}), linger)
		advance(linger - time.Millisecond)
		kept(t, after(t, queueVPC), time.Millisecond)
		advance(time.Millisecond)
		got := after(t, queueVPC)
		if len(got) != 1 || got[0] > 0 {
			t.Fatalf("linger decisions %v at the linger's end, want one removal", got)
		}
		if v := vpcs(); len(v) != 0 {
			t.Fatalf("vpcs %v after the linger", v)
		}
	})
}
