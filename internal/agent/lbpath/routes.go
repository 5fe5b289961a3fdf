package lbpath

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// syncRoutes adds and removes local routes: a FIP's on the external
// interface, an on-link VIP's on its bridge. The kernel answers ARP for a
// local address on every interface; the route also makes the host the
// destination of what no DNAT rule claims, which the input chain rejects
// for FIPs.
func (p *Path) syncRoutes(ops []op) error {
	var errs []error
	for _, o := range ops {
		iface, a := routeOf(o.e)
		link, err := p.nlh.LinkByName(iface)
		if err != nil {
			if o.del {
				p.setHave(o.e, false, "") // gone with its interface
			} else {
				errs = append(errs, fmt.Errorf("route %v on %s: %w", a, iface, err))
			}
			continue
		}
		r := p.localRoute(a, link.Attrs().Index)
		if o.del {
			if err := p.nlh.RouteDel(r); err != nil && !errors.Is(err, unix.ESRCH) {
				errs = append(errs, fmt.Errorf("delete route %v on %s: %w", a, iface, err))
				continue
			}
			p.setHave(o.e, false, "")
		} else {
			if err := p.nlh.RouteReplace(r); err != nil {
				errs = append(errs, fmt.Errorf("add route %v on %s: %w", a, iface, err))
				continue
			}
			p.setHave(o.e, true, "")
		}
	}
	if len(errs) > 0 {
		for _, o := range ops {
			p.pending[o.e] = true
		}
		return fmt.Errorf("lbpath: local routes: %w", errors.Join(errs...))
	}
	return nil
}

func (p *Path) localRoute(a netip.Addr, ix int) *netlink.Route {
	return &netlink.Route{LinkIndex: ix, Dst: netlinkHost(a), Table: unix.RT_TABLE_LOCAL,
		Type: unix.RTN_LOCAL, Scope: netlink.SCOPE_HOST, Protocol: netlink.RouteProtocol(p.cfg.RouteProtocol)}
}

func netlinkHost(a netip.Addr) *net.IPNet {
	b := a.As4()
	return &net.IPNet{IP: net.IP(b[:]), Mask: net.CIDRMask(32, 32)}
}

// ensureServiceRoutes adds or repairs the routes of Config.ServiceRoutes.
func (p *Path) ensureServiceRoutes() error {
	if len(p.cfg.ServiceRoutes) == 0 {
		return nil
	}
	lo, err := p.nlh.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("lbpath: service routes: %w", err)
	}
	for _, pfx := range p.cfg.ServiceRoutes {
		r := &netlink.Route{LinkIndex: lo.Attrs().Index, Dst: netipNet(pfx.Masked()), Scope: netlink.SCOPE_LINK,
			Protocol: netlink.RouteProtocol(p.cfg.RouteProtocol)}
		if p.cfg.NodeIP.IsValid() {
			r.Src = net.IP(p.cfg.NodeIP.AsSlice())
		}
		if err := p.nlh.RouteReplace(r); err != nil {
			return fmt.Errorf("lbpath: service route %v: %w", pfx, err)
		}
	}
	return nil
}

func netipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}
