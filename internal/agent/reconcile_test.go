package agent

import (
	"context"
	"iter"
	"log/slog"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"kurma.dev/kurma/internal/agent/datapath"
	"kurma.dev/kurma/internal/agent/lbpath"
	"kurma.dev/kurma/internal/agent/nettest"
	"kurma.dev/kurma/internal/testutil"
	"kurma.dev/kurma/pkg/controllerapi"
	"kurma.dev/kurma/pkg/kerrors"
)

// fakeController serves a fixed list of ports and hosts, then the live
// events sent on its channel; it records the statuses the agent reports.
// It stands in for the controller only in this test of the reconciler;
// the end-to-end tests use the real one.
type fakeController struct {
	mu       sync.Mutex // guards ports, hosts, statuses
	ports    []controllerapi.Port
	hosts    []controllerapi.Host
	statuses map[string][]string // port id -> statuses reported, in order
	live     chan controllerapi.Event
	hold     chan struct{} // when set, the port list waits until it is closed
}

func (f *fakeController) RegisterHost(_ context.Context, h controllerapi.Host) (*controllerapi.Host, error) {
	return &h, nil
}

func (f *fakeController) SetPortStatus(_ context.Context, _, id, status, reason string) (*controllerapi.Port, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := range f.ports {
		if f.ports[i].ID == id {
			f.ports[i].Status, f.ports[i].StatusReason = status, reason
			f.ports[i].RevisionNumber++
			f.statuses[id] = append(f.statuses[id], status)
			p := f.ports[i]
			return &p, nil
		}
	}
	return nil, kerrors.New(kerrors.NotFound, "port %s", id)
}

func (f *fakeController) GetSubnet(context.Context, string, string) (*controllerapi.Subnet, error) {
	return nil, kerrors.New(kerrors.NotFound, "no subnets here")
}

func (f *fakeController) WatchHostPorts(ctx context.Context, _ string) iter.Seq2[controllerapi.Event, error] {
	return func(yield func(controllerapi.Event, error) bool) {
		if f.hold != nil {
			select {
			case <-f.hold:
			case <-ctx.Done():
				return
			}
		}
		f.mu.Lock()
		ps := slices.Clone(f.ports)
		f.mu.Unlock()
		for _, p := range ps {
			if !yield(controllerapi.Event{Type: controllerapi.EventAdded, Port: &p}, nil) {
				return
			}
		}
		if !yield(controllerapi.Event{Type: controllerapi.EventSynced, Revision: 1}, nil) {
			return
		}
		for {
			select {
			case <-ctx.Done():
				return
			case ev := <-f.live:
				if !yield(ev, nil) {
					return
				}
			}
		}
	}
}

func (f *fakeController) WatchHosts(ctx context.Context, since int64) iter.Seq2[controllerapi.Event, error] {
	return func(yield func(controllerapi.Event, error) bool) {
		for _, h := range f.hosts {
			if !yield(controllerapi.Event{Type: controllerapi.EventAdded, Host: &h}, nil) {
				return
			}
		}
		if yield(controllerapi.Event{Type: controllerapi.EventSynced, Revision: 1}, nil) {
			<-ctx.Done()
		}
	}
}

func (f *fakeController) status(id string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.statuses[id])
}

// newTestDatapath returns a datapath over a fresh host namespace.
func newTestDatapath(t *testing.T) (*datapath.Datapath, string) {
	t.Helper()
	testutil.RequireRoot(t)
	hostNS := nettest.NewNS(t, testutil.UniqueName("kagt"))
	nettest.IP(t, hostNS, "link", "add", "kagtu0", "type", "veth", "peer", "name", "kagtu1")
	dp, err := datapath.New(t.Context(), datapath.Config{HostNS: hostNS, Prefix: "kagt", UnderlayIP: net.ParseIP("192.0.2.1"),
		UnderlayDev: "kagtu0", NFTTable: testutil.UniqueName("kagt")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dp.Close() })
	return dp, hostNS
}

func TestReconcile(t *testing.T) {
	ctx := t.Context()
	dp, hostNS := newTestDatapath(t)

	// Left over from an earlier run: a plugged port the controller no
	// longer has and a VPC without ports. Not ours: a look-alike link.
	orphanNS := nettest.NewNS(t, testutil.UniqueName("kagt"))
	if err := dp.EnsureVPC(ctx, datapath.VPCSpec{VNI: 77}); err != nil {
		t.Fatal(err)
	}
	orphan := datapath.PortSpec{ID: "orphan", VNI: 77, NetNS: orphanNS, IfName: "eth0", MAC: net.HardwareAddr{2, 0, 0, 0, 0, 0x77},
		Addrs: []datapath.PortAddr{{Addr: net.IPNet{IP: net.IPv4(10, 77, 0, 5).To4(), Mask: net.CIDRMask(24, 32)}}}}
	if err := dp.Plug(ctx, orphan); err != nil {
		t.Fatal(err)
	}
	nettest.IP(t, hostNS, "link", "add", "kagtpforeign", "type", "veth", "peer", "name", "kagtqforeign")

	podNS := nettest.NewNS(t, testutil.UniqueName("kagt"))
	adminNS := nettest.NewNS(t, testutil.UniqueName("kagt"))
	port := func(id, host string, vni uint32, ns, mac, ip string) controllerapi.Port {
		return controllerapi.Port{ID: id, ProjectID: "proj", BindingHostID: host, VNI: vni, NetworkNS: ns, MACAddress: mac,
			Status: controllerapi.StatusPending, RevisionNumber: 1,
			FixedIPs: []controllerapi.FixedIP{{SubnetID: "s", IPAddress: ip, CIDR: "10.1.0.0/24", GatewayIP: "10.1.0.1"}}}
	}
	fc := &fakeController{
		statuses: map[string][]string{}, live: make(chan controllerapi.Event, 4),
		hosts: []controllerapi.Host{{ID: "h1", UnderlayIP: "192.0.2.1"}, {ID: "h2", UnderlayIP: "192.0.2.2"}},
		ports: []controllerapi.Port{
			port("good", "h1", 1, podNS, "02:00:00:00:01:05", "10.1.0.5"),
			port("nons", "h1", 2, "/run/netns/kagt-missing", "02:00:00:00:02:05", "10.1.0.6"),
			port("badmac", "h1", 3, podNS, "zz", "10.1.0.7"),
			port("remote", "h2", 1, "/run/netns/elsewhere", "02:00:00:00:01:09", "10.1.0.9"),
			port("admindown", "h1", 4, adminNS, "02:00:00:00:04:05", "10.1.0.10"),
		},
	}
	f := false
	fc.ports[4].AdminStateUp = &f
	a, err := New(Config{HostID: "h1", UnderlayIP: net.ParseIP("192.0.2.1"), Controller: fc, Datapath: dp,
		Resync: 200 * time.Millisecond, BackoffBase: 10 * time.Millisecond, BackoffMax: 100 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
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
			time.Sleep(20 * time.Millisecond)
		}
	}
	last := func(id string) string {
		s := fc.status(id)
		if len(s) == 0 {
			return ""
		}
		return s[len(s)-1]
	}
	for _, tc := range []struct{ id, want string }{
		{"good", controllerapi.StatusUp}, {"nons", controllerapi.StatusDown}, {"badmac", controllerapi.StatusError},
		{"admindown", controllerapi.StatusDown},
	} {
		t.Run(tc.id+" is "+tc.want, func(t *testing.T) {
			until(t, tc.id+" "+tc.want, func() bool { return last(tc.id) == tc.want })
		})
	}
	t.Run("orphans removed, foreign kept", func(t *testing.T) {
		until(t, "orphan removal", func() bool {
			ports, _ := dp.ListPorts(ctx)
			vpcs, _ := dp.ListVPCs(ctx)
			return len(ports) == 2 && slices.Equal(vpcs, []uint32{1, 4})
		})
		if links := nettest.Links(t, hostNS); !slices.Contains(links, "kagtpforeign") || !slices.Contains(links, "kagtqforeign") {
			t.Fatalf("foreign link removed: %v", links)
		}
		if links := nettest.Links(t, orphanNS); !slices.Equal(links, []string{"lo"}) {
			t.Fatalf("orphan's netns still has %v", links)
		}
	})
	t.Run("remote port programmed", func(t *testing.T) {
		until(t, "fdb entry", func() bool {
			out := testutil.Run(t, "bridge", "-n", nettest.Name(hostNS), "fdb", "show", "dev", "kagtv000001")
			return strings.Contains(out, "02:00:00:00:01:09 dst 192.0.2.2")
		})
	})
	t.Run("up reported once across resyncs", func(t *testing.T) {
		settle(t, a, 2)
		if got := fc.status("good"); !slices.Equal(got, []string{controllerapi.StatusUp}) {
			t.Fatalf("statuses reported for good: %v", got)
		}
	})
	t.Run("deleted port unplugged and its vpc removed", func(t *testing.T) {
		p := port("good", "h1", 1, podNS, "02:00:00:00:01:05", "10.1.0.5")
		fc.live <- controllerapi.Event{Type: controllerapi.EventDeleted, Revision: 2, Port: &p}
		until(t, "unplug", func() bool {
			ports, _ := dp.ListPorts(ctx)
			vpcs, _ := dp.ListVPCs(ctx)
			return len(ports) == 1 && ports[0].ID == "admindown" && slices.Equal(vpcs, []uint32{4})
		})
		if links := nettest.Links(t, podNS); !slices.Equal(links, []string{"lo"}) {
			t.Fatalf("pod netns still has %v", links)
		}
	})
}

// TestNoUnplugBeforeList: until the first port list completes, an empty
// cache must not be taken for "no ports": resyncs and link events wait.
func TestNoUnplugBeforeList(t *testing.T) {
	ctx := t.Context()
	dp, _ := newTestDatapath(t)
	podNS := nettest.NewNS(t, testutil.UniqueName("kagt"))
	if err := dp.EnsureVPC(ctx, datapath.VPCSpec{VNI: 1}); err != nil {
		t.Fatal(err)
	}
	kept := controllerapi.Port{ID: "kept", ProjectID: "proj", BindingHostID: "h1", VNI: 1, NetworkNS: podNS,
		MACAddress: "02:00:00:00:01:05", Status: controllerapi.StatusUp, RevisionNumber: 1,
		FixedIPs: []controllerapi.FixedIP{{SubnetID: "s", IPAddress: "10.1.0.5", CIDR: "10.1.0.0/24", GatewayIP: "10.1.0.1"}}}
	spec, err := toPortSpec(&kept)
	if err != nil {
		t.Fatal(err)
	}
	if err := dp.Plug(ctx, spec); err != nil {
		t.Fatal(err)
	}
	fc := &fakeController{statuses: map[string][]string{}, live: make(chan controllerapi.Event), hold: make(chan struct{}),
		ports: []controllerapi.Port{kept}, hosts: []controllerapi.Host{{ID: "h1", UnderlayIP: "192.0.2.1"}}}
	a, err := New(Config{HostID: "h1", UnderlayIP: net.ParseIP("192.0.2.1"), Controller: fc, Datapath: dp,
		Resync: 20 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		t.Fatal(err)
	}
	runAgent(ctx, t, a)
	settle(t, a, 5) // resync periods with no list yet
	if ports, _ := dp.ListPorts(ctx); len(ports) != 1 {
		t.Fatalf("ports unplugged before the first list: %v", ports)
	}
	close(fc.hold)
	<-a.Synced()
	settle(t, a, 2)
	if ports, _ := dp.ListPorts(ctx); len(ports) != 1 || ports[0].ID != "kept" {
		t.Fatalf("after the list: %v", ports)
	}
	if got := fc.status("kept"); len(got) != 0 {
		t.Fatalf("an UP port was re-reported: %v", got)
	}
}

// listingController is fakeController with a load balancer feed, whose
// host and load balancer listings wait until their hold is closed.
type listingController struct {
	*fakeController
	holdHosts, holdLBs chan struct{}
	lbs                []controllerapi.LoadBalancer
}

func (f *listingController) WatchHosts(ctx context.Context, since int64) iter.Seq2[controllerapi.Event, error] {
	return func(yield func(controllerapi.Event, error) bool) {
		select {
		case <-f.holdHosts:
		case <-ctx.Done():
			return
		}
		f.fakeController.WatchHosts(ctx, since)(yield)
	}
}

func (f *listingController) WatchLoadBalancers(ctx context.Context, _ int64) iter.Seq2[controllerapi.Event, error] {
	return func(yield func(controllerapi.Event, error) bool) {
		select {
		case <-f.holdLBs:
		case <-ctx.Done():
			return
		}
		for i := range f.lbs {
			if !yield(controllerapi.Event{Type: controllerapi.EventAdded, LoadBalancer: &f.lbs[i]}, nil) {
				return
			}
		}
		if yield(controllerapi.Event{Type: controllerapi.EventSynced, Revision: 1}, nil) {
			<-ctx.Done()
		}
	}
}

// syncRecorder records the load-balancer Syncs and Applies it is asked
// for (concurrency-safe: the agent's workers call it).
type syncRecorder struct {
	mu    sync.Mutex
	syncs []int // load balancers per Sync
	calls int
}

func (r *syncRecorder) Apply(context.Context, lbpath.Changes) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls++
	return nil
}

func (r *syncRecorder) Sync(_ context.Context, s lbpath.State) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls++
	r.syncs = append(r.syncs, len(s.LBs))
	return nil
}

func (r *syncRecorder) get() (calls int, syncs []int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls, slices.Clone(r.syncs)
}

// TestNothingRemovedBeforeListings: a restarted agent whose port listing
// arrives before the host and load balancer listings neither removes a
// remote port's entries (its host's address is not known yet) nor
// programs the load balancers (they are not known yet): the first would
// cut the pods off the remote pod, the second every Service, until the
// late listing.
func TestNothingRemovedBeforeListings(t *testing.T) {
	ctx := t.Context()
	dp, hostNS := newTestDatapath(t)
	podNS := nettest.NewNS(t, testutil.UniqueName("kagt"))
	if err := dp.EnsureVPC(ctx, datapath.VPCSpec{VNI: 1}); err != nil {
		t.Fatal(err)
	}
	fixed := func(ip string) []controllerapi.FixedIP {
		return []controllerapi.FixedIP{{SubnetID: "s", IPAddress: ip, CIDR: "10.1.0.0/24", GatewayIP: "10.1.0.1"}}
	}
	kept := controllerapi.Port{ID: "kept", ProjectID: "proj", BindingHostID: "h1", VNI: 1, NetworkNS: podNS,
		MACAddress: "02:00:00:00:01:05", Status: controllerapi.StatusUp, RevisionNumber: 1, FixedIPs: fixed("10.1.0.5")}
	far := controllerapi.Port{ID: "far", ProjectID: "proj", BindingHostID: "h2", VNI: 1,
		MACAddress: "02:00:00:00:01:06", Status: controllerapi.StatusUp, RevisionNumber: 1, FixedIPs: fixed("10.1.0.6")}
	spec, err := toPortSpec(&kept)
	if err != nil {
		t.Fatal(err)
	}
	if err := dp.Plug(ctx, spec); err != nil {
		t.Fatal(err)
	}
	remote, _ := toRemote(&far, net.ParseIP("192.0.2.2"))
	if err := dp.SetRemotes(ctx, 1, []datapath.Remote{remote}); err != nil {
		t.Fatal(err)
	}
	neigh := func() string { return nettest.IP(t, hostNS, "neigh", "show", "nud", "permanent") }
	if !strings.Contains(neigh(), "10.1.0.6") {
		t.Fatalf("no neighbour entry for the remote port: %q", neigh())
	}
	fc := &listingController{fakeController: &fakeController{statuses: map[string][]string{}, live: make(chan controllerapi.Event),
		ports: []controllerapi.Port{kept, far},
		hosts: []controllerapi.Host{{ID: "h1", UnderlayIP: "192.0.2.1"}, {ID: "h2", UnderlayIP: "192.0.2.2"}}},
		holdHosts: make(chan struct{}), holdLBs: make(chan struct{}),
		lbs: []controllerapi.LoadBalancer{*testLB("lb1", 1, "10.96.0.10", "10.1.0.5", "10.1.0.6")}}
	rec := &syncRecorder{}
	a, err := New(Config{HostID: "h1", UnderlayIP: net.ParseIP("192.0.2.1"), Controller: fc, Datapath: dp, LB: rec,
		Resync: 20 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		t.Fatal(err)
	}
	runAgent(ctx, t, a)
	<-a.Synced()
	settle(t, a, 5) // resync periods with the ports listed
	if !strings.Contains(neigh(), "10.1.0.6") {
		t.Fatalf("the remote port's entry went before the host listing: %q", neigh())
	}
	if calls, _ := rec.get(); calls != 0 {
		t.Fatalf("%d load-balancer changes before the load balancer listing", calls)
	}
	if a.Programmed() {
		t.Fatal("ready before the host and load balancer listings")
	}
	close(fc.holdHosts)
	close(fc.holdLBs)
	deadline := time.Now().Add(5 * time.Second)
	for !a.Programmed() {
		if time.Now().After(deadline) {
			t.Fatal("not ready after the listings")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, syncs := rec.get(); len(syncs) == 0 || syncs[0] != 1 {
		t.Fatalf("load-balancer Syncs %v: want the first with the listed load balancer", syncs)
	}
	if !strings.Contains(neigh(), "10.1.0.6") {
		t.Fatalf("the remote port's entry is gone: %q", neigh())
	}
}
