package lbpath

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Sync makes the kernel match s exactly: it reads back every element,
// route and pick chain, adds what is missing and removes what is stale.
// Call it at start and after a failed Apply.
func (p *Path) Sync(ctx context.Context, s State) error {
	if err := validate(s.LBs, s.FIPs); err != nil {
		return err
	}
	if err := p.ensureServiceRoutes(); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.lbs, p.fips, p.fipsOfLB = map[string]*LB{}, map[string]*FIP{}, map[string]map[string]bool{}
	p.owned, p.chainRefs = [2]map[string][]elem{{}, {}}, map[string]int{}
	p.clearWant()
	touched := map[string]bool{}
	for i := range s.LBs {
		l := cloneLB(&s.LBs[i])
		p.lbs[l.ID] = l
		touched[l.ID] = true
	}
	for i := range s.FIPs {
		f := s.FIPs[i]
		p.setFIP(&f, touched)
	}
	for id := range touched {
		p.refreshLB(id)
	}
	if len(p.els) <= inPlaceMax {
		err := p.syncInPlace(ctx)
		if err == nil {
			return p.afterSync(ctx)
		}
		p.log.Info("load balancers: in-place sync failed; filling the other generation", "err", err)
	}
	// Reading tens of thousands of elements back takes the kernel seconds
	// (a dump restarts its hash walk per message); writing them takes
	// less. So the sets are filled anew in the other generation, and one
	// transaction switches the rules to it: atomic for traffic, and
	// nothing stale can survive.
	if err := p.read(ctx, false); err != nil {
		return err
	}
	// The skeleton first: someone may have deleted the table.
	if err := p.writeSkeleton(ctx, p.gens.Current(), ""); err != nil {
		return err
	}
	fill := func() error {
		for e := range p.els {
			p.pending[e] = true
		}
		p.syncing = true
		defer func() { p.syncing = false }()
		return p.commit(ctx)
	}
	switchTo := func(gen, old string) error { return p.writeSkeleton(ctx, gen, old) }
	if err := p.gens.Rebuild(ctx, p.nft.NewTransaction, p.runNft, fill, switchTo); err != nil {
		return err
	}
	return p.afterSync(ctx)
}

// inPlaceMax bounds the elements a Sync reads back to change the sets in
// place; above it, Sync fills the other generation (see Sync).
const inPlaceMax = 10000

// syncInPlace reads the sets of the current generation back and changes
// only the elements that differ, in place: what a restarted agent finds
// already right is never removed and added back (nothing flushed and
// refilled). It fails when the sets are not there (the table deleted):
// then Sync rebuilds them in the other generation.
func (p *Path) syncInPlace(ctx context.Context) error {
	if err := p.read(ctx, true); err != nil {
		return err
	}
	if err := p.writeSkeleton(ctx, p.gens.Current(), ""); err != nil {
		return err
	}
	for e := range p.els {
		p.pending[e] = true
	}
	p.syncing = true
	err := p.commit(ctx)
	p.syncing = false
	return err
}

// afterSync removes the pick chains and affinity entries no load balancer
// of the synced state wants.
func (p *Path) afterSync(ctx context.Context) error {
	if err := p.gcChains(ctx); err != nil {
		return err
	}
	keep := map[string]bool{}
	for _, l := range p.lbs {
		if l.Affinity == 0 {
			continue
		}
		for _, t := range affinityTails(l, p.fipAddrs(l), p.cfg.NodeAddrs) {
			keep[t] = true
		}
	}
	return p.purge(func(tail string) bool { return !keep[tail] })
}

// readKernel refreshes the kernel side of the record (each element's
// slot in els, the pick chains, the routes) from the kernel.
func (p *Path) readKernel(ctx context.Context) error {
	return p.read(ctx, true)
}

// read refreshes the kernel side of the record: pick chains and routes,
// and elements when elements is set (else no element is recorded as in
// the kernel).
func (p *Path) read(ctx context.Context, elements bool) error {
	have := map[elem]string{}
	replaced := false
	defer func() {
		// Once the elements are read, they (and the routes read after
		// them) replace the kernel state of every element.
		if replaced {
			p.clearHave()
			for e, v := range have {
				p.setHave(e, true, v)
			}
		}
	}()
	for s := range numSets {
		if !elements {
			break
		}
		els, err := p.r.GetSetElements(p.gens.Set(s))
		if err != nil {
			return fmt.Errorf("lbpath: list %s: %w", setDefs[s].name, err)
		}
		for _, el := range els {
			val := string(el.Val)
			have[elem{uint8(s), string(el.Key)}] = val
		}
	}
	replaced = true
	// Through netlink: `nft list chains` loads every element of the
	// table first, seconds at tens of thousands.
	chains, err := p.r.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return fmt.Errorf("lbpath: list chains: %w", err)
	}
	p.chains = map[string]bool{}
	for _, c := range chains {
		if c.Table != nil && c.Table.Name == p.cfg.Table && strings.HasPrefix(c.Name, "pick-") {
			p.chains[c.Name] = true
		}
	}
	rs, err := p.listRoutes()
	if err != nil {
		return err
	}
	for _, r := range rs {
		a, ok := netip.AddrFromSlice(r.Dst.IP.To4())
		if !ok {
			continue
		}
		l, err := p.nlh.LinkByIndex(r.LinkIndex)
		if err != nil {
			continue
		}
		have[routeElem(l.Attrs().Name, a)] = ""
	}
	return nil
}

// listRoutes returns our FIP routes (by protocol tag), retrying a dump
// the kernel interrupted.
func (p *Path) listRoutes() ([]netlink.Route, error) {
	filter := &netlink.Route{Table: unix.RT_TABLE_LOCAL, Protocol: netlink.RouteProtocol(p.cfg.RouteProtocol)}
	for range 5 {
		rs, err := p.nlh.RouteListFiltered(netlink.FAMILY_V4, filter, netlink.RT_FILTER_TABLE|netlink.RT_FILTER_PROTOCOL)
		if errors.Is(err, netlink.ErrDumpInterrupted) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("lbpath: list routes: %w", err)
		}
		return rs, nil
	}
	return nil, fmt.Errorf("lbpath: list routes: %w", netlink.ErrDumpInterrupted)
}

// readKernelLocked is readKernel under mu.
func (p *Path) readKernelLocked(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.readKernel(ctx)
}

// Counts reports how many elements the kernel holds per set and how many
// pick chains exist, as last read or written.
func (p *Path) Counts() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[string]int{"chains": len(p.chains)}
	for e, sl := range p.els {
		if !sl.in {
			continue
		}
		if e.set == setRoute {
			out["routes"]++
		} else {
			out[setDefs[e.set].name]++
		}
	}
	return out
}

// ErrDrift is returned by Check when the kernel lacks what this Path
// wrote (a table deleted or flushed by someone else): call Sync.
var ErrDrift = errors.New("lbpath: the kernel lacks objects this path wrote")

// Check compares the table's chains and sets with what this Path wrote,
// through two small netlink listings (no element is read). It does not
// notice single elements removed by hand; Sync repairs those.
func (p *Path) Check(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("lbpath: %w", err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	chains, err := p.r.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return fmt.Errorf("lbpath: list chains: %w", err)
	}
	have := map[string]bool{}
	for _, c := range chains {
		if c.Table != nil && c.Table.Name == p.cfg.Table {
			have[c.Name] = true
		}
	}
	for _, c := range append(slices.Clone(baseChains), emptyChain) {
		if !have[c] {
			return fmt.Errorf("%w: chain %s", ErrDrift, c)
		}
	}
	for c := range p.chains {
		if !have[c] {
			return fmt.Errorf("%w: chain %s", ErrDrift, c)
		}
	}
	sets, err := p.r.GetSets(p.tbl)
	if err != nil {
		return fmt.Errorf("%w: list sets: %v", ErrDrift, err)
	}
	if name := p.gens.Missing(sets); name != "" {
		return fmt.Errorf("%w: set %s", ErrDrift, name)
	}
	return nil
}
