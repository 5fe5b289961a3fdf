package datapath

import (
	"net"
	"strings"
	"testing"

	"kurma.dev/kurma/internal/agent/nettest"
	"kurma.dev/kurma/internal/testutil"
)

// TestForgetsPreviousOwner: the host's neighbour entry for an address on
// a VPC bridge that names another MAC than the address's owner now (its
// previous owner's, still confirmed) is removed by the plug of the new
// owner, fresh or repaired, and by SetRemotes when the owner is remote;
// an entry that names the owner's MAC survives a plug that changes
// nothing.
func TestForgetsPreviousOwner(t *testing.T) {
	testutil.RequireRoot(t)
	ctx := t.Context()
	host := newTestHost(t, "192.0.2.1/24", dummyUnderlay(t))
	if err := host.dp.EnsureVPC(ctx, VPCSpec{VNI: 12, Gateways: []net.IPNet{ipnet(t, "10.12.0.1/24")}}); err != nil {
		t.Fatal(err)
	}
	br := host.dp.names.bridge(12)
	pod := nettest.NewNS(t, testutil.UniqueName(testPrefix))
	p := portSpec(t, "owner", 12, pod, "10.12.0.5/24", "10.12.0.1", 5) // MAC 02:42:00:00:0c:05
	remote := []Remote{{MAC: net.HardwareAddr{2, 0, 0, 0, 0, 9}, IPs: []net.IP{net.ParseIP("10.12.0.9")}, VTEP: net.ParseIP("192.0.2.2")}}
	const stale = "02:99:00:00:00:01"
	for _, tc := range []struct {
		name   string
		ip     string
		lladdr string // the entry the host has before
		do     func() error
		want   string // its lladdr after ("": none)
	}{
		{"fresh plug", "10.12.0.5", stale, func() error { return host.dp.Plug(ctx, p) }, ""},
		{"plug again, entry of another mac", "10.12.0.5", stale, func() error { return host.dp.Plug(ctx, p) }, ""},
		{"plug again, entry of its own mac", "10.12.0.5", p.MAC.String(), func() error { return host.dp.Plug(ctx, p) }, p.MAC.String()},
		{"remote added", "10.12.0.9", stale, func() error { return host.dp.SetRemotes(ctx, 12, remote) }, ""},
		{"remotes unchanged", "10.12.0.9", remote[0].MAC.String(), func() error { return host.dp.SetRemotes(ctx, 12, remote) }, remote[0].MAC.String()},
		{"remote removed", "10.12.0.9", remote[0].MAC.String(), func() error { return host.dp.SetRemotes(ctx, 12, nil) }, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nettest.IP(t, host.ns, "neigh", "replace", tc.ip, "lladdr", tc.lladdr, "nud", "reachable", "dev", br)
			if err := tc.do(); err != nil {
				t.Fatal(err)
			}
			got := nettest.IP(t, host.ns, "neigh", "show", tc.ip, "dev", br)
			if tc.want == "" && strings.Contains(got, "lladdr") || tc.want != "" && !strings.Contains(got, "lladdr "+tc.want) {
				t.Fatalf("entry for %s after: %q, want lladdr %q", tc.ip, got, tc.want)
			}
		})
	}
}
