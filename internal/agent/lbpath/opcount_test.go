package lbpath

import (
	"fmt"
	"log/slog"
	"net/netip"
	"testing"

	"sigs.k8s.io/knftables"

	"kurma.dev/kurma/internal/agent/nfthost"
)

// TestApplyOpCounts: without root (a fake nft for pick chains, a
// nfthost.Recorder for the element writes), an Apply is one transaction;
// a load balancer's first Apply writes its elements, a member added
// later writes only the few elements that member changes, the same with
// 500 other load balancers as with none, and an unchanged Apply writes
// nothing.
func TestApplyOpCounts(t *testing.T) {
	var base struct{ added, deleted int } // the member change's counts without others
	for _, others := range []int{0, 500} {
		t.Run(fmt.Sprint(others), func(t *testing.T) {
			ctx := t.Context()
			rec := &nfthost.Recorder{}
			p := barePath(Config{Table: "kop", Logger: slog.Default()})
			p.nft, p.w, p.r = knftables.NewFake(knftables.InetFamily, "kop"), rec, rec
			p.setTable(nfthost.Inet("kop"))
			if err := p.writeSkeleton(ctx, "a", ""); err != nil {
				t.Fatal(err)
			}
			lb := func(id string, vip netip.Addr, members int) LB {
				l := LB{ID: id, Iface: "kopbr0", VIP: vip, Listeners: []Listener{{Proto: TCP, Port: 80, TargetPort: 8080}}}
				for i := range members {
					l.Members = append(l.Members, Member{Addr: netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)})})
				}
				return l
			}
			var bulk Changes
			for i := range others {
				bulk.LBs = append(bulk.LBs, lb(fmt.Sprintf("o%d", i), netip.AddrFrom4([4]byte{10, 97, byte(i >> 8), byte(i)}), 2))
			}
			if others > 0 {
				if err := p.Apply(ctx, bulk); err != nil {
					t.Fatal(err)
				}
			}
			rec.Reset()
			vip := netip.MustParseAddr("10.96.0.1")
			if err := p.Apply(ctx, Changes{LBs: []LB{lb("web", vip, 2)}}); err != nil {
				t.Fatal(err)
			}
			first := rec.Added
			if rec.Transactions != 1 || first == 0 || rec.Deleted != 0 {
				t.Fatalf("first Apply: %d transactions, %d added, %d deleted; want 1, >0, 0", rec.Transactions, rec.Added, rec.Deleted)
			}
			rec.Reset()
			if err := p.Apply(ctx, Changes{LBs: []LB{lb("web", vip, 2)}}); err != nil || rec.Messages != 0 {
				t.Fatalf("unchanged Apply: err %v, %d messages", err, rec.Messages)
			}
			if err := p.Apply(ctx, Changes{LBs: []LB{lb("web", vip, 3)}}); err != nil {
				t.Fatal(err)
			}
			t.Logf("%d other load balancers: first Apply %d elements; one member more: %d added, %d deleted in %d messages",
				others, first, rec.Added, rec.Deleted, rec.Messages)
			if rec.Transactions != 1 || rec.Added+rec.Deleted == 0 || rec.Added+rec.Deleted > 8 {
				t.Fatalf("a member added: %d transactions, %d added + %d deleted; want 1, and a handful of elements",
					rec.Transactions, rec.Added, rec.Deleted)
			}
			if others == 500 && (rec.Added != base.added || rec.Deleted != base.deleted) {
				t.Fatalf("with %d others: %d added, %d deleted; with none: %d, %d (want the same)", others, rec.Added, rec.Deleted, base.added, base.deleted)
			}
			base.added, base.deleted = rec.Added, rec.Deleted
		})
	}
}
