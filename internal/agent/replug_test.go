package agent

import (
	"context"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"kurma.dev/kurma/internal/agent/datapath"
	"kurma.dev/kurma/internal/agent/nettest"
	"kurma.dev/kurma/internal/testutil"
	"kurma.dev/kurma/pkg/controllerapi"
)

// countingDatapath counts the Plug and Plugged calls of a real datapath.
type countingDatapath struct {
	*datapath.Datapath
	plugs, checks atomic.Int64
}

func (c *countingDatapath) Plug(ctx context.Context, p datapath.PortSpec) error {
	c.plugs.Add(1)
	return c.Datapath.Plug(ctx, p)
}

func (c *countingDatapath) Plugged(p datapath.PortSpec) bool {
	c.checks.Add(1)
	return c.Datapath.Plugged(p)
}

// TestResyncChecksHostEnd: the periodic resync of a plugged port that
// has not changed checks its host end instead of plugging it again; a
// host end taken off its bridge is plugged again at the next resync; and
// with Replug passed, a resync plugs in full again.
func TestResyncChecksHostEnd(t *testing.T) {
	ctx := t.Context()
	real, hostNS := newTestDatapath(t)
	dp := &countingDatapath{Datapath: real}
	podNS := nettest.NewNS(t, testutil.UniqueName("kagt"))
	fc := &fakeController{
		statuses: map[string][]string{}, live: make(chan controllerapi.Event, 4),
		hosts: []controllerapi.Host{{ID: "h1", UnderlayIP: "192.0.2.1"}},
		ports: []controllerapi.Port{{ID: "one", ProjectID: "proj", BindingHostID: "h1", VNI: 9, MACAddress: "02:00:00:00:09:05",
			NetworkNS: podNS, Status: controllerapi.StatusPending, RevisionNumber: 1,
			FixedIPs: []controllerapi.FixedIP{{SubnetID: "s", IPAddress: "10.9.0.5", CIDR: "10.9.0.0/24", GatewayIP: "10.9.0.1"}}}},
	}
	a, err := New(Config{HostID: "h1", UnderlayIP: net.ParseIP("192.0.2.1"), Controller: fc, Datapath: dp,
		Resync: 50 * time.Millisecond, Replug: time.Hour, BackoffBase: 10 * time.Millisecond, BackoffMax: 100 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- a.Run(runCtx) }()
	t.Cleanup(func() { stop(); <-done })
	until := func(what string, f func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !f() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	until("one UP", func() bool { s := fc.status("one"); return len(s) > 0 && s[len(s)-1] == controllerapi.StatusUp })
	plugs := dp.plugs.Load()
	checks := dp.checks.Load()
	until("five resyncs' checks", func() bool { return dp.checks.Load() >= checks+5 })
	if got := dp.plugs.Load(); got != plugs {
		t.Fatalf("resyncs of an unchanged port plugged it %d more times", got-plugs)
	}

	hostEnd := ""
	for _, l := range nettest.Links(t, hostNS) {
		if strings.HasPrefix(l, "kagtp") {
			hostEnd = l
		}
	}
	nettest.IP(t, hostNS, "link", "set", hostEnd, "nomaster")
	until("the host end back on its bridge", func() bool {
		return strings.Contains(nettest.IP(t, hostNS, "-o", "link", "show", hostEnd), "master kagtb")
	})
	if got := dp.plugs.Load(); got != plugs+1 {
		t.Fatalf("repair took %d plugs, want 1", got-plugs)
	}

	// Replug passed: the next resync plugs in full.
	a.mu.Lock()
	a.plugged["one"] = time.Now().Add(-2 * time.Hour)
	a.mu.Unlock()
	until("a full plug after Replug", func() bool { return dp.plugs.Load() >= plugs+2 })
}
