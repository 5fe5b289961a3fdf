package datapath

import (
	"fmt"
	"net"
	"testing"

	"sigs.k8s.io/knftables"

	"kurma.dev/kurma/internal/agent/nfthost"
)

// TestGuardOpCounts: without root (a fake nft and a nfthost.Recorder for
// the kernel), the first SetGuards writes the table whole through nft,
// and after that a port's arrival or departure is one transaction of
// only its own elements (one message per set it touches), at 10 ports as
// at 1,000; an unchanged set of guards writes nothing.
func TestGuardOpCounts(t *testing.T) {
	for _, n := range []int{10, 1000} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			ctx := t.Context()
			nm, err := newNames("kgc", "kurma-agent")
			if err != nil {
				t.Fatal(err)
			}
			rec := &nfthost.Recorder{}
			fake := knftables.NewFake(knftables.BridgeFamily, "kgc")
			d := &Datapath{cfg: Config{Owner: "kurma-agent", NFTTable: "kgc"}, names: nm,
				bnft: fake, gw: rec, gr: rec, gsets: guardSetsOf("kgc")}
			guard := func(i int) Guard {
				return Guard{PortID: fmt.Sprintf("port-%d", i), MAC: net.HardwareAddr{2, 0, 0, 0, byte(i >> 8), byte(i)},
					IPs: []net.IP{net.IPv4(10, 1, byte(i>>8), byte(i)).To4()}}
			}
			var gs []Guard
			for i := range n {
				gs = append(gs, guard(i))
			}
			if err := d.SetGuards(ctx, gs); err != nil {
				t.Fatal(err)
			}
			if rec.Messages != 0 {
				t.Fatalf("cold write went through netlink: %+v", rec)
			}
			if got, want := len(fake.Table.Sets), len(guardSets); got != want {
				t.Fatalf("fake table has %d sets, want %d", got, want)
			}
			// One more port: port, mac, arp (0.0.0.0 and its address), v4.
			if err := d.SetGuards(ctx, append(gs, guard(n))); err != nil {
				t.Fatal(err)
			}
			if rec.Transactions != 1 || rec.Messages != 4 || rec.Added != 5 || rec.Deleted != 0 {
				t.Fatalf("a port's arrival: %d transactions, %d messages, %d added, %d deleted; want 1, 4, 5, 0",
					rec.Transactions, rec.Messages, rec.Added, rec.Deleted)
			}
			rec.Reset()
			if err := d.SetGuards(ctx, append(gs, guard(n))); err != nil || rec.Messages != 0 {
				t.Fatalf("unchanged guards: err %v, %d messages", err, rec.Messages)
			}
			if err := d.SetGuards(ctx, gs); err != nil {
				t.Fatal(err)
			}
			if rec.Transactions != 1 || rec.Messages != 4 || rec.Deleted != 5 || rec.Added != 0 {
				t.Fatalf("a port's departure: %d transactions, %d messages, %d added, %d deleted; want 1, 4, 0, 5",
					rec.Transactions, rec.Messages, rec.Added, rec.Deleted)
			}
		})
	}
}
