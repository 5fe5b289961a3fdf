package agent

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"kurma.dev/kurma/internal/agent/nettest"
	"kurma.dev/kurma/internal/testutil"
	"kurma.dev/kurma/pkg/controllerapi"
)

// TestAttachLocal: in Kubernetes mode (LocalAttach) a port without a
// namespace waits unplugged and unreported; Attach returns once it is
// plugged, and UP is reported after (by a plain sync); a Detach right
// after an Attach never leaves the port reported UP.
func TestAttachLocal(t *testing.T) {
	ctx := t.Context()
	dp, _ := newTestDatapath(t)
	port := func(id, mac, ip string) controllerapi.Port {
		return controllerapi.Port{ID: id, ProjectID: "proj", BindingHostID: "h1", VNI: 9, MACAddress: mac,
			Status: controllerapi.StatusPending, RevisionNumber: 1,
			FixedIPs: []controllerapi.FixedIP{{SubnetID: "s", IPAddress: ip, CIDR: "10.9.0.0/24", GatewayIP: "10.9.0.1"}}}
	}
	fc := &fakeController{
		statuses: map[string][]string{}, live: make(chan controllerapi.Event, 4),
		hosts: []controllerapi.Host{{ID: "h1", UnderlayIP: "192.0.2.1"}},
		ports: []controllerapi.Port{port("one", "02:00:00:00:09:05", "10.9.0.5"), port("two", "02:00:00:00:09:06", "10.9.0.6")},
	}
	a, err := New(Config{HostID: "h1", UnderlayIP: net.ParseIP("192.0.2.1"), Controller: fc, Datapath: dp, LocalAttach: true,
		Resync: 200 * time.Millisecond, BackoffBase: 10 * time.Millisecond, BackoffMax: 100 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		t.Fatal(err)
	}
	runAgent(ctx, t, a)
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
	<-a.Synced()
	// A resync's worth of syncs of the unattached ports: nothing plugged
	// or reported.
	settle(t, a, 2)
	if ports, _ := dp.ListPorts(ctx); len(ports) != 0 || len(fc.status("one")) != 0 {
		t.Fatalf("unattached ports: plugged %v, statuses %v", ports, fc.status("one"))
	}

	ns1 := nettest.NewNS(t, testutil.UniqueName("kagt"))
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := a.Attach(actx, "one", Attachment{NetNS: ns1, IfName: "eth0"}); err != nil {
		t.Fatal(err)
	}
	if out := nettest.IP(t, ns1, "-br", "addr", "show", "eth0"); !strings.Contains(out, "10.9.0.5/24") || !strings.Contains(out, "UP") {
		t.Fatalf("eth0 after Attach: %s", out)
	}
	until("one UP", func() bool { return slices.Equal(fc.status("one"), []string{controllerapi.StatusUp}) })

	// Issue 25's hijack, at the agent: a port attached to a live sandbox
	// is not moved to another, nor handed to an attachment that names
	// another device; it stays plugged where it is.
	thief := nettest.NewNS(t, testutil.UniqueName("kagt"))
	for _, at := range []Attachment{{NetNS: thief, IfName: "eth0"}, {NetNS: ns1, IfName: "eth0", DeviceID: "another-pod"}} {
		if _, err := a.Attach(actx, "one", at); !errors.Is(err, ErrNotOwned) {
			t.Fatalf("Attach of a port in a live sandbox to %+v: %v, want ErrNotOwned", at, err)
		}
	}
	if got := nettest.Links(t, thief); !slices.Equal(got, []string{"lo"}) {
		t.Fatalf("links of the refused sandbox: %v", got)
	}
	if out := nettest.IP(t, ns1, "-br", "addr", "show", "eth0"); !strings.Contains(out, "10.9.0.5/24") {
		t.Fatalf("eth0 of the owner after the refused Attach: %s", out)
	}
	// The NetworkPolicy controller's check of an annotation's address.
	for _, tc := range []struct {
		port, device, owner, ip string
		want                    bool
	}{
		{"one", "", "", "10.9.0.5", true},
		{"one", "", "", "10.9.0.6", false},      // another address
		{"one", "u1", "", "10.9.0.5", false},    // another device
		{"one", "", "other", "10.9.0.5", false}, // another owner
		{"nope", "", "", "10.9.0.5", false},     // no such port
	} {
		if got := a.PortHasAddr(tc.port, tc.device, tc.owner, netip.MustParseAddr(tc.ip)); got != tc.want {
			t.Errorf("PortHasAddr(%q, %q, %q, %s) = %t, want %t", tc.port, tc.device, tc.owner, tc.ip, got, tc.want)
		}
	}

	ns2 := nettest.NewNS(t, testutil.UniqueName("kagt"))
	if _, err := a.Attach(actx, "two", Attachment{NetNS: ns2, IfName: "eth0"}); err != nil {
		t.Fatal(err)
	}
	if err := a.Detach(actx, "two"); err != nil {
		t.Fatal(err)
	}
	if got := nettest.Links(t, ns2); !slices.Equal(got, []string{"lo"}) {
		t.Fatalf("links after Detach: %v", got)
	}
	// Either UP was reported before the Detach (then DOWN follows), or the
	// Detach came first and the port was never reported at all.
	settle(t, a, 1) // a resync: its syncs may not report UP
	if s := fc.status("two"); len(s) != 0 && !slices.Equal(s, []string{controllerapi.StatusUp, controllerapi.StatusDown}) {
		t.Fatalf("statuses of an attach then detach: %v", s)
	}
}
