package lbpath

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"sigs.k8s.io/knftables"

	"kurma.dev/kurma/internal/agent/nftbatch"
)

// Apply makes the changes live in one nft transaction that touches only
// the elements they change.
func (p *Path) Apply(ctx context.Context, ch Changes) error {
	if err := validate(ch.LBs, ch.FIPs); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	touched := map[string]bool{}
	for i := range ch.LBs {
		l := cloneLB(&ch.LBs[i])
		if old, ok := p.lbs[l.ID]; ok && old.Affinity > 0 && (l.Affinity == 0 || !slices.EqualFunc(old.Members, l.Members, sameMember)) {
			p.purgeAffinity(old)
		}
		p.lbs[l.ID] = l
		touched[l.ID] = true
	}
	for _, id := range ch.DeleteLBs {
		if old, ok := p.lbs[id]; ok && old.Affinity > 0 {
			p.purgeAffinity(old)
		}
		delete(p.lbs, id)
		touched[id] = true
	}
	for i := range ch.FIPs {
		f := ch.FIPs[i]
		p.setFIP(&f, touched)
	}
	for _, id := range ch.DeleteFIP {
		p.setFIP(&FIP{ID: id}, touched)
		delete(p.fips, id)
		p.setContrib(ownFIP, id, nil)
	}
	for id := range touched {
		p.refreshLB(id)
	}
	return p.commit(ctx)
}

// purgeAffinity queues the affinity entries of l's frontends for removal.
func (p *Path) purgeAffinity(l *LB) {
	for _, t := range affinityTails(l, p.fipAddrs(l), p.cfg.NodeAddrs) {
		p.affPurge[t] = true
	}
}

// setFIP records f (an empty Addr: removal) and its own contributions,
// marking the load balancers whose frontends it changes.
func (p *Path) setFIP(f *FIP, touched map[string]bool) {
	if old, ok := p.fips[f.ID]; ok && old.LBID != "" {
		delete(p.fipsOfLB[old.LBID], f.ID)
		touched[old.LBID] = true
	}
	if !f.Addr.IsValid() {
		return
	}
	p.fips[f.ID] = f
	if f.LBID != "" {
		if p.fipsOfLB[f.LBID] == nil {
			p.fipsOfLB[f.LBID] = map[string]bool{}
		}
		p.fipsOfLB[f.LBID][f.ID] = true
		touched[f.LBID] = true
	}
	var cs []contrib
	if p.cfg.ExtIface != "" {
		fipElems(f, p.cfg.ExtIface, func(e elem, v string) { cs = append(cs, contrib{e, v}) })
	}
	p.setContrib(ownFIP, f.ID, cs)
}

func (p *Path) refreshLB(id string) {
	l, ok := p.lbs[id]
	if !ok {
		p.setContrib(ownLB, id, nil)
		return
	}
	var cs []contrib
	lbElems(l, p.cfg.ExtIface, p.fipAddrs(l), func(e elem, v string) { cs = append(cs, contrib{e, v}) })
	p.setContrib(ownLB, l.ID, cs)
}

// fipAddrs are the addresses of l's floating IPs answered here (none
// without an external interface), in the order of their ids.
func (p *Path) fipAddrs(l *LB) []netip.Addr {
	if p.cfg.ExtIface == "" {
		return nil
	}
	ids := make([]string, 0, len(p.fipsOfLB[l.ID]))
	for fid := range p.fipsOfLB[l.ID] {
		ids = append(ids, fid)
	}
	slices.Sort(ids)
	out := make([]netip.Addr, 0, len(ids))
	for _, fid := range ids {
		out = append(out, p.fips[fid].Addr)
	}
	return out
}

// Owner kinds of Path.owned.
const (
	ownLB = iota
	ownFIP
)

// setContrib replaces what owner id of kind contributes to the wanted
// elements.
func (p *Path) setContrib(kind int, id string, cs []contrib) {
	owned := p.owned[kind]
	for _, e := range owned[id] {
		w, ok := p.els[e]
		if !ok || w.refs <= 0 {
			continue
		}
		w.refs--
		if w.refs <= 0 {
			p.chainRef(e, w.want, -1)
			w.want = ""
		}
		p.setSlot(e, w)
		p.pending[e] = true
	}
	for _, c := range cs {
		w := p.els[c.e]
		switch {
		case w.refs <= 0:
			w.want = c.val
			p.chainRef(c.e, c.val, 1)
		case w.want != c.val:
			// Two owners disagree (e.g. the same VIP and port twice): the
			// later one wins.
			p.chainRef(c.e, w.want, -1)
			p.chainRef(c.e, c.val, 1)
			w.want = c.val
		}
		w.refs++
		p.els[c.e] = w
		p.pending[c.e] = true
	}
	if len(cs) == 0 {
		delete(owned, id)
	} else {
		es := make([]elem, len(cs))
		for i, c := range cs {
			es[i] = c.e
		}
		owned[id] = es
	}
}

func (p *Path) chainRef(e elem, val string, d int) {
	if !classSet(e.set) || len(val) != 4 {
		return
	}
	c := getMark(val)
	if c == 0 {
		return
	}
	name := chainOfClass(c)
	p.chainRefs[name] += d
	if p.chainRefs[name] <= 0 {
		delete(p.chainRefs, name)
	}
}

// commit brings every pending element to its wanted state: missing pick
// chains first (nft -f), then one netlink transaction of element
// deletions and additions, then FIP routes, then unused pick chains.
func (p *Path) commit(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("lbpath: %w", err)
	}
	var missing []string
	for c := range p.chainRefs {
		if !p.chains[c] {
			missing = append(missing, c)
		}
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		tx := p.nft.NewTransaction()
		for _, c := range missing {
			if err := addPickChain(tx, c); err != nil {
				return err
			}
		}
		if err := p.runNft(ctx, tx); err != nil {
			return fmt.Errorf("lbpath: add chains %v: %w", missing, err)
		}
		for _, c := range missing {
			p.chains[c] = true
		}
	}

	var stale []staleFlow
	if !p.syncing {
		stale = p.staleUDP()
	}
	var ops, routeOps []op
	for e := range p.pending {
		sl := p.els[e]
		wok, hok := sl.refs > 0, sl.in
		if e.set == setRoute {
			if wok != hok {
				routeOps = append(routeOps, op{e: e, del: hok})
			}
			continue
		}
		if hok && (!wok || sl.want != sl.have) {
			ops = append(ops, op{e: e, del: true})
		}
		if wok && (!hok || sl.want != sl.have) {
			ops = append(ops, op{e: e, val: sl.want})
		}
	}
	// Deletions first (a replaced element is deleted, then added), grouped
	// by set into messages; one transaction unless the change is larger
	// than nftbatch.TxOps (only a cold sync is).
	err := nftbatch.Commit(p.w, ops,
		func(o op) nftbatch.Key {
			return nftbatch.Key{Set: p.gens.Set(int(o.e.set)), Order: int(o.e.set), Del: o.del}
		},
		func(o op) nftables.SetElement {
			if o.del {
				return nftables.SetElement{Key: []byte(o.e.key)}
			}
			return p.element(o.e, o.val)
		},
		func(tx []op) {
			for _, o := range tx {
				p.setHave(o.e, !o.del, o.val)
			}
		})
	if err != nil {
		return fmt.Errorf("lbpath: %w", err)
	}
	clear(p.pending)
	p.flushUDP(stale)
	if len(p.affPurge) > 0 {
		if err := p.purge(func(tail string) bool { return p.affPurge[tail] }); err != nil {
			return err
		}
		clear(p.affPurge)
	}
	if err := p.syncRoutes(routeOps); err != nil {
		return err
	}
	if p.syncing {
		return nil
	}
	return p.gcChains(ctx)
}

// gcChains deletes the pick chains no services element wants.
func (p *Path) gcChains(ctx context.Context) error {
	var unused []string
	for c := range p.chains {
		if p.chainRefs[c] == 0 {
			unused = append(unused, c)
		}
	}
	if len(unused) > 0 {
		tx := p.nft.NewTransaction()
		for _, c := range unused {
			// Add first: deleting what a crash already removed fails.
			if err := addPickChain(tx, c); err != nil {
				return err
			}
			class, _ := classOfChain(c)
			tx.Delete(&knftables.Element{Map: "classes", Key: []string{strconv.FormatUint(uint64(class), 10)}})
			tx.Delete(&knftables.Chain{Name: c})
		}
		if err := p.runNft(ctx, tx); err != nil {
			return fmt.Errorf("lbpath: delete chains %v: %w", unused, err)
		}
		for _, c := range unused {
			delete(p.chains, c)
		}
	}
	return nil
}

func (p *Path) element(e elem, val string) nftables.SetElement {
	el := nftables.SetElement{Key: []byte(e.key)}
	switch {
	case setDefs[e.set].vmap:
		el.VerdictData = &expr.Verdict{Kind: expr.VerdictGoto, Chain: val}
	case setDefs[e.set].isMap:
		el.Val = []byte(val)
	}
	return el
}

// purge deletes the affinity entries whose frontend (the key's last 12
// bytes: vip . proto . port) drop selects, in one transaction.
func (p *Path) purge(drop func(tail string) bool) error {
	els, err := p.r.GetSetElements(p.affSet)
	if err != nil {
		return fmt.Errorf("lbpath: list affinity: %w", err)
	}
	var del []nftables.SetElement
	for _, el := range els {
		if len(el.Key) == 16 && drop(string(el.Key[4:])) {
			del = append(del, nftables.SetElement{Key: el.Key})
		}
	}
	if len(del) == 0 {
		return nil
	}
	for c := range slices.Chunk(del, msgElems) {
		if err := p.conn.SetDeleteElements(p.affSet, c); err != nil {
			return fmt.Errorf("lbpath: %w", err)
		}
	}
	if err := p.conn.Flush(); err != nil {
		return fmt.Errorf("lbpath: purge %d affinity entries: %w", len(del), err)
	}
	return nil
}

// addPickChain adds (or rewrites) a shared chain that sets the packet
// mark to the index of one of n members: at random, or with affinity the
// one the client was sent to before.
func addPickChain(tx *knftables.Transaction, name string) error {
	rest, ok := strings.CutPrefix(name, "pick-")
	if !ok {
		return fmt.Errorf("lbpath: not a pick chain: %q", name)
	}
	nStr, affStr, aff := strings.Cut(rest, "-aff-")
	n, err := strconv.Atoi(nStr)
	if err != nil || n < 1 || n > MaxMembers {
		return fmt.Errorf("lbpath: bad pick chain %q", name)
	}
	secs := 0
	if aff {
		if secs, err = strconv.Atoi(affStr); err != nil || secs < 1 {
			return fmt.Errorf("lbpath: bad pick chain %q", name)
		}
	}
	tx.Add(&knftables.Chain{Name: name})
	tx.Flush(&knftables.Chain{Name: name})
	defer tx.Add(&knftables.Element{Map: "classes", Key: []string{strconv.FormatUint(uint64(classOf(n, time.Duration(secs)*time.Second)), 10)},
		Value: []string{"goto " + name}})
	pick := fmt.Sprintf("meta mark set numgen random mod %d", n)
	if aff {
		key := "ip saddr . ip daddr . meta l4proto . th dport"
		tx.Add(&knftables.Rule{Chain: name, Rule: fmt.Sprintf("meta mark set %s map @affinity meta mark < %d accept", key, n)})
		tx.Add(&knftables.Rule{Chain: name, Rule: fmt.Sprintf("%s update @affinity { %s timeout %ds : meta mark } accept", pick, key, secs)})
		return nil
	}
	tx.Add(&knftables.Rule{Chain: name, Rule: pick + " accept"})
	return nil
}

// classOfChain is the class a pick chain serves.
func classOfChain(name string) (uint32, bool) {
	rest, ok := strings.CutPrefix(name, "pick-")
	if !ok {
		return 0, false
	}
	nStr, affStr, aff := strings.Cut(rest, "-aff-")
	n, err := strconv.Atoi(nStr)
	if err != nil {
		return 0, false
	}
	secs := 0
	if aff {
		if secs, err = strconv.Atoi(affStr); err != nil {
			return 0, false
		}
	}
	return classOf(n, time.Duration(secs)*time.Second), true
}
