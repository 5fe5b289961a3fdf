package agent

import (
	"context"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"kurma.dev/kurma/internal/agent/datapath"
	"kurma.dev/kurma/pkg/controllerapi"
)

// countingDP is a datapath that only counts the operations the agent
// asks of it (the reconciler's decisions are pure logic; the real
// datapath's own counts are tested in internal/agent/datapath). It
// reports vanished ports through gone, as the real one's link events do.
type countingDP struct {
	mu      sync.Mutex // guards the fields below
	ops     map[string]int
	plugged map[string]bool
	vpcs    map[uint32]bool
	gone    func(string)
	bridge  int
}

func newCountingDP() *countingDP {
	return &countingDP{ops: map[string]int{}, plugged: map[string]bool{}, vpcs: map[uint32]bool{}, bridge: 10}
}

func (d *countingDP) op(name string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.ops[name]++
}

func (d *countingDP) count(name string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.ops[name]
}

func (d *countingDP) EnsureVPC(_ context.Context, v datapath.VPCSpec) error {
	d.op("EnsureVPC")
	d.mu.Lock()
	defer d.mu.Unlock()
	d.vpcs[v.VNI] = true
	return nil
}

func (d *countingDP) DeleteVPC(_ context.Context, vni uint32) error {
	d.op("DeleteVPC")
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.vpcs, vni)
	return nil
}

func (d *countingDP) ListVPCs(context.Context) ([]uint32, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []uint32
	for v := range d.vpcs {
		out = append(out, v)
	}
	return out, nil
}

func (d *countingDP) SetRemotes(context.Context, uint32, []datapath.Remote) error {
	d.op("SetRemotes")
	return nil
}

func (d *countingDP) Plug(_ context.Context, p datapath.PortSpec) error {
	d.op("Plug")
	d.mu.Lock()
	defer d.mu.Unlock()
	d.plugged[p.ID] = true
	return nil
}

func (d *countingDP) Unplug(_ context.Context, id string) error {
	d.op("Unplug")
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.plugged, id)
	return nil
}

func (d *countingDP) ListPorts(context.Context) ([]datapath.OwnedPort, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []datapath.OwnedPort
	for id := range d.plugged {
		out = append(out, datapath.OwnedPort{ID: id, VNI: 1})
	}
	return out, nil
}

func (d *countingDP) Cleanup(context.Context) error { return nil }

func (d *countingDP) BridgeIndex(uint32) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.bridge
}

func (d *countingDP) WatchGone(_ context.Context, gone func(string)) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.gone = gone
	return nil
}

// vanish removes a port's host end behind the agent's back and reports it.
func (d *countingDP) vanish(id string) {
	d.mu.Lock()
	delete(d.plugged, id)
	gone := d.gone
	d.mu.Unlock()
	gone(id)
}

// TestResyncTouchesNothingUnchanged: a resync plugs no port that is
// plugged as it is now; a port whose host end vanished, whose spec
// changed, whose VPC's bridge was made anew, or that was plugged more
// than Replug ago is plugged again. Counted on the datapath's
// operations: main re-plugged every local port at every resync.
func TestResyncTouchesNothingUnchanged(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	netns := func(name string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	port := func(id, ns, mac, ip string) controllerapi.Port {
		return controllerapi.Port{ID: id, ProjectID: "proj", BindingHostID: "h1", VNI: 1, NetworkNS: ns, MACAddress: mac,
			Status: controllerapi.StatusPending, RevisionNumber: 1,
			FixedIPs: []controllerapi.FixedIP{{SubnetID: "s", IPAddress: ip, CIDR: "10.1.0.0/24", GatewayIP: "10.1.0.1"}}}
	}
	for _, tc := range []struct {
		name   string
		replug time.Duration
		change func(t *testing.T, fc *fakeController, dp *countingDP)
		plugs  int // plugs after the change and 3 resyncs
	}{
		{name: "unchanged", replug: time.Hour, plugs: 0},
		{name: "host end vanished", replug: time.Hour, plugs: 1,
			change: func(_ *testing.T, _ *fakeController, dp *countingDP) { dp.vanish("a") }},
		{name: "spec changed", replug: time.Hour, plugs: 1,
			change: func(_ *testing.T, fc *fakeController, _ *countingDP) {
				fc.mu.Lock()
				fc.ports[0].MACAddress = "02:00:00:00:01:06"
				fc.ports[0].RevisionNumber += 10
				p := fc.ports[0]
				fc.mu.Unlock()
				fc.live <- controllerapi.Event{Type: controllerapi.EventModified, Revision: p.RevisionNumber, Port: &p}
			}},
		{name: "bridge made anew", replug: time.Hour, plugs: 2, // both ports
			change: func(_ *testing.T, _ *fakeController, dp *countingDP) {
				dp.mu.Lock()
				dp.bridge++
				dp.mu.Unlock()
			}},
		{name: "replug period", replug: time.Nanosecond, plugs: 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dp := newCountingDP()
			fc := &fakeController{statuses: map[string][]string{}, live: make(chan controllerapi.Event, 4),
				hosts: []controllerapi.Host{{ID: "h1", UnderlayIP: "192.0.2.1"}},
				ports: []controllerapi.Port{port("a", netns("a"), "02:00:00:00:01:05", "10.1.0.5"),
					port("b", netns("b"), "02:00:00:00:01:07", "10.1.0.7")}}
			a, err := New(Config{HostID: "h1", UnderlayIP: net.ParseIP("192.0.2.1"), Controller: fc, Datapath: dp,
				Resync: 20 * time.Millisecond, Replug: tc.replug, BackoffBase: 10 * time.Millisecond, BackoffMax: 100 * time.Millisecond,
				Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
			if err != nil {
				t.Fatal(err)
			}
			runAgent(ctx, t, a)
			settle(t, a, 2)
			if !slices.Equal(fc.status("a"), []string{controllerapi.StatusUp}) {
				t.Fatalf("port a: statuses %v, want UP", fc.status("a"))
			}
			before := dp.count("Plug")
			if tc.replug == time.Hour && before != 2 {
				t.Fatalf("%d plugs of 2 ports and 2 resyncs, want 2", before)
			}
			if tc.change != nil {
				tc.change(t, fc, dp)
			}
			settle(t, a, 3)
			got := dp.count("Plug") - before
			want := tc.plugs
			if tc.replug != time.Hour {
				want = 2 * 3 // both ports at each resync
			}
			if tc.replug == time.Hour && got != want || tc.replug != time.Hour && got < want {
				t.Errorf("%d plugs after the change and 3 resyncs, want %d", got, want)
			}
			if n := dp.count("Unplug"); n != 0 {
				t.Errorf("%d unplugs, want none", n)
			}
			if got := fc.status("a"); !slices.Equal(got, []string{controllerapi.StatusUp}) {
				t.Errorf("port a: statuses %v, want UP once", got)
			}
		})
	}
}
