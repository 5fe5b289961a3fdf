package agent

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"kurma.dev/kurma/internal/agent/datapath"
	"kurma.dev/kurma/internal/agent/nettest"
	"kurma.dev/kurma/internal/testutil"
	"kurma.dev/kurma/pkg/controllerapi"
)

// gate holds calls until the test opens it, counting how many are in at
// once (in) and at most (most); changed is closed and replaced whenever
// in changes, so that a test waits for a count without polling.
type gate struct {
	open chan struct{} // closed: calls pass

	mu      sync.Mutex
	in      int
	most    int
	changed chan struct{}
}

func newGate() *gate { return &gate{open: make(chan struct{}), changed: make(chan struct{})} }

// enter counts a call in and waits until the gate is open (or ctx ends).
func (g *gate) enter(ctx context.Context) {
	g.add(1)
	select {
	case <-g.open:
	case <-ctx.Done():
	}
}

// leave counts a call out.
func (g *gate) leave() { g.add(-1) }

func (g *gate) add(d int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.in += d
	g.most = max(g.most, g.in)
	close(g.changed)
	g.changed = make(chan struct{})
}

// counts returns how many calls are in, and at most were.
func (g *gate) counts() (in, most int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.in, g.most
}

// watch returns the number in and a channel closed at its next change.
func (g *gate) watch() (int, <-chan struct{}) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.in, g.changed
}

// waitFor waits until n calls are in at once.
func (g *gate) waitFor(t *testing.T, n int) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		in, ch := g.watch()
		if in >= n {
			return
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("%d calls at the gate at once, want %d", in, n)
		}
	}
}

// gatedPlugs is a real datapath whose plugs wait at a gate until the test
// opens it (counted while they wait): a plug that waits for the kernel's
// RTNL lock in a pod burst, made to wait as long as the test likes.
type gatedPlugs struct {
	datapath.Interface
	*gate
}

func (g *gatedPlugs) Plug(ctx context.Context, p datapath.PortSpec) error {
	g.enter(ctx)
	g.leave()
	return g.Interface.Plug(ctx, p)
}

// TestAttachWorkers: in Kubernetes mode the ADDs of a burst plug on
// Config.AttachWorkers workers of their own, so that as many plugs wait
// for the kernel at once, and no more. Before, one plug waited at a
// time: the second plug of a new VPC took the VPC's exclusive lock to
// ensure it, behind the first plug's shared hold, and every later plug
// queued behind that writer (and there were 4 workers whatever the
// setting).
func TestAttachWorkers(t *testing.T) {
	for _, tc := range []struct {
		name            string
		workers, attach int // Config.AttachWorkers (0: the default), Attach calls at once
		want            int // plugs waiting at once
	}{
		{name: "default", workers: 0, attach: 16, want: 16},
		{name: "three", workers: 3, attach: 6, want: 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			dp, _ := newTestDatapath(t)
			g := &gatedPlugs{Interface: dp, gate: newGate()}
			fc := &fakeController{statuses: map[string][]string{}, live: make(chan controllerapi.Event, 4),
				hosts: []controllerapi.Host{{ID: "h1", UnderlayIP: "192.0.2.1"}}}
			for i := range tc.attach {
				fc.ports = append(fc.ports, controllerapi.Port{ID: fmt.Sprintf("p%02d", i), ProjectID: "proj", BindingHostID: "h1", VNI: 9,
					MACAddress: fmt.Sprintf("02:00:00:00:09:%02x", i), Status: controllerapi.StatusPending, RevisionNumber: 1,
					FixedIPs: []controllerapi.FixedIP{{SubnetID: "s", IPAddress: fmt.Sprintf("10.9.0.%d", i+2), CIDR: "10.9.0.0/24", GatewayIP: "10.9.0.1"}}})
			}
			a, err := New(Config{HostID: "h1", UnderlayIP: net.ParseIP("192.0.2.1"), Controller: fc, Datapath: g, LocalAttach: true,
				AttachWorkers: tc.workers, Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
			if err != nil {
				t.Fatal(err)
			}
			// The ports' ids, read before the agent runs: its reports
			// write fc.ports.
			var ids []string
			for _, p := range fc.ports {
				ids = append(ids, p.ID)
			}
			runAgent(ctx, t, a)
			<-a.Synced()
			actx, cancel := context.WithTimeout(ctx, 20*time.Second)
			defer cancel()
			var wg sync.WaitGroup
			errs := make(chan error, tc.attach)
			for _, id := range ids {
				ns := nettest.NewNS(t, testutil.UniqueName("kagt"))
				wg.Go(func() {
					if _, err := a.Attach(actx, id, Attachment{NetNS: ns, IfName: "eth0"}); err != nil {
						errs <- fmt.Errorf("attach %s: %w", id, err)
					}
				})
			}
			g.waitFor(t, tc.want)
			// The plugs held at the gate are under way, and the ports
			// queued behind them wait for those workers: the CNI daemon
			// gives all their ADDs more time.
			plugging := func() (n int) {
				for _, id := range ids {
					if a.Plugging(id) {
						n++
					}
				}
				return n
			}
			// (The Attach calls behind the gate queue their ports in
			// their own time: wait for them.)
			for deadline := time.Now().Add(10 * time.Second); plugging() != tc.attach; time.Sleep(5 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("%d ports plugging while %d plugs wait at the gate and %d behind them, want %d",
						plugging(), tc.want, tc.attach-tc.want, tc.attach)
				}
			}
			close(g.open)
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			// (An urgent sync ends just after it tells its Attach.)
			for deadline := time.Now().Add(10 * time.Second); plugging() != 0; time.Sleep(5 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("%d ports plugging after every Attach returned", plugging())
				}
			}
			if _, most := g.counts(); most != tc.want {
				t.Fatalf("at most %d plugs waited at once, want %d", most, tc.want)
			}
		})
	}
}
