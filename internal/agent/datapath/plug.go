package datapath

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"net"
	"strings"
	"syscall"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"kurma.dev/kurma/pkg/kerrors"
)

// Validate checks a PortSpec before anything is created.
func (p PortSpec) Validate() error {
	if err := ValidatePortID(p.ID); err != nil {
		return err
	}
	if err := ValidateIfName(p.IfName); err != nil {
		return fmt.Errorf("port %s: %w", p.ID, err)
	}
	if p.VNI == 0 || p.VNI > MaxVNI {
		return kerrors.New(kerrors.Invalid, "port %s: vni %d out of range 1-%d", p.ID, p.VNI, MaxVNI)
	}
	if len(p.MAC) != 6 || p.MAC[0]&1 != 0 || isZeroMAC(p.MAC) {
		return kerrors.New(kerrors.Invalid, "port %s: mac %q is not a unicast ethernet address", p.ID, p.MAC)
	}
	if p.NetNS == "" {
		return kerrors.New(kerrors.Invalid, "port %s: no network namespace", p.ID)
	}
	if len(p.Addrs) == 0 {
		return kerrors.New(kerrors.Invalid, "port %s: no address", p.ID)
	}
	for _, a := range p.Addrs {
		if a.Addr.IP == nil || a.Addr.Mask == nil || !a.Addr.Contains(a.Addr.IP) {
			return kerrors.New(kerrors.Invalid, "port %s: bad address %v", p.ID, a.Addr)
		}
		if a.Gateway != nil && !a.Addr.Contains(a.Gateway) {
			return kerrors.New(kerrors.Invalid, "port %s: gateway %s outside %s", p.ID, a.Gateway, a.Addr.String())
		}
	}
	return nil
}

func isZeroMAC(m net.HardwareAddr) bool {
	for _, b := range m {
		if b != 0 {
			return false
		}
	}
	return true
}

// Plug creates the port's veth pair (or repairs an existing one), moves
// the container end into the pod namespace, configures it and attaches the
// host end to the VPC's bridge, then removes the host's neighbour entries
// for the port's addresses (forgetNeighbours). It never creates a second
// link for a port: an existing host end whose peer is still in place is
// reused.
func (d *Datapath) Plug(ctx context.Context, p PortSpec) (retErr error) {
	if err := checkCtx(ctx); err != nil {
		return err
	}
	if err := p.Validate(); err != nil {
		return err
	}
	ph, nsh, err := podHandle(p.NetNS)
	if err != nil {
		return fmt.Errorf("plug port %s: %w", p.ID, err)
	}
	defer nsh.Close()
	defer ph.Close()

	// Requests of this plug in the host namespace that the shared handle
	// need not carry go through a socket of its own, so plugs in parallel
	// do not wait on each other's requests in that handle's socket.
	hs, err := d.hostSocket()
	if err != nil {
		return fmt.Errorf("plug port %s: %w", p.ID, err)
	}
	defer hs.Close()

	hostName, alias := d.names.hostVeth(p.ID), d.names.portAlias(p.ID)
	// The common case, a new port with nothing of it left anywhere, needs
	// no lookups: the pair is made at once, on the bridge the VPC's
	// ensure found. Anything in the way (either name taken, the bridge
	// gone) fails the creation, and the careful path below sorts it out;
	// so does any other failure, which it reports.
	ix, known := d.bridges.Load(p.VNI)
	if !known {
		br, err := d.ownedLink(d.names.bridge(p.VNI), d.names.vpcAlias(p.VNI))
		if err != nil {
			return fmt.Errorf("plug port %s: vpc %d: %w", p.ID, p.VNI, err)
		}
		ix = br.Attrs().Index
		d.bridges.Store(p.VNI, ix)
	}
	if peer, err := d.createVeth(hs, p, hostName, ix.(int), nsh); err == nil {
		if err := d.finishFresh(hs, ph, p, hostName, alias, peer); err != nil {
			return err
		}
		return forgetNeighbours(hs, ix.(int), p)
	}
	d.bridges.Delete(p.VNI) // looked up afresh below
	br, err := d.ownedLink(d.names.bridge(p.VNI), d.names.vpcAlias(p.VNI))
	if err != nil {
		return fmt.Errorf("plug port %s: vpc %d: %w", p.ID, p.VNI, err)
	}
	d.bridges.Store(p.VNI, br.Attrs().Index)
	host, err := d.h.LinkByName(hostName)
	switch {
	case err == nil && host.Attrs().Alias != alias && d.interrupted(host):
		// A creation a crash cut short: remove it (its peer goes too).
		if err := d.h.LinkDel(host); err != nil && !isNotFound(err) {
			return fmt.Errorf("plug port %s: remove interrupted %s: %w", p.ID, hostName, err)
		}
		host = nil
	case err == nil && host.Attrs().Alias != alias:
		return kerrors.New(kerrors.Conflict, "plug port %s: link %s exists and is not ours (alias %q)", p.ID, hostName, host.Attrs().Alias)
	case err != nil && !isNotFound(err):
		return fmt.Errorf("plug port %s: %w", p.ID, err)
	}
	pod, perr := ph.LinkByName(p.IfName)
	if perr != nil && !isNotFound(perr) {
		return fmt.Errorf("plug port %s: %w", p.ID, perr)
	}
	// The container end is ours when it has our alias, or when it has none
	// yet but is the peer of our host end (a crash between the two alias
	// writes).
	podOurs := perr == nil && (pod.Attrs().Alias == alias || (pod.Attrs().Alias == "" && host != nil &&
		pod.Attrs().ParentIndex == host.Attrs().Index && host.Attrs().ParentIndex == pod.Attrs().Index))
	if perr == nil && !podOurs {
		return kerrors.New(kerrors.Conflict, "plug port %s: %s already exists in %s and is not ours", p.ID, p.IfName, p.NetNS)
	}
	if host != nil && !podOurs {
		// The host end survived but its peer is not where the port wants
		// it (the namespace was replaced): start over.
		if err := d.h.LinkDel(host); err != nil && !isNotFound(err) {
			return fmt.Errorf("plug port %s: remove stale %s: %w", p.ID, hostName, err)
		}
		host = nil
	}
	if host == nil && podOurs {
		// A container end without its host end cannot be a veth we made
		// whole; remove it and start over.
		if err := ph.LinkDel(pod); err != nil && !isNotFound(err) {
			return fmt.Errorf("plug port %s: remove stale %s: %w", p.ID, p.IfName, err)
		}
		pod = nil
	}
	if host == nil {
		peer, err := d.createVeth(hs, p, hostName, br.Attrs().Index, nsh)
		if err != nil {
			return fmt.Errorf("plug port %s: create veth %s: %w", p.ID, hostName, err)
		}
		d.bridges.Store(p.VNI, br.Attrs().Index)
		if err := d.finishFresh(hs, ph, p, hostName, alias, peer); err != nil {
			return err
		}
		return forgetNeighbours(hs, br.Attrs().Index, p)
	}
	if err := configurePod(ph, p, alias, d.mtu, false, 0); err != nil {
		return fmt.Errorf("plug port %s: %w", p.ID, err)
	}
	if err := d.configureHost(host, br, alias, !p.AdminDown); err != nil {
		return fmt.Errorf("plug port %s: %w", p.ID, err)
	}
	return d.forgetOtherNeighbours(hs, br.Attrs().Index, p)
}

// forgetOtherNeighbours is forgetNeighbours for a port whose pair was
// already there (a restarted agent's plug, a repair): only the entries
// that name another MAC than the port's go, so a plug that changes
// nothing removes nothing (the host keeps its resolved entries across an
// agent restart).
func (d *Datapath) forgetOtherNeighbours(hs *nl.NetlinkSocket, brIndex int, p PortSpec) error {
	mine := map[string]bool{}
	fams := map[int]bool{}
	for _, a := range p.Addrs {
		mine[a.Addr.IP.String()] = true
		fams[familyOf(a.Addr.IP)] = true
	}
	const resolved = netlink.NUD_REACHABLE | netlink.NUD_STALE | netlink.NUD_DELAY | netlink.NUD_PROBE
	for fam := range fams {
		ns, err := neighList(d.h, brIndex, fam)
		if err != nil {
			return fmt.Errorf("plug port %s: %w", p.ID, err)
		}
		for _, n := range ns {
			if n.IP == nil || !mine[n.IP.String()] || n.State&resolved == 0 || bytes.Equal(n.HardwareAddr, p.MAC) {
				continue
			}
			if err := delNeighbour(hs, brIndex, n.IP); err != nil {
				return fmt.Errorf("plug port %s: forget neighbour %s: %w", p.ID, n.IP, err)
			}
		}
	}
	return nil
}

// forgetNeighbours removes the host's neighbour entries for the port's
// addresses on the VPC's bridge (index brIndex), through hs. An address
// is reused as soon as it is released: the entry left by its previous
// owner (a pod of this host, or of another host through the VXLAN
// device) names that owner's MAC, and the kernel keeps using a
// confirmed entry for up to one and a half base_reachable_time (45 s by
// default), then probes that MAC for several more seconds, before it asks
// again: meanwhile everything the host routes to the address (a
// clusterIP or NodePort DNATed to it, the node's own probes) goes to a
// MAC nobody answers for. A pod does not announce itself (no gratuitous
// ARP), so the plug clears the way: the host's next packet asks afresh,
// and the new owner answers.
func forgetNeighbours(hs *nl.NetlinkSocket, brIndex int, p PortSpec) error {
	for _, a := range p.Addrs {
		if err := delNeighbour(hs, brIndex, a.Addr.IP); err != nil {
			return fmt.Errorf("plug port %s: forget neighbour %s: %w", p.ID, a.Addr.IP, err)
		}
	}
	return nil
}

// familyOf is the address family of ip: AF_INET for an IPv4 address (in
// either form), AF_INET6 otherwise.
func familyOf(ip net.IP) int {
	if ip.To4() != nil {
		return unix.AF_INET
	}
	return unix.AF_INET6
}

// delNeighbour removes the neighbour entry for ip on the link of index
// ix, in one request through s; none there is success.
func delNeighbour(s *nl.NetlinkSocket, ix int, ip net.IP) error {
	fam, dst := familyOf(ip), ip.To16()
	if fam == unix.AF_INET {
		dst = ip.To4()
	}
	req := nl.NewNetlinkRequest(unix.RTM_DELNEIGH, unix.NLM_F_ACK)
	req.AddData(&netlink.Ndmsg{Family: uint8(fam), Index: uint32(ix)})
	req.AddData(nl.NewRtAttr(unix.NDA_DST, dst))
	if err := request(s, req); err != nil && !isNoEnt(err) {
		return err
	}
	return nil
}

// BridgeIndex is the index of the VPC's bridge as this datapath last
// found or made it (0: not known). It reads no kernel state.
func (d *Datapath) BridgeIndex(vni uint32) int {
	if ix, ok := d.bridges.Load(vni); ok {
		return ix.(int)
	}
	return 0
}

// createVeth makes a port's pair in one request: the host end named
// hostName on the bridge of index brIndex, the container end in the pod's
// namespace (nsh) with the port's MAC, both with the datapath's MTU, the
// host end up unless the port is admin down, through hs (a hostSocket).
// (netlink.Handle.LinkAdd takes three requests for this: the creation, a
// read back of the index, and the bridge port, which the kernel accepts
// in the creation itself.) It returns the container end's index, from the
// kernel's echo of the host end (its IFLA_LINK), or 0 when the kernel
// does not echo a creation (before Linux 6.3): then configurePod looks
// the link up.
func (d *Datapath) createVeth(hs *nl.NetlinkSocket, p PortSpec, hostName string, brIndex int, nsh netns.NsHandle) (int, error) {
	var up uint32
	if !p.AdminDown {
		up = unix.IFF_UP
	}
	req := nl.NewNetlinkRequest(unix.RTM_NEWLINK, unix.NLM_F_CREATE|unix.NLM_F_EXCL|unix.NLM_F_ACK|unix.NLM_F_ECHO)
	msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
	msg.Flags, msg.Change = up, unix.IFF_UP
	req.AddData(msg)
	req.AddData(nl.NewRtAttr(unix.IFLA_IFNAME, nl.ZeroTerminated(hostName)))
	req.AddData(nl.NewRtAttr(unix.IFLA_MTU, nl.Uint32Attr(uint32(d.mtu))))
	req.AddData(nl.NewRtAttr(unix.IFLA_ADDRESS, d.sigMAC(hostName)))
	req.AddData(nl.NewRtAttr(unix.IFLA_MASTER, nl.Uint32Attr(uint32(brIndex))))
	info := nl.NewRtAttr(unix.IFLA_LINKINFO, nil)
	info.AddRtAttr(nl.IFLA_INFO_KIND, nl.NonZeroTerminated("veth"))
	peer := info.AddRtAttr(nl.IFLA_INFO_DATA, nil).AddRtAttr(nl.VETH_INFO_PEER, nil)
	// The container end comes up later (configurePod): this kernel
	// refuses a peer created up (ENOTCONN).
	peer.AddChild(nl.NewIfInfomsg(unix.AF_UNSPEC))
	peer.AddRtAttr(unix.IFLA_IFNAME, nl.ZeroTerminated(p.IfName))
	peer.AddRtAttr(unix.IFLA_MTU, nl.Uint32Attr(uint32(d.mtu)))
	peer.AddRtAttr(unix.IFLA_ADDRESS, []byte(p.MAC))
	peer.AddRtAttr(unix.IFLA_NET_NS_FD, nl.Uint32Attr(uint32(nsh)))
	req.AddData(info)
	var peerIndex int
	err := requestEcho(hs, req, d.seq.Add(1), func(m syscall.NetlinkMessage) {
		if m.Header.Type != unix.RTM_NEWLINK || len(m.Data) < unix.SizeofIfInfomsg {
			return
		}
		attrs, err := nl.ParseRouteAttr(m.Data[unix.SizeofIfInfomsg:])
		if err != nil {
			return
		}
		for _, a := range attrs {
			if a.Attr.Type == unix.IFLA_LINK && len(a.Value) == 4 {
				peerIndex = int(nl.NativeEndian().Uint32(a.Value))
			}
		}
	})
	return peerIndex, err
}

// requestEcho sends req (NLM_F_ACK and NLM_F_ECHO set) through s, hands
// every answer of it but the acknowledgement to f, and returns the
// acknowledgement's error; seq numbers the request. Unlike NetlinkRequest.Execute it reads on to
// the acknowledgement after an echo, so that none is left in s for the
// next request to take as its own.
func requestEcho(s *nl.NetlinkSocket, req *nl.NetlinkRequest, seq uint32, f func(syscall.NetlinkMessage)) error {
	req.Seq = seq
	if err := s.Send(req); err != nil {
		return err
	}
	pid, err := s.GetPid()
	if err != nil {
		return err
	}
	for {
		msgs, from, err := s.Receive()
		if err != nil {
			return err
		}
		if from.Pid != nl.PidKernel {
			continue
		}
		for _, m := range msgs {
			if m.Header.Seq != req.Seq || m.Header.Pid != pid {
				continue
			}
			if m.Header.Type != unix.NLMSG_ERROR {
				f(m)
				continue
			}
			if len(m.Data) < 4 {
				return fmt.Errorf("netlink: short acknowledgement")
			}
			if errno := int32(nl.NativeEndian().Uint32(m.Data[:4])); errno != 0 {
				return syscall.Errno(-errno)
			}
			return nil
		}
	}
}

// setAliasAndHairpin sets a host link's alias and turns hairpin mode on for
// it as a bridge port, in one request through hs, naming the link (no
// index needed). Hairpin: a pod whose connection to a load balancer's VIP
// is DNATed back to itself gets the packet through the port it came
// from; without it the bridge drops it. The creation request cannot
// carry it (the kernel applies bridge port settings, IFLA_INFO_SLAVE_DATA,
// only to a link that already has its master), so it rides on the
// alias: RTM_NEWLINK on an existing link applies both.
func setAliasAndHairpin(hs *nl.NetlinkSocket, name, alias string) error {
	req := nl.NewNetlinkRequest(unix.RTM_NEWLINK, unix.NLM_F_ACK)
	req.AddData(nl.NewIfInfomsg(unix.AF_UNSPEC))
	req.AddData(nl.NewRtAttr(unix.IFLA_IFNAME, nl.ZeroTerminated(name)))
	req.AddData(nl.NewRtAttr(unix.IFLA_IFALIAS, []byte(alias)))
	info := nl.NewRtAttr(unix.IFLA_LINKINFO, nil)
	info.AddRtAttr(nl.IFLA_INFO_SLAVE_DATA, nil).AddRtAttr(nl.IFLA_BRPORT_MODE, []byte{1})
	req.AddData(info)
	return request(hs, req)
}

// hostSocket opens a NETLINK_ROUTE socket in the host namespace.
func (d *Datapath) hostSocket() (*nl.NetlinkSocket, error) {
	at := netns.None() // the process's own: no namespace switch
	if d.cfg.HostNS != "" {
		at = netns.NsHandle(int(d.gnsf.Fd()))
	}
	s, err := nl.GetNetlinkSocketAt(at, netns.None(), unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("netlink socket: %w", err)
	}
	return s, nil
}

// request sends req through s and waits for the kernel's answer.
func request(s *nl.NetlinkSocket, req *nl.NetlinkRequest) error {
	req.Sockets = map[int]*nl.SocketHandle{unix.NETLINK_ROUTE: {Socket: s}}
	_, err := req.Execute(unix.NETLINK_ROUTE, 0)
	return err
}

// finishFresh configures a pair createVeth just made, or removes it: its
// name, MTU, MACs, bridge and up were all part of the creation; the
// aliases, the container end's addresses and its routes are left.
func (d *Datapath) finishFresh(hs *nl.NetlinkSocket, ph *netlink.Handle, p PortSpec, hostName, alias string, peerIndex int) (retErr error) {
	defer func() {
		if retErr != nil {
			d.rollbackLink(hostName)
		}
	}()
	if err := setAliasAndHairpin(hs, hostName, alias); err != nil {
		return fmt.Errorf("plug port %s: alias %s: %w", p.ID, hostName, err)
	}
	if err := configurePod(ph, p, alias, d.mtu, true, peerIndex); err != nil {
		return fmt.Errorf("plug port %s: %w", p.ID, err)
	}
	return nil
}

// rollbackLink deletes a link we just created, logging (not returning) a
// failure: the caller already has the error that matters.
func (d *Datapath) rollbackLink(name string) {
	l, err := d.h.LinkByName(name)
	if err == nil {
		err = d.h.LinkDel(l)
	}
	if err != nil && !isNotFound(err) {
		d.log.Warn("rollback: remove link", "link", name, "err", err)
	}
}

func (d *Datapath) configureHost(host, br netlink.Link, alias string, up bool) error {
	a := host.Attrs()
	if a.Alias != alias {
		if err := d.h.LinkSetAlias(host, alias); err != nil {
			return fmt.Errorf("alias %s: %w", a.Name, err)
		}
	}
	if a.MTU != d.mtu {
		if err := d.h.LinkSetMTU(host, d.mtu); err != nil {
			return fmt.Errorf("mtu %s: %w", a.Name, err)
		}
	}
	if a.MasterIndex != br.Attrs().Index {
		if err := d.h.LinkSetMasterByIndex(host, br.Attrs().Index); err != nil {
			return fmt.Errorf("attach %s to %s: %w", a.Name, br.Attrs().Name, err)
		}
	}
	// Hairpin: a pod whose connection to a load balancer's VIP is DNATed
	// back to itself gets the packet through the port it came from.
	if err := d.h.LinkSetHairpin(host, true); err != nil {
		return fmt.Errorf("hairpin %s: %w", a.Name, err)
	}
	if err := setUp(d.h, host, up); err != nil {
		return fmt.Errorf("%s: %w", a.Name, err)
	}
	return nil
}

// setUp brings l up or down unless it already is.
func setUp(h *netlink.Handle, l netlink.Link, up bool) error {
	is := l.Attrs().Flags&net.FlagUp != 0
	switch {
	case up && !is:
		if err := h.LinkSetUp(l); err != nil {
			return fmt.Errorf("set up: %w", err)
		}
	case !up && is:
		if err := h.LinkSetDown(l); err != nil {
			return fmt.Errorf("set down: %w", err)
		}
	}
	return nil
}

// configurePod sets the container end's alias, MAC, MTU, addresses and
// default routes and brings it up. Addresses it does not want are removed
// (the link is ours); link-local addresses are left alone. fresh: the
// link was just made by createVeth (name, MAC and MTU as p and mtu want,
// down, no alias), and a peerIndex other than 0 is its index, so it is
// not looked up.
func configurePod(h *netlink.Handle, p PortSpec, alias string, mtu int, fresh bool, peerIndex int) error {
	var l netlink.Link
	if fresh && peerIndex > 0 {
		l = &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Index: peerIndex, Name: p.IfName, MTU: mtu, HardwareAddr: p.MAC}}
	} else {
		var err error
		if l, err = h.LinkByName(p.IfName); err != nil {
			return fmt.Errorf("find %s in %s: %w", p.IfName, p.NetNS, err)
		}
	}
	a := l.Attrs()
	if a.Alias != alias {
		if err := h.LinkSetAlias(l, alias); err != nil {
			return fmt.Errorf("alias %s: %w", p.IfName, err)
		}
	}
	if a.HardwareAddr.String() != p.MAC.String() {
		if err := h.LinkSetHardwareAddr(l, p.MAC); err != nil {
			return fmt.Errorf("mac %s: %w", p.IfName, err)
		}
	}
	if a.MTU != mtu {
		if err := h.LinkSetMTU(l, mtu); err != nil {
			return fmt.Errorf("mtu %s: %w", p.IfName, err)
		}
	}
	if fresh {
		for _, w := range p.Addrs {
			if err := addAddr(h, l, w.Addr, unix.IFA_F_NODAD); err != nil {
				return fmt.Errorf("%s: %w", p.IfName, err)
			}
		}
	} else if err := syncAddrs(h, l, addrNets(p.Addrs), unix.IFA_F_NODAD); err != nil {
		return fmt.Errorf("%s: %w", p.IfName, err)
	}
	if err := setUp(h, l, !p.AdminDown); err != nil {
		return fmt.Errorf("%s: %w", p.IfName, err)
	}
	if p.AdminDown {
		return nil // a link that is down takes no routes
	}
	done := map[bool]bool{} // by "is IPv4": one default route per family
	for _, pa := range p.Addrs {
		if pa.Gateway == nil {
			continue
		}
		v4 := pa.Gateway.To4() != nil
		if done[v4] {
			continue
		}
		done[v4] = true
		r := &netlink.Route{LinkIndex: a.Index, Gw: pa.Gateway, Scope: netlink.SCOPE_UNIVERSE}
		if v4 {
			r.Dst = &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}
		} else {
			r.Dst = &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}
		}
		if err := h.RouteReplace(r); err != nil {
			return fmt.Errorf("default route via %s: %w", pa.Gateway, err)
		}
	}
	return nil
}

func addrNets(as []PortAddr) []net.IPNet {
	out := make([]net.IPNet, 0, len(as))
	for _, a := range as {
		out = append(out, a.Addr)
	}
	return out
}

// syncAddrs makes the global addresses of l exactly want.
func syncAddrs(h *netlink.Handle, l netlink.Link, want []net.IPNet, flags int) error {
	have, err := addrList(h, l, netlink.FAMILY_ALL)
	if err != nil {
		return err
	}
	keep := map[string]bool{}
	for _, w := range want {
		keep[w.String()] = false
	}
	for _, a := range have {
		if a.IP.IsLinkLocalUnicast() {
			continue
		}
		s := a.IPNet.String()
		if _, ok := keep[s]; ok {
			keep[s] = true
			continue
		}
		if err := h.AddrDel(l, &a); err != nil {
			return fmt.Errorf("remove address %s: %w", s, err)
		}
	}
	for _, w := range want {
		if keep[w.String()] {
			continue
		}
		if err := addAddr(h, l, w, flags); err != nil {
			return err
		}
	}
	return nil
}

// addAddr adds (or replaces) one address; flags apply to IPv6 only.
func addAddr(h *netlink.Handle, l netlink.Link, w net.IPNet, flags int) error {
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: w.IP, Mask: w.Mask}}
	if w.IP.To4() == nil {
		addr.Flags = flags
	}
	if err := h.AddrReplace(l, addr); err != nil {
		return fmt.Errorf("add address %s: %w", w.String(), err)
	}
	return nil
}

// Unplug removes the port's veth pair (the container end goes with the
// host end). A port that is not plugged is success; a link with the
// port's name that is not ours is left alone and reported as a conflict.
func (d *Datapath) Unplug(ctx context.Context, portID string) error {
	if err := checkCtx(ctx); err != nil {
		return err
	}
	if err := ValidatePortID(portID); err != nil {
		return err
	}
	name := d.names.hostVeth(portID)
	l, err := d.h.LinkByName(name)
	if isNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("unplug port %s: %w", portID, err)
	}
	if l.Attrs().Alias != d.names.portAlias(portID) && !d.interrupted(l) {
		return kerrors.New(kerrors.Conflict, "unplug port %s: link %s is not ours (alias %q)", portID, name, l.Attrs().Alias)
	}
	if err := d.h.LinkDel(l); err != nil && !isNotFound(err) {
		return fmt.Errorf("unplug port %s: %w", portID, err)
	}
	return nil
}

// ListPorts returns the host ends we own, with the VPC each is attached to.
func (d *Datapath) ListPorts(ctx context.Context) ([]OwnedPort, error) {
	if err := checkCtx(ctx); err != nil {
		return nil, err
	}
	links, err := linkList(d.h)
	if err != nil {
		return nil, fmt.Errorf("list ports: %w", err)
	}
	bridges := map[int]uint32{}
	for _, l := range links {
		if vni, ok := d.names.ownsVPCLink(l.Attrs().Name, l.Attrs().Alias, l.Type()); ok && l.Type() == "bridge" {
			bridges[l.Attrs().Index] = vni
		}
	}
	var out []OwnedPort
	for _, l := range links {
		a := l.Attrs()
		if l.Type() != "veth" {
			continue
		}
		if id, ok := d.names.ownsPort(a.Name, a.Alias); ok {
			out = append(out, OwnedPort{ID: id, HostIf: a.Name, VNI: bridges[a.MasterIndex]})
		}
	}
	return out, nil
}

// ownedLink finds a link by name and checks its alias: a missing link is
// kerrors.NotFound, a foreign one kerrors.Conflict.
func (d *Datapath) ownedLink(name, alias string) (netlink.Link, error) {
	l, err := d.h.LinkByName(name)
	if isNotFound(err) {
		return nil, kerrors.New(kerrors.NotFound, "link %s does not exist", name)
	}
	if err != nil {
		return nil, fmt.Errorf("link %s: %w", name, err)
	}
	if l.Attrs().Alias == alias {
		return l, nil
	}
	if !d.interrupted(l) {
		return nil, kerrors.New(kerrors.Conflict, "link %s is not ours (alias %q)", name, l.Attrs().Alias)
	}
	// Ours, created by a run that died before naming it: adopt it.
	if err := d.h.LinkSetAlias(l, alias); err != nil {
		return nil, fmt.Errorf("adopt %s: %w", name, err)
	}
	l.Attrs().Alias = alias
	return l, nil
}

// sigMAC is the MAC every link we create gets at creation: derived from
// the owner, this host's VTEP and the link's name, locally administered
// unicast. Bridges keep it for life, so a VPC's gateway MAC is stable and
// differs between hosts.
func (d *Datapath) sigMAC(name string) net.HardwareAddr {
	sum := sha256.Sum256([]byte(d.cfg.Owner + "|" + d.vtep.String() + "|" + name))
	m := net.HardwareAddr(sum[:6])
	m[0] = (m[0] | 0x02) &^ 0x01
	return m
}

// interrupted reports whether l is a link we created but never got to
// alias (the kernel ignores an alias in the creation request, so a crash
// can fall between the two calls): our name prefix, no alias, and the
// signature MAC of its name. Such a link is provably ours.
func (d *Datapath) interrupted(l netlink.Link) bool {
	a := l.Attrs()
	return a.Alias == "" && strings.HasPrefix(a.Name, d.names.prefix) && bytes.Equal(a.HardwareAddr, d.sigMAC(a.Name))
}

// Cleanup removes the links of creations a crash interrupted (see
// interrupted). Call it before any Plug or EnsureVPC runs: a creation in
// flight looks interrupted too.
func (d *Datapath) Cleanup(ctx context.Context) error {
	if err := checkCtx(ctx); err != nil {
		return err
	}
	links, err := linkList(d.h)
	if err != nil {
		return fmt.Errorf("cleanup: %w", err)
	}
	for _, l := range links {
		if !d.interrupted(l) {
			continue
		}
		d.log.Info("removing interrupted creation", "link", l.Attrs().Name)
		if err := d.h.LinkDel(l); err != nil && !isNotFound(err) {
			return fmt.Errorf("cleanup %s: %w", l.Attrs().Name, err)
		}
	}
	return nil
}
