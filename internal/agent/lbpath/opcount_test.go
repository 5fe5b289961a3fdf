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

// TestApplyOpCountsByKind: what one load balancer's first Apply writes,
// as Kubernetes' Services ask (HostAccess, two local members), for a
// ClusterIP, a NodePort and a NodePort with ExternalLocal, beside 0 and
// 2,000 others of the same kind: one netlink transaction, no nft -f
// (the pick chain exists), and a node port adds only its own handful of
// elements (its class, its backends, its SNAT mark), nothing that grows
// with the number of load balancers or node ports.
func TestApplyOpCountsByKind(t *testing.T) {
	kinds := []struct {
		name               string
		nodePort, local    bool
		elements, messages int // elements written, element messages (one per set touched)
	}{
		{name: "ClusterIP", elements: 8, messages: 3},
		{name: "NodePort", nodePort: true, elements: 12, messages: 6},
		{name: "NodePort eTP Local", nodePort: true, local: true, elements: 11, messages: 5},
	}
	for _, k := range kinds {
		for _, others := range []int{0, 2000} {
			t.Run(fmt.Sprintf("%s/%d", k.name, others), func(t *testing.T) {
				ctx := t.Context()
				rec := &nfthost.Recorder{}
				fake := knftables.NewFake(knftables.InetFamily, "kop")
				p := barePath(Config{Table: "kop", Logger: slog.Default(), NodeAddrs: []netip.Addr{netip.MustParseAddr("192.0.2.1")}})
				p.nft, p.w, p.r = fake, rec, rec
				p.setTable(nfthost.Inet("kop"))
				if err := p.writeSkeleton(ctx, "a", ""); err != nil {
					t.Fatal(err)
				}
				lb := func(i int) LB {
					l := LB{ID: fmt.Sprintf("s%d", i), Iface: "kopbr0", HostAccess: true, ExternalLocal: k.local,
						VIP:       netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}),
						Listeners: []Listener{{Proto: TCP, Port: 80, TargetPort: 8080}}}
					if k.nodePort {
						l.Listeners[0].NodePort = uint16(30000 + i)
					}
					for m := range 2 {
						l.Members = append(l.Members, Member{Addr: netip.AddrFrom4([4]byte{10, byte(40 + m), byte(i >> 8), byte(i)}), Local: true})
					}
					return l
				}
				var bulk Changes
				for i := range others {
					bulk.LBs = append(bulk.LBs, lb(i+1))
				}
				// The first load balancer makes the pick chain: not part
				// of a steady add.
				bulk.LBs = append(bulk.LBs, lb(others+1))
				if err := p.Apply(ctx, bulk); err != nil {
					t.Fatal(err)
				}
				rec.Reset()
				chains := len(fake.Table.Chains)
				if err := p.Apply(ctx, Changes{LBs: []LB{lb(others + 2)}}); err != nil {
					t.Fatal(err)
				}
				elements, added := rec.Added+rec.Deleted, len(fake.Table.Chains)-chains
				t.Logf("%s beside %d others: %d elements in %d messages, %d transactions, %d chains added; by set %v",
					k.name, others, elements, rec.Messages, rec.Transactions, added, rec.BySet)
				if elements != k.elements || rec.Messages != k.messages || rec.Transactions != 1 || added != 0 {
					t.Fatalf("got %d elements, %d messages, %d transactions, %d chains added; want %d, %d, 1, 0",
						elements, rec.Messages, rec.Transactions, added, k.elements, k.messages)
				}
			})
		}
	}
}
