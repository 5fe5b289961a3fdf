package datapath

import (
	"context"
	"errors"
	"fmt"
	"net"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"kurma.dev/kurma/pkg/kerrors"
)

// SetRemotes programs the VPC's remote ports, and removes every entry that
// is not in remotes:
//   - on the VXLAN device, one FDB entry per remote MAC pointing at its
//     host's VTEP (no all-zero flood entry, so nothing is flooded);
//   - on the bridge, one static FDB entry per remote MAC towards the VXLAN
//     port (the bridge does not learn on that port);
//   - on the VXLAN device, one permanent neighbour entry per remote address,
//     which its ARP/ND proxy answers from.
func (d *Datapath) SetRemotes(ctx context.Context, vni uint32, remotes []Remote) error {
	if err := checkCtx(ctx); err != nil {
		return err
	}
	vx, err := d.ownedLink(d.names.vxlan(vni), d.names.vpcAlias(vni))
	if err != nil {
		return fmt.Errorf("set remotes of vpc %d: %w", vni, err)
	}
	ix := vx.Attrs().Index
	fdb := map[string]net.IP{}   // mac -> vtep
	neigh := map[string]string{} // ip -> mac
	for _, r := range remotes {
		if len(r.MAC) != 6 || r.MAC[0]&1 != 0 || r.VTEP == nil {
			return kerrors.New(kerrors.Invalid, "set remotes of vpc %d: bad remote %v at %v", vni, r.MAC, r.VTEP)
		}
		fdb[r.MAC.String()] = r.VTEP
		for _, ip := range r.IPs {
			neigh[ip.String()] = r.MAC.String()
		}
	}

	entries, err := neighList(d.h, ix, unix.AF_BRIDGE)
	if err != nil {
		return fmt.Errorf("set remotes of vpc %d: %w", vni, err)
	}
	haveSelf, haveMaster := map[string]bool{}, map[string]bool{}
	own := vx.Attrs().HardwareAddr.String()
	for _, e := range entries {
		mac := e.HardwareAddr.String()
		switch {
		case e.Flags&netlink.NTF_SELF != 0 && e.IP != nil:
			if want, ok := fdb[mac]; ok && want.Equal(e.IP) {
				haveSelf[mac] = true
				continue
			}
		case e.Flags&netlink.NTF_MASTER != 0 && e.State&netlink.NUD_NOARP != 0 && e.State&netlink.NUD_PERMANENT == 0 && mac != own:
			if _, ok := fdb[mac]; ok {
				haveMaster[mac] = true
				continue
			}
		default:
			continue
		}
		del := e
		if err := d.h.NeighDel(&del); err != nil && !isNoEnt(err) {
			return fmt.Errorf("set remotes of vpc %d: remove fdb %s: %w", vni, mac, err)
		}
	}
	for mac, vtep := range fdb {
		hw, _ := net.ParseMAC(mac)
		if !haveSelf[mac] {
			n := &netlink.Neigh{LinkIndex: ix, Family: unix.AF_BRIDGE, Flags: netlink.NTF_SELF,
				State: netlink.NUD_PERMANENT, HardwareAddr: hw, IP: vtep}
			if err := d.h.NeighSet(n); err != nil {
				return fmt.Errorf("set remotes of vpc %d: fdb %s dst %s: %w", vni, mac, vtep, err)
			}
		}
		if !haveMaster[mac] {
			n := &netlink.Neigh{LinkIndex: ix, Family: unix.AF_BRIDGE, Flags: netlink.NTF_MASTER,
				State: netlink.NUD_NOARP, HardwareAddr: hw}
			if err := d.h.NeighSet(n); err != nil {
				return fmt.Errorf("set remotes of vpc %d: bridge fdb %s: %w", vni, mac, err)
			}
		}
	}

	haveNeigh := map[string]bool{}
	for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
		ns, err := neighList(d.h, ix, fam)
		if err != nil {
			return fmt.Errorf("set remotes of vpc %d: %w", vni, err)
		}
		for _, n := range ns {
			if n.IP == nil || n.State&netlink.NUD_PERMANENT == 0 {
				continue
			}
			if neigh[n.IP.String()] == n.HardwareAddr.String() {
				haveNeigh[n.IP.String()] = true
				continue
			}
			del := n
			if err := d.h.NeighDel(&del); err != nil && !isNoEnt(err) {
				return fmt.Errorf("set remotes of vpc %d: remove neighbour %s: %w", vni, n.IP, err)
			}
			if err := d.forgetHostNeighbour(vx, n.IP); err != nil {
				return fmt.Errorf("set remotes of vpc %d: %w", vni, err)
			}
		}
	}
	for ip, mac := range neigh {
		if haveNeigh[ip] {
			continue
		}
		hw, _ := net.ParseMAC(mac)
		addr := net.ParseIP(ip)
		n := &netlink.Neigh{LinkIndex: ix, Family: familyOf(addr), State: netlink.NUD_PERMANENT, IP: addr, HardwareAddr: hw}
		if err := d.h.NeighSet(n); err != nil {
			return fmt.Errorf("set remotes of vpc %d: neighbour %s: %w", vni, ip, err)
		}
		if err := d.forgetHostNeighbour(vx, addr); err != nil {
			return fmt.Errorf("set remotes of vpc %d: %w", vni, err)
		}
	}
	return nil
}

// forgetHostNeighbour removes the host's own neighbour entry for ip on
// the bridge the VXLAN device vx is attached to, when ip's remote entry
// changed: the address moved (a pod of this host or of another host had
// it before; the proxy may have answered for a remote owner that is
// gone). Without it the host keeps sending to the old owner's MAC for
// as long as its entry stays confirmed (see forgetNeighbours). Only
// changed addresses are touched, so a sync that changes nothing sends
// nothing.
func (d *Datapath) forgetHostNeighbour(vx netlink.Link, ip net.IP) error {
	br := vx.Attrs().MasterIndex
	if br == 0 {
		return nil
	}
	n := &netlink.Neigh{LinkIndex: br, Family: familyOf(ip), IP: ip}
	if err := d.h.NeighDel(n); err != nil && !isNoEnt(err) {
		return fmt.Errorf("forget host neighbour %s: %w", ip, err)
	}
	return nil
}

func isNoEnt(err error) bool { return errors.Is(err, unix.ENOENT) }
