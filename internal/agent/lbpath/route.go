package lbpath

import (
	"net"
	"net/netip"
)

func netlinkHost(a netip.Addr) *net.IPNet {
	b := a.As4()
	return &net.IPNet{IP: net.IP(b[:]), Mask: net.CIDRMask(32, 32)}
}
