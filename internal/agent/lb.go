package agent

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"maps"
	"net/netip"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"time"

	"kurma.dev/kurma/internal/agent/lbpath"
	"kurma.dev/kurma/pkg/controllerapi"
)

// LBPath is what the agent needs from the load-balancer datapath;
// *lbpath.Path implements it.
type LBPath interface {
	// Apply makes incremental changes live (one transaction).
	Apply(ctx context.Context, ch lbpath.Changes) error
	// Sync makes the kernel equal s, removing whatever is stale.
	Sync(ctx context.Context, s lbpath.State) error
}

var _ LBPath = (*lbpath.Path)(nil)

// lbWatcher is the part of the controller API that streams load
// balancers and floating IPs; *controllerapi.Client implements it.
type lbWatcher interface {
	WatchLoadBalancers(ctx context.Context, since int64) iter.Seq2[controllerapi.Event, error]
}

// bridgeNamer names a VPC's bridge; *datapath.Datapath implements it.
type bridgeNamer interface {
	BridgeName(vni uint32) string
}

// lbKey is the one queue key of the load-balancer datapath: every sync
// drains all pending changes into one transaction.
const lbKey = "l/"

// lbCheckKey queues the periodic check that the kernel still holds the
// load-balancer table (resync); drift makes the next sync a full one.
const lbCheckKey = "L/"

// lbChecker is implemented by datapaths that can tell cheaply whether
// their kernel objects are still there; *lbpath.Path implements it.
type lbChecker interface {
	Check(ctx context.Context) error
}

var _ lbChecker = (*lbpath.Path)(nil)

// checkLBs asks for a full sync when the kernel lost what we wrote (the
// table deleted or flushed by someone else).
func (a *Agent) checkLBs(ctx context.Context) error {
	a.hc.apply() // health check ports whose listen failed are tried again
	ch, ok := a.cfg.LB.(lbChecker)
	if !ok {
		return nil
	}
	err := ch.Check(ctx)
	if errors.Is(err, lbpath.ErrDrift) {
		a.log.Warn("load-balancer table drifted; full sync", "err", err)
		a.lb.mu.Lock()
		a.lb.full = true
		a.lb.mu.Unlock()
		a.q.Add(lbKey)
		return nil
	}
	return err
}

// lbCache is the agent's copy of every load balancer and floating IP, what
// it last programmed, and what it last saw of the ports and VPCs (which
// decide what this host programs). mu guards every field; it is never
// held across a datapath call, nor while another of the agent's locks is
// taken.
type lbCache struct {
	mu        sync.Mutex
	lbs       map[string]*lbRec
	fips      map[string]*controllerapi.FloatingIP
	dirtyLB   map[string]bool
	dirtyFIP  map[string]bool
	full      bool                  // the next sync is a full Sync
	progLB    map[string]bool       // load balancers programmed here
	progFIP   map[string]lbpath.FIP // floating IPs programmed here, as programmed
	localVNIs map[uint32]string     // VPCs with a local port at the last sync: their bridges' subnets (bridgeNets as a key)
	// bridgeNets are the subnets each of those VPCs' bridge carries a
	// gateway of (a VIP inside one is on-link).
	bridgeNets map[uint32][]netip.Prefix
	local      map[string]bool // local ports at the last sync

	seen chan struct{} // closed after the first load balancer list
	done chan struct{} // closed after the first full load balancer sync
}

// listed reports whether the first load balancer listing is in.
func (c *lbCache) listed() bool { return isClosed(c.seen) }

// programmed reports whether the first full sync is done.
func (c *lbCache) programmed() bool { return isClosed(c.done) }

func newLBCache() *lbCache {
	return &lbCache{lbs: map[string]*lbRec{}, fips: map[string]*controllerapi.FloatingIP{},
		dirtyLB: map[string]bool{}, dirtyFIP: map[string]bool{}, full: true,
		progLB: map[string]bool{}, progFIP: map[string]lbpath.FIP{}, localVNIs: map[uint32]string{},
		bridgeNets: map[uint32][]netip.Prefix{}, seen: make(chan struct{}), done: make(chan struct{})}
}

// lbRec is the agent's record of a load balancer: what it programs,
// converted once when the event arrives, without the controller's other
// fields. The controller refuses what the datapath cannot take
// (controllerapi's load balancer contract), so nothing is dropped here
// but what an older controller may have stored. The cache holds every
// load balancer of the controller.
type lbRec struct {
	id        string
	rev       int64
	vni       uint32
	vip       netip.Addr // invalid unless IPv4
	listeners []lbpath.Listener
	members   []lbpath.Member
	affinity  time.Duration
	// Host-level frontends and traffic policies (controllerapi.Policy).
	hostAccess                   bool
	external                     []netip.Addr
	externalLocal, internalLocal bool
	hcNodePort                   uint16
	name                         string // only with hcNodePort (its health check names it)
}

// hostLevel reports whether every agent programs the load balancer, not
// only those with a port in its VPC.
func (r *lbRec) hostLevel() bool {
	return r.hostAccess || len(r.external) > 0 || slices.ContainsFunc(r.listeners, func(l lbpath.Listener) bool { return l.NodePort != 0 })
}

// recOf converts a load balancer for the agent of host hostID (which
// decides which members are local).
func recOf(l *controllerapi.LoadBalancer, hostID string) *lbRec {
	r := &lbRec{id: l.ID, rev: l.RevisionNumber, vni: l.VNI, hostAccess: l.HostAccess,
		externalLocal: l.ExternalLocal, internalLocal: l.InternalLocal}
	if vip, err := netip.ParseAddr(l.VIPAddress); err == nil && vip.Is4() {
		r.vip = vip
	}
	keys := map[string]lbpath.ListenerKey{}
	for _, ls := range l.Listeners {
		p := controllerapi.ProtocolNumber(ls.Protocol)
		if p == 0 || ls.Port < 1 || ls.Port > 65535 || ls.TargetPort < 0 || ls.TargetPort > 65535 || ls.NodePort < 0 || ls.NodePort > 65535 {
			continue
		}
		k := lbpath.ListenerKey{Proto: p, Port: uint16(ls.Port)}
		keys[ls.Key()] = k
		r.listeners = append(r.listeners, lbpath.Listener{Proto: p, Port: k.Port, TargetPort: uint16(ls.TargetPort), NodePort: uint16(ls.NodePort)})
	}
	if len(l.Members) > 0 {
		r.members = make([]lbpath.Member, 0, len(l.Members))
	}
	for _, m := range l.Members {
		addr, err := netip.ParseAddr(m.Address)
		if err != nil || !addr.Is4() || m.Port < 0 || m.Port > 65535 {
			continue
		}
		lm := lbpath.Member{Addr: addr, Port: uint16(m.Port), Local: m.HostID != "" && m.HostID == hostID, Backup: m.Backup}
		for _, n := range m.Listeners {
			if k, ok := keys[n]; ok {
				lm.Serves = append(lm.Serves, k)
			}
		}
		if len(m.Listeners) > 0 && len(lm.Serves) == 0 {
			continue // serves no listener we know
		}
		r.members = append(r.members, lm)
	}
	for _, s := range l.ExternalAddresses {
		if a, err := netip.ParseAddr(s); err == nil && a.Is4() {
			r.external = append(r.external, a)
		}
	}
	if l.ExternalLocal && l.HealthCheckNodePort > 0 && l.HealthCheckNodePort <= 65535 {
		r.hcNodePort, r.name = uint16(l.HealthCheckNodePort), l.Name
	}
	if sp := l.SessionPersistence; sp != nil && sp.Type == controllerapi.PersistenceSourceIP {
		t := sp.Timeout
		if t <= 0 {
			t = controllerapi.DefaultAffinityTimeout
		}
		r.affinity = time.Duration(t) * time.Second
	}
	return r
}

// lbEnabled reports whether the agent programs load balancers.
func (a *Agent) lbEnabled() bool {
	_, w := a.c.(lbWatcher)
	_, b := a.dp.(bridgeNamer)
	return a.cfg.LB != nil && w && b
}

// watchLBs keeps the load balancer and floating IP cache from the
// controller's feed: events mark objects dirty; the listing that opens
// every (re)connect drops what it did not list and asks for a full sync.
func (a *Agent) watchLBs(ctx context.Context) {
	w := a.c.(lbWatcher)
	a.run(ctx, stream{
		name: "loadbalancer",
		open: func(ctx context.Context, _ int64) iter.Seq2[controllerapi.Event, error] {
			return w.WatchLoadBalancers(ctx, 0)
		},
		apply: func(ev controllerapi.Event, listing bool) string {
			c := a.lb
			c.mu.Lock()
			defer c.mu.Unlock()
			switch {
			case ev.LoadBalancer != nil && ev.LoadBalancer.ID != "":
				l := ev.LoadBalancer
				if old := c.lbs[l.ID]; old != nil && old.rev > l.RevisionNumber && ev.Type != controllerapi.EventDeleted {
					return "lb:" + l.ID
				}
				if ev.Type == controllerapi.EventDeleted {
					delete(c.lbs, l.ID)
				} else {
					c.lbs[l.ID] = recOf(l, a.cfg.HostID)
				}
				c.dirtyLB[l.ID] = true
				// Its FIPs gain or lose their target.
				for id, f := range c.fips {
					if f.LoadBalancerID == l.ID {
						c.dirtyFIP[id] = true
					}
				}
				if !listing {
					a.q.Add(lbKey)
				}
				return "lb:" + l.ID
			case ev.FloatingIP != nil && ev.FloatingIP.ID != "":
				f := ev.FloatingIP
				if old := c.fips[f.ID]; old != nil && old.RevisionNumber > f.RevisionNumber && ev.Type != controllerapi.EventDeleted {
					return "fip:" + f.ID
				}
				if ev.Type == controllerapi.EventDeleted {
					delete(c.fips, f.ID)
				} else {
					cp := *f
					c.fips[f.ID] = &cp
				}
				c.dirtyFIP[f.ID] = true
				if !listing {
					a.q.Add(lbKey)
				}
				return "fip:" + f.ID
			}
			return ""
		},
		listed: func(_ context.Context, seen map[string]bool) {
			c := a.lb
			c.mu.Lock()
			for id := range c.lbs {
				if !seen["lb:"+id] {
					delete(c.lbs, id)
				}
			}
			for id := range c.fips {
				if !seen["fip:"+id] {
					delete(c.fips, id)
				}
			}
			c.full = true
			if !isClosed(c.seen) {
				close(c.seen)
			}
			c.mu.Unlock()
			a.q.Add(lbKey)
		},
	})
}

// syncLBs programs what changed since the last sync in one transaction,
// or, after a (re)listing or a failure, the whole state (which also
// removes whatever a previous run left and the controller no longer has).
func (a *Agent) syncLBs(ctx context.Context) error {
	bn := a.dp.(bridgeNamer)
	ports, _ := a.ports.localIDs()
	nets := a.ports.bridgeNets()
	local := map[uint32]string{}
	for vni, ps := range nets {
		local[vni] = prefixKey(ps)
	}
	c := a.lb
	c.mu.Lock()
	c.local, c.bridgeNets = ports, nets
	if !maps.Equal(local, c.localVNIs) {
		for id, l := range c.lbs {
			old, was := c.localVNIs[l.vni]
			now, is := local[l.vni]
			if was != is || old != now {
				c.dirtyLB[id] = true
			}
		}
		c.localVNIs = local
	}
	// Port FIPs follow their port's host; mark those whose answer changed.
	for id, f := range c.fips {
		if _, ok := a.fipSpecLocked(f, bn); ok != (c.progFIP[id] != lbpath.FIP{}) {
			c.dirtyFIP[id] = true
		}
	}
	full := c.full
	var st lbpath.State
	var ch lbpath.Changes
	// Updated in place (no copy: O(changed) per sync); after a failure the
	// next sync is a full one, which rebuilds them.
	progLB, progFIP := c.progLB, c.progFIP
	if full {
		progLB, progFIP = map[string]bool{}, map[string]lbpath.FIP{}
		a.hc.retain(func(id string) bool { return c.lbs[id] != nil })
		for _, l := range c.lbs {
			a.hc.set(l.id, l)
			if spec, ok := a.lbSpecLocked(l, bn); ok {
				st.LBs = append(st.LBs, spec)
				progLB[l.id] = true
			}
		}
		for _, f := range c.fips {
			if spec, ok := a.fipSpecLocked(f, bn); ok {
				st.FIPs = append(st.FIPs, spec)
				progFIP[f.ID] = spec
			}
		}
	} else {
		for id := range c.dirtyLB {
			l := c.lbs[id]
			a.hc.set(id, l)
			spec, ok := lbpath.LB{}, false
			if l != nil {
				spec, ok = a.lbSpecLocked(l, bn)
			}
			switch {
			case ok:
				ch.LBs = append(ch.LBs, spec)
				progLB[id] = true
			case progLB[id]:
				ch.DeleteLBs = append(ch.DeleteLBs, id)
				delete(progLB, id)
			}
		}
		for id := range c.dirtyFIP {
			f := c.fips[id]
			spec, ok := lbpath.FIP{}, false
			if f != nil {
				spec, ok = a.fipSpecLocked(f, bn)
			}
			switch {
			case ok && spec != progFIP[id]:
				ch.FIPs = append(ch.FIPs, spec)
				progFIP[id] = spec
			case !ok && progFIP[id] != lbpath.FIP{}:
				ch.DeleteFIP = append(ch.DeleteFIP, id)
				delete(progFIP, id)
			}
		}
	}
	clear(c.dirtyLB)
	clear(c.dirtyFIP)
	c.full = false
	c.mu.Unlock()

	var err error
	switch {
	case full:
		err = a.cfg.LB.Sync(ctx, st)
	case len(ch.LBs)+len(ch.DeleteLBs)+len(ch.FIPs)+len(ch.DeleteFIP) > 0:
		err = a.cfg.LB.Apply(ctx, ch)
	}
	c.mu.Lock()
	if err != nil {
		// What was applied is unknown: the retry converges from the kernel.
		c.full = true
		c.mu.Unlock()
		return fmt.Errorf("load balancers: %w", err)
	}
	c.progLB, c.progFIP = progLB, progFIP
	if full && !isClosed(c.done) {
		close(c.done)
	}
	c.mu.Unlock()
	a.hc.apply()
	if full {
		a.log.Info("load balancers synced", "lbs", len(st.LBs), "fips", len(st.FIPs))
	}
	if len(st.LBs) >= 1000 || len(ch.LBs) >= 1000 {
		// A large sync builds its whole transaction in memory (several
		// times the steady state at tens of thousands); give it back.
		debug.FreeOSMemory()
	}
	return nil
}

// lbSpecLocked converts a load balancer this host must program: one of a
// VPC with a local port (its VIP answers on the VPC's bridge), or one
// with host-level frontends. The spec shares the record's slices (the
// datapath copies what it keeps). Callers hold a.lb.mu.
func (a *Agent) lbSpecLocked(l *lbRec, bn bridgeNamer) (lbpath.LB, bool) {
	_, local := a.lb.localVNIs[l.vni]
	if !l.vip.Is4() || !local && !l.hostLevel() {
		return lbpath.LB{}, false
	}
	spec := lbpath.LB{ID: l.id, VIP: l.vip, Listeners: l.listeners, Members: l.members,
		Affinity: l.affinity, HostAccess: l.hostAccess, External: l.external,
		ExternalLocal: l.externalLocal, InternalLocal: l.internalLocal}
	if local {
		spec.Iface = bn.BridgeName(l.vni)
		// A VIP inside a subnet of this host's bridge is ARPed for by its pods.
		for _, pfx := range a.lb.bridgeNets[l.vni] {
			if pfx.Contains(l.vip) {
				spec.OnLink = true
			}
		}
	}
	if spec.Validate() != nil {
		return lbpath.LB{}, false
	}
	return spec, true
}

// fipSpecLocked converts a floating IP this host must answer for: one
// associated with a local port, or with a load balancer programmed here.
// Callers hold a.lb.mu.
func (a *Agent) fipSpecLocked(f *controllerapi.FloatingIP, bn bridgeNamer) (lbpath.FIP, bool) {
	addr, err := netip.ParseAddr(f.FloatingIPAddress)
	if err != nil || !addr.Is4() {
		return lbpath.FIP{}, false
	}
	spec := lbpath.FIP{ID: f.ID, Addr: addr}
	switch {
	case f.PortID != "":
		if !a.lb.local[f.PortID] {
			return lbpath.FIP{}, false
		}
		fixed, err := netip.ParseAddr(f.FixedIPAddress)
		if err != nil || !fixed.Is4() {
			return lbpath.FIP{}, false
		}
		spec.PortAddr = fixed
	case f.LoadBalancerID != "":
		l := a.lb.lbs[f.LoadBalancerID]
		if l == nil {
			return lbpath.FIP{}, false
		}
		if _, ok := a.lbSpecLocked(l, bn); !ok {
			return lbpath.FIP{}, false
		}
		spec.LBID = l.id
	default:
		return lbpath.FIP{}, false
	}
	return spec, spec.Validate() == nil
}

// prefixKey is a sorted prefix list as one comparable string.
func prefixKey(ps []netip.Prefix) string {
	var b strings.Builder
	for _, p := range ps {
		b.WriteString(p.String())
		b.WriteByte(',')
	}
	return b.String()
}
