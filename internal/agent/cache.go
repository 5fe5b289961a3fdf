package agent

import (
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"kurma.dev/kurma/internal/agent/datapath"
	"kurma.dev/kurma/pkg/controllerapi"
)

// portCache is the agent's copy of the controller's view of this host:
// its ports and the other ports of its VPCs, every host's underlay
// address, and the subnets fetched for fixed IPs that lack their cidr. It
// holds the controller's records as sent (an attachment's namespace is
// not written into them: see Agent.place), and what the port syncs
// between an urgent plug and its report need. Its lock is never held
// across a network or netlink call, nor while another of the agent's
// locks is taken.
type portCache struct {
	hostID string

	mu         sync.Mutex                       // guards every field below but synced
	ports      map[string]*controllerapi.Port   // by id
	hosts      map[string]net.IP                // underlay address by host id
	subnets    map[string]*controllerapi.Subnet // fetched when a fixed IP lacks its cidr
	unreported map[string]string                // ports an urgent sync plugged, by namespace: their status report follows
	plugged    map[string]plugMark              // what each local port was last plugged as, and when

	synced    chan struct{} // closed after the first port list
	hostsSeen chan struct{} // closed after the first host list
}

func newPortCache(hostID string) *portCache {
	return &portCache{hostID: hostID,
		ports: map[string]*controllerapi.Port{}, hosts: map[string]net.IP{},
		subnets: map[string]*controllerapi.Subnet{}, unreported: map[string]string{}, plugged: map[string]plugMark{},
		synced: make(chan struct{}), hostsSeen: make(chan struct{})}
}

func (c *portCache) isLocal(p *controllerapi.Port) bool { return p.BindingHostID == c.hostID }

func (c *portCache) isSynced() bool { return isClosed(c.synced) }

// hostsListed reports whether the first host listing is in.
func (c *portCache) hostsListed() bool { return isClosed(c.hostsSeen) }

// isClosed reports whether ch is closed.
func isClosed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// get returns a copy of a cached port.
func (c *portCache) get(id string) (controllerapi.Port, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.ports[id]
	if p == nil {
		return controllerapi.Port{}, false
	}
	return *p, true
}

// upsert stores a copy of p unless the cache has a newer revision; it
// returns the version it replaced.
func (c *portCache) upsert(p *controllerapi.Port) (old *controllerapi.Port, stored bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	old = c.ports[p.ID]
	if old != nil && old.RevisionNumber > p.RevisionNumber {
		return old, false
	}
	cp := *p
	c.ports[p.ID] = &cp
	return old, true
}

// remove drops a deleted port, and with it the VPC's remote ports when it
// was the VPC's last local port: the controller stops sending their
// events at the same point of the stream (and sends them again, listed,
// when a local port brings the VPC back). It returns the version it had.
func (c *portCache) remove(p *controllerapi.Port) *controllerapi.Port {
	c.mu.Lock()
	defer c.mu.Unlock()
	old := c.ports[p.ID]
	delete(c.ports, p.ID)
	if !c.isLocal(p) || p.VNI == 0 {
		return old
	}
	for _, q := range c.ports {
		if q.VNI == p.VNI && c.isLocal(q) {
			return old
		}
	}
	for id, q := range c.ports {
		if q.VNI == p.VNI {
			delete(c.ports, id)
		}
	}
	return old
}

// retain drops the ports a listing did not return and marks the cache
// synced; it returns what it dropped, whether this was the first
// listing, and how many ports are left.
func (c *portCache) retain(seen map[string]bool) (gone []*controllerapi.Port, first bool, n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for id, p := range c.ports {
		if !seen[id] {
			gone = append(gone, p)
			delete(c.ports, id)
		}
	}
	if !c.isSynced() {
		close(c.synced)
		first = true
	}
	return gone, first, len(c.ports)
}

// storeReport stores the controller's answer to a status report, unless
// the cache has a newer revision or no longer has the port.
func (c *portCache) storeReport(np *controllerapi.Port) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if old := c.ports[np.ID]; old != nil && old.RevisionNumber <= np.RevisionNumber {
		cp := *np
		c.ports[np.ID] = &cp
	}
}

// takeUnreported returns and forgets the namespace an urgent sync plugged
// a port into, if its report is still to follow.
func (c *portCache) takeUnreported(id string) (netns string, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	netns, ok = c.unreported[id]
	delete(c.unreported, id)
	return netns, ok
}

func (c *portCache) setUnreported(id, netns string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.unreported[id] = netns
}

// plugMark is what a port was last plugged as (its spec in a comparable
// form, and the index of its VPC's bridge then) and when.
type plugMark struct {
	print  string
	bridge int
	at     time.Time
}

// markPlugged records a successful plug.
func (c *portCache) markPlugged(id string, m plugMark) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.plugged[id] = m
}

// unmarkPlugged forgets a port's plug: its next sync plugs it in full.
func (c *portCache) unmarkPlugged(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.plugged, id)
}

// pluggedAs reports whether the port's last plug was of the same spec
// and bridge, less than maxAge ago.
func (c *portCache) pluggedAs(id string, m plugMark, maxAge time.Duration) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	have, ok := c.plugged[id]
	return ok && have.print == m.print && have.bridge == m.bridge && m.at.Sub(have.at) < maxAge
}

// local returns copies of the local ports of VPC vni, their fixed IPs
// completed from the subnet cache.
func (c *portCache) local(vni uint32) []controllerapi.Port {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []controllerapi.Port
	for _, p := range c.ports {
		if c.isLocal(p) && p.VNI == vni {
			out = append(out, c.withSubnetsLocked(p))
		}
	}
	return out
}

// localIDs returns the ids of the local ports and the VPCs they are in.
func (c *portCache) localIDs() (ids map[string]bool, vnis map[uint32]bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ids, vnis = map[string]bool{}, map[uint32]bool{}
	for id, p := range c.ports {
		if c.isLocal(p) {
			ids[id] = true
			if p.VNI != 0 {
				vnis[p.VNI] = true
			}
		}
	}
	return ids, vnis
}

// remotes returns the datapath entries of VPC vni's ports on other hosts
// (those the cache can describe), and for each of them a spec holding
// only its addresses with their subnets' gateways (for gatewaysOf).
func (c *portCache) remotes(vni uint32) ([]datapath.Remote, []datapath.PortSpec) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var (
		remotes []datapath.Remote
		gws     []datapath.PortSpec
	)
	for _, p := range c.ports {
		if p.VNI != vni || c.isLocal(p) {
			continue
		}
		if r, ok := toRemote(p, c.hosts[p.BindingHostID]); ok {
			remotes = append(remotes, r)
		}
		cp := c.withSubnetsLocked(p)
		var s datapath.PortSpec
		for _, f := range cp.FixedIPs {
			if pa, err := toPortAddr(p.ID, f); err == nil {
				s.Addrs = append(s.Addrs, pa)
			}
		}
		gws = append(gws, s)
	}
	return remotes, gws
}

// guards returns the anti-spoofing guards of the local ports.
func (c *portCache) guards() []datapath.Guard {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []datapath.Guard
	for _, p := range c.ports {
		if !c.isLocal(p) {
			continue
		}
		if g, ok := toGuard(p); ok {
			out = append(out, g)
		}
	}
	return out
}

// hasSubnet reports whether the cache can complete fixed IPs of subnet id.
func (c *portCache) hasSubnet(id string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.subnets[id] != nil
}

func (c *portCache) putSubnet(id string, s *controllerapi.Subnet) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.subnets[id] = s
}

// withSubnets returns a copy of p whose fixed IPs have their cidr and
// gateway filled from the subnet cache where the controller left them out.
func (c *portCache) withSubnets(p *controllerapi.Port) controllerapi.Port {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.withSubnetsLocked(p)
}

func (c *portCache) withSubnetsLocked(p *controllerapi.Port) controllerapi.Port {
	cp := *p
	cp.FixedIPs = append([]controllerapi.FixedIP(nil), p.FixedIPs...)
	for i, f := range cp.FixedIPs {
		if s := c.subnets[f.SubnetID]; f.CIDR == "" && s != nil {
			cp.FixedIPs[i].CIDR, cp.FixedIPs[i].GatewayIP = s.CIDR, s.GatewayIP
		}
	}
	return cp
}

// setHost records a host's underlay address (nil: the host is gone).
func (c *portCache) setHost(id string, ip net.IP) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if ip == nil {
		delete(c.hosts, id)
	} else {
		c.hosts[id] = ip
	}
}

// retainHosts drops the hosts a listing did not return and marks the
// hosts listed; it reports whether this was the first listing.
func (c *portCache) retainHosts(seen map[string]bool) (first bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for id := range c.hosts {
		if !seen[id] {
			delete(c.hosts, id)
		}
	}
	if !isClosed(c.hostsSeen) {
		close(c.hostsSeen)
		first = true
	}
	return first
}

// bridgeNets returns, for each VPC with a local port, the subnets whose
// gateway its bridge carries: those of its ports, local and remote, as
// ensureVPC computes them, but from the cache alone, so that a restarted
// agent finds a VIP on-link before its VPCs are ensured again (its local
// route is never removed and added back).
func (c *portCache) bridgeNets() map[uint32][]netip.Prefix {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[uint32][]netip.Prefix{}
	for _, p := range c.ports {
		if c.isLocal(p) && p.VNI != 0 {
			out[p.VNI] = nil
		}
	}
	for _, p := range c.ports {
		if _, ok := out[p.VNI]; !ok {
			continue
		}
		for _, f := range c.withSubnetsLocked(p).FixedIPs {
			pfx, err := netip.ParsePrefix(f.CIDR)
			if err != nil || f.GatewayIP == "" {
				continue
			}
			if pfx = pfx.Masked(); !slices.Contains(out[p.VNI], pfx) {
				out[p.VNI] = append(out[p.VNI], pfx)
			}
		}
	}
	for _, ps := range out {
		slices.SortFunc(ps, func(x, y netip.Prefix) int { return strings.Compare(x.String(), y.String()) })
	}
	return out
}
