package agent

import (
	"context"
	"log/slog"
	"net"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"kurma.dev/kurma/internal/agent/datapath"
	"kurma.dev/kurma/internal/agent/nettest"
	"kurma.dev/kurma/internal/testutil"
	"kurma.dev/kurma/pkg/controllerapi"
)

// gatedEnsures is a real datapath whose EnsureVPC calls wait at a gate
// until the test opens it, counted from their start to their end, and
// that keeps the gateways of the last one to finish.
type gatedEnsures struct {
	datapath.Interface
	*gate

	mu   sync.Mutex
	last []string
}

func (g *gatedEnsures) EnsureVPC(ctx context.Context, v datapath.VPCSpec) error {
	g.enter(ctx)
	defer g.leave()
	err := g.Interface.EnsureVPC(ctx, v)
	g.mu.Lock()
	defer g.mu.Unlock()
	g.last = nil
	for _, gw := range v.Gateways {
		g.last = append(g.last, gw.String())
	}
	return err
}

// TestEnsuresTakeTurns: a VPC sync's ensure of a VPC waits for a plug's
// ensure of the same VPC in flight (and the other way round), so that
// what the agent records as the VPC's gateways is what the last
// EnsureVPC programmed. Before, only plugs took the VPC's ensure lock: a
// sync's EnsureVPC ran beside a plug's.
func TestEnsuresTakeTurns(t *testing.T) {
	ctx := t.Context()
	dp, _ := newTestDatapath(t)
	g := &gatedEnsures{Interface: dp, gate: newGate()}
	fc := &fakeController{statuses: map[string][]string{}, live: make(chan controllerapi.Event, 4),
		hosts: []controllerapi.Host{{ID: "h1", UnderlayIP: "192.0.2.1"}}}
	fc.ports = append(fc.ports, controllerapi.Port{ID: "p0", ProjectID: "proj", BindingHostID: "h1", VNI: 9,
		MACAddress: "02:00:00:00:09:02", Status: controllerapi.StatusPending, RevisionNumber: 1,
		FixedIPs: []controllerapi.FixedIP{{SubnetID: "s", IPAddress: "10.9.0.2", CIDR: "10.9.0.0/24", GatewayIP: "10.9.0.1"}}})
	wants := make(chan uint32, 8)
	a, err := New(Config{HostID: "h1", UnderlayIP: net.ParseIP("192.0.2.1"), Controller: fc, Datapath: g, LocalAttach: true,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		hooks:  hooks{ensureWants: func(vni uint32) { wants <- vni }}})
	if err != nil {
		t.Fatal(err)
	}
	runAgent(ctx, t, a)
	<-a.Synced()
	wantEnsure := func(what string) {
		t.Helper()
		select {
		case vni := <-wants:
			if vni != 9 {
				t.Fatalf("%s: ensure of VPC %d, want 9", what, vni)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: no ensure of VPC 9 within 10s", what)
		}
	}

	actx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	ns := nettest.NewNS(t, testutil.UniqueName("kagt"))
	attached := make(chan error, 1)
	go func() {
		_, err := a.Attach(actx, "p0", Attachment{NetNS: ns, IfName: "eth0"})
		attached <- err
	}()
	wantEnsure("the plug")
	// The plug's EnsureVPC is at the gate.
	g.waitFor(t, 1)
	// A sync of the VPC now: the port is local (its namespace is
	// known), so the sync ensures the VPC too, and must wait.
	a.q.Add(vpcKey(9))
	wantEnsure("the sync")
	// With turns, nothing more comes to the gate now. Without them the
	// sync's EnsureVPC comes within microseconds of asking (nothing
	// between the two blocks): 200 ms is ample for it to show, and no
	// wait can make the turns fail.
	for grace := time.After(200 * time.Millisecond); ; {
		n, ch := g.watch()
		if n != 1 {
			t.Fatalf("%d EnsureVPC of one VPC at once after the sync asked for its turn, want 1", n)
		}
		select {
		case <-ch:
			continue
		case <-grace:
		}
		break
	}
	close(g.open)
	if err := <-attached; err != nil {
		t.Fatal(err)
	}
	// The sync's turn ends once the VPC is ready again; then compare.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		n, _ := g.counts()
		a.vpcs.mu.Lock()
		ready := a.vpcs.ready[9]
		a.vpcs.mu.Unlock()
		if n == 0 && ready && a.q.Idle() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the VPC sync did not end")
		}
	}
	_, most := g.counts()
	g.mu.Lock()
	last := slices.Clone(g.last)
	g.mu.Unlock()
	if most != 1 {
		t.Fatalf("at most %d EnsureVPC of one VPC ran at once, want 1", most)
	}
	a.vpcs.mu.Lock()
	var recorded []string
	for gw := range a.vpcs.gateways[9] {
		recorded = append(recorded, gw)
	}
	a.vpcs.mu.Unlock()
	slices.Sort(recorded)
	slices.Sort(last)
	if !slices.Equal(recorded, last) {
		t.Fatalf("the agent records gateways %v for VPC 9, the last EnsureVPC programmed %v", recorded, last)
	}
}
