package lbpath

import (
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"time"

	"github.com/vishvananda/netlink"

	"kurma.dev/kurma/internal/agent/nfthost"
)

// closeWaitSysctl is conntrack's timeout of TCP connections in
// CLOSE_WAIT (per network namespace).
const closeWaitSysctl = "/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_close_wait"

// setCloseWait writes d, in whole seconds, to closeWaitSysctl in the
// namespace at hostNS; d <= 0 leaves it alone.
func setCloseWait(hostNS string, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	secs := strconv.Itoa(int(max(d.Round(time.Second)/time.Second, 1)))
	err := nfthost.InHost(hostNS, func() error { return os.WriteFile(closeWaitSysctl, []byte(secs), 0o644) })
	if err != nil {
		return fmt.Errorf("lbpath: conntrack close-wait timeout: %w", err)
	}
	return nil
}

// UDP has no connection to end: after a change of members, conntrack
// keeps sending a client's datagrams to the member it first picked, gone
// or not, for as long as the client keeps sending, and datagrams that
// reached a frontend before it had members keep a flow that was never
// NATed. As kube-proxy does, commit deletes those flows once its
// transaction is in: the flows to a frontend whose members lost an
// address and port (from that address and port: a member whose target
// port changed counts as gone), and every flow to a frontend that gets
// its first members.

// staleFlow selects conntrack flows of UDP to frontend dst (any node
// address when dst is invalid) port dport, answered by member (any flow
// when member is invalid).
type staleFlow struct {
	dst    netip.Addr
	dport  uint16
	member netip.AddrPort
}

// staleFlows matches the flows of any of its entries; it implements
// netlink.CustomConntrackFilter.
type staleFlows struct {
	flows     []staleFlow
	nodeAddrs []netip.Addr
}

var _ netlink.CustomConntrackFilter = (*staleFlows)(nil)

func (s *staleFlows) MatchConntrackFlow(f *netlink.ConntrackFlow) bool {
	if f.Forward.Protocol != UDP {
		return false
	}
	dst, ok1 := netip.AddrFromSlice(f.Forward.DstIP.To4())
	src, ok2 := netip.AddrFromSlice(f.Reverse.SrcIP.To4())
	if !ok1 || !ok2 {
		return false
	}
	for _, st := range s.flows {
		if st.dport != f.Forward.DstPort ||
			st.member.IsValid() && (st.member.Addr() != src || st.member.Port() != f.Reverse.SrcPort) {
			continue
		}
		if st.dst == dst || !st.dst.IsValid() && containsAddr(s.nodeAddrs, dst) {
			return true
		}
	}
	return false
}

func containsAddr(as []netip.Addr, a netip.Addr) bool {
	for _, x := range as {
		if x == a {
			return true
		}
	}
	return false
}

// frontendOf decodes a UDP frontend from the key of a class or backend
// element (the backend keys end with the member index): its address
// (invalid for a node port) and port. ok is false for other protocols
// and sets.
func frontendOf(e elem) (dst netip.Addr, port uint16, ok bool) {
	k := e.key
	switch e.set {
	case setSvc, setBackend: // ifname(16) . addr . proto . port
		k = k[16:]
		fallthrough
	case setExt, setExtBackend: // addr . proto . port
		if len(k) < 12 || k[4] != UDP {
			return netip.Addr{}, 0, false
		}
		return getAddr(k), getPort(k[8:]), true
	case setNP, setNPBackend: // proto . port
		if len(k) < 8 || k[0] != UDP {
			return netip.Addr{}, 0, false
		}
		return netip.Addr{}, getPort(k[4:]), true
	}
	return netip.Addr{}, 0, false
}

// staleUDP lists, before commit applies the pending elements, the UDP
// flows that the change leaves stale.
func (p *Path) staleUDP() []staleFlow {
	var out []staleFlow
	seen := map[string]bool{} // backend frontends already compared
	for e := range p.pending {
		dst, port, ok := frontendOf(e)
		if !ok {
			continue
		}
		sl := p.els[e]
		switch {
		case classSet(e.set):
			// First members: the class goes from none or 0 to a count.
			if sl.refs > 0 && classCount(sl.want) > 0 && (!sl.in || classCount(sl.have) == 0) {
				out = append(out, staleFlow{dst: dst, dport: port})
			}
		case backendSet(e.set):
			front := e.key[:len(e.key)-4]
			if seen[front] {
				continue
			}
			seen[front] = true
			had, has := map[netip.AddrPort]bool{}, map[netip.AddrPort]bool{}
			for i := uint32(0); ; i++ {
				s, ok := p.els[elem{e.set, front + string(putMark(nil, i))}]
				if !ok {
					break
				}
				if m, ok := memberOf(s.have); s.in && ok {
					had[m] = true
				}
				if m, ok := memberOf(s.want); s.refs > 0 && ok {
					has[m] = true
				}
			}
			for m := range had {
				if !has[m] {
					out = append(out, staleFlow{dst: dst, dport: port, member: m})
				}
			}
		}
	}
	return out
}

// memberOf decodes a backend element's value (address . port, as
// putPort(putAddr(...)) writes it).
func memberOf(val string) (netip.AddrPort, bool) {
	if len(val) < 6 {
		return netip.AddrPort{}, false
	}
	return netip.AddrPortFrom(getAddr(val), getPort(val[4:])), true
}

// classCount is the member count of a class element's value.
func classCount(val string) int {
	if len(val) != 4 {
		return 0
	}
	return int(getMark(val) & (1<<classBits - 1))
}

// flushUDP deletes the flows stale selects; a failure is logged, not
// returned: the flows then age out as they would without us.
func (p *Path) flushUDP(stale []staleFlow) {
	if len(stale) == 0 {
		return
	}
	n, err := p.nlh.ConntrackDeleteFilters(netlink.ConntrackTable, netlink.FAMILY_V4,
		&staleFlows{flows: stale, nodeAddrs: p.cfg.NodeAddrs})
	if err != nil {
		p.log.Warn("lbpath: delete stale UDP flows", "frontends", len(stale), "err", err)
		return
	}
	if n > 0 {
		p.log.Debug("lbpath: deleted stale UDP flows", "flows", n)
	}
}
