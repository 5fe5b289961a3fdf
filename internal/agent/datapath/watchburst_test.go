package datapath

import (
	"fmt"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"kurma.dev/kurma/internal/agent/nettest"
	"kurma.dev/kurma/internal/testutil"
)

// TestWatchGoneBurst: a burst of link events while the consumer is busy
// (a pod burst makes several per plug, and every one is read) does not
// overflow the subscription's socket, which would drop the events of
// vanished ports until the next resync: every owned host end deleted in
// the burst is reported.
func TestWatchGoneBurst(t *testing.T) {
	testutil.RequireRoot(t)
	ctx := t.Context()
	host := newTestHost(t, "192.0.2.1/24", dummyUnderlay(t))
	release := make(chan struct{})
	got := make(chan string, 1024)
	if err := host.dp.WatchGone(ctx, func(id string) {
		<-release // a consumer that falls behind
		got <- id
	}); err != nil {
		t.Fatal(err)
	}
	h := nettest.Handle(t, host.ns)
	const n = 300
	var links []netlink.Link
	for i := range n {
		id := fmt.Sprintf("burst-%03d", i)
		l := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: host.dp.names.hostVeth(id)}, PeerName: fmt.Sprintf("kgwb%d", i)}
		if err := h.LinkAdd(l); err != nil {
			t.Fatal(err)
		}
		if err := h.LinkSetAlias(l, host.dp.names.portAlias(id)); err != nil {
			t.Fatal(err)
		}
		links = append(links, l)
	}
	for _, l := range links {
		if err := h.LinkDel(l); err != nil {
			t.Fatal(err)
		}
	}
	close(release)
	seen := map[string]bool{}
	deadline := time.After(20 * time.Second)
	for len(seen) < n {
		select {
		case id := <-got:
			seen[id] = true
		case <-deadline:
			t.Fatalf("%d of %d deleted host ends reported: events were dropped", len(seen), n)
		}
	}
}
