package datapath

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"

	"github.com/google/nftables"
	"github.com/google/nftables/userdata"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"

	"kurma.dev/kurma/pkg/kerrors"
)

const forwardChain = "forward"

// Validate checks a VPCSpec.
func (v VPCSpec) Validate() error {
	if v.VNI == 0 || v.VNI > MaxVNI {
		return kerrors.New(kerrors.Invalid, "vpc: vni %d out of range 1-%d", v.VNI, MaxVNI)
	}
	for _, g := range v.Gateways {
		if g.IP == nil || g.Mask == nil {
			return kerrors.New(kerrors.Invalid, "vpc %d: bad gateway %v", v.VNI, g)
		}
	}
	return nil
}

// EnsureVPC creates or repairs the VPC's bridge, gateway addresses, VXLAN
// device and isolation rules.
func (d *Datapath) EnsureVPC(ctx context.Context, v VPCSpec) (retErr error) {
	if err := checkCtx(ctx); err != nil {
		return err
	}
	if err := v.Validate(); err != nil {
		return err
	}
	alias := d.names.vpcAlias(v.VNI)
	brName, vxName := d.names.bridge(v.VNI), d.names.vxlan(v.VNI)

	created := false
	br, err := d.ownedLink(brName, alias)
	if errors.Is(err, kerrors.NotFound) {
		br, err = d.addLink(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{
			Name: brName, MTU: d.mtu,
		}}, alias)
		if err == nil {
			created = true
			defer func() {
				if retErr != nil {
					d.rollbackLink(brName)
				}
			}()
		}
	}
	if err != nil {
		return fmt.Errorf("vpc %d: %w", v.VNI, err)
	}
	if err := syncAddrs(d.h, br, v.Gateways, unix.IFA_F_NODAD); err != nil {
		return fmt.Errorf("vpc %d: bridge %s: %w", v.VNI, brName, err)
	}
	if br.Attrs().Flags&net.FlagUp == 0 {
		if err := d.h.LinkSetUp(br); err != nil {
			return fmt.Errorf("vpc %d: up %s: %w", v.VNI, brName, err)
		}
	}

	vx, err := d.ownedLink(vxName, alias)
	if err == nil && !d.vxlanMatches(vx, v.VNI) {
		// Stale parameters (the underlay address changed): recreate.
		if err := d.h.LinkDel(vx); err != nil && !isNotFound(err) {
			return fmt.Errorf("vpc %d: replace %s: %w", v.VNI, vxName, err)
		}
		err = kerrors.New(kerrors.NotFound, "recreate")
	}
	if errors.Is(err, kerrors.NotFound) {
		vx, err = d.addLink(&netlink.Vxlan{
			LinkAttrs:    netlink.LinkAttrs{Name: vxName, MTU: d.mtu},
			VxlanId:      int(v.VNI),
			SrcAddr:      d.vtep,
			VtepDevIndex: d.devIx,
			Port:         d.cfg.VXLANPort,
			Learning:     false,
			Proxy:        true,
		}, alias)
		if err == nil {
			defer func() {
				if retErr != nil {
					d.rollbackLink(vxName)
				}
			}()
		}
	}
	if err != nil {
		return fmt.Errorf("vpc %d: %w", v.VNI, err)
	}
	if vx.Attrs().MasterIndex != br.Attrs().Index {
		if err := d.h.LinkSetMasterByIndex(vx, br.Attrs().Index); err != nil {
			return fmt.Errorf("vpc %d: attach %s: %w", v.VNI, vxName, err)
		}
		// The bridge must not learn remote MACs: they are programmed.
		if err := d.h.LinkSetLearning(vx, false); err != nil {
			return fmt.Errorf("vpc %d: learning off on %s: %w", v.VNI, vxName, err)
		}
	}
	if vx.Attrs().Flags&net.FlagUp == 0 {
		if err := d.h.LinkSetUp(vx); err != nil {
			return fmt.Errorf("vpc %d: up %s: %w", v.VNI, vxName, err)
		}
	}
	if created {
		if err := d.syncIsolation(ctx); err != nil {
			return fmt.Errorf("vpc %d: %w", v.VNI, err)
		}
	}
	d.bridges.Store(v.VNI, br.Attrs().Index)
	return nil
}

func (d *Datapath) vxlanMatches(l netlink.Link, vni uint32) bool {
	vx, ok := l.(*netlink.Vxlan)
	return ok && vx.VxlanId == int(vni) && vx.SrcAddr.Equal(d.vtep) && vx.Port == d.cfg.VXLANPort &&
		(d.devIx == 0 || vx.VtepDevIndex == d.devIx) && !vx.Learning && vx.Proxy
}

// DeleteVPC removes the VPC's VXLAN device, bridge and isolation rules.
// Ports still attached are detached, not deleted.
func (d *Datapath) DeleteVPC(ctx context.Context, vni uint32) error {
	if err := checkCtx(ctx); err != nil {
		return err
	}
	d.bridges.Delete(vni)
	alias := d.names.vpcAlias(vni)
	for _, name := range []string{d.names.vxlan(vni), d.names.bridge(vni)} {
		l, err := d.ownedLink(name, alias)
		if errors.Is(err, kerrors.NotFound) {
			continue
		}
		if err != nil {
			return fmt.Errorf("delete vpc %d: %w", vni, err)
		}
		if err := d.h.LinkDel(l); err != nil && !isNotFound(err) {
			return fmt.Errorf("delete vpc %d: %s: %w", vni, name, err)
		}
	}
	return d.syncIsolation(ctx)
}

// ListVPCs returns the VNIs that have an owned bridge or VXLAN device.
func (d *Datapath) ListVPCs(ctx context.Context) ([]uint32, error) {
	if err := checkCtx(ctx); err != nil {
		return nil, err
	}
	links, err := linkList(d.h)
	if err != nil {
		return nil, err
	}
	var out []uint32
	for _, l := range links {
		if vni, ok := d.names.ownsVPCLink(l.Attrs().Name, l.Attrs().Alias, l.Type()); ok && !slices.Contains(out, vni) {
			out = append(out, vni)
		}
	}
	slices.Sort(out)
	return out, nil
}

// syncIsolation rewrites our nft table from the owned bridges that exist,
// in one atomic transaction, unless its rules are already those
// (isolationInPlace): a restarted agent rewrites nothing.
func (d *Datapath) syncIsolation(ctx context.Context) error {
	links, err := linkList(d.h)
	if err != nil {
		return err
	}
	var bridges []string
	for _, l := range links {
		if _, ok := d.names.ownsVPCLink(l.Attrs().Name, l.Attrs().Alias, l.Type()); ok && l.Type() == "bridge" {
			bridges = append(bridges, l.Attrs().Name)
		}
	}
	slices.Sort(bridges)
	d.nftMu.Lock()
	defer d.nftMu.Unlock()
	if d.isolationInPlace(bridges) {
		// A restarted agent finds its rules: nothing is rewritten.
		return nil
	}
	tx := d.nft.NewTransaction()
	isolationRules(tx, d.cfg.Owner, d.cfg.AcceptMark, bridges)
	return d.inHost(func() error {
		if err := d.nft.Run(ctx, tx); err != nil {
			return fmt.Errorf("nftables: isolate vpcs: %w", err)
		}
		return nil
	})
}

// isolationInPlace reports whether the forward chain of our table holds
// exactly the rules isolationRules writes for bridges, in order: each
// rule's comment names what it depends on (the bridge, the accept mark).
// Read through netlink; any failure says no (the caller rewrites).
func (d *Datapath) isolationInPlace(bridges []string) bool {
	want := isolationComments(d.cfg.Owner, d.cfg.AcceptMark, bridges)
	t := &nftables.Table{Name: d.cfg.NFTTable, Family: nftables.TableFamilyINet}
	rules, err := d.gr.GetRules(t, &nftables.Chain{Name: forwardChain, Table: t})
	if err != nil || len(rules) != len(want) {
		return false
	}
	for i, r := range rules {
		if c, ok := userdata.GetString(r.UserData, userdata.TypeComment); !ok || c != want[i] {
			return false
		}
	}
	return true
}

// isolationComments are the comments of the rules isolationRules writes,
// in order.
func isolationComments(owner string, acceptMark uint32, bridges []string) []string {
	var out []string
	if acceptMark != 0 {
		out = append(out, fmt.Sprintf("%s:nat-accept:0x%x", owner, acceptMark))
	}
	for _, br := range bridges {
		out = append(out, owner+":vpc-in:"+br, owner+":vpc-out:"+br)
	}
	return out
}

// isolationRules fills tx with our table, its forward chain, and for each
// VPC bridge two rules that drop packets routed into or out of it from any
// other interface. Each rule's comment names its owner and bridge. Packets
// whose mark has all bits of acceptMark (non-zero) pass first: the load
// balancer datapath marks its NATed flows so.
func isolationRules(tx *knftables.Transaction, owner string, acceptMark uint32, bridges []string) {
	tx.Add(&knftables.Table{Comment: knftables.PtrTo(owner + ": vpc isolation")})
	tx.Add(&knftables.Chain{
		Name:     forwardChain,
		Type:     knftables.PtrTo(knftables.FilterType),
		Hook:     knftables.PtrTo(knftables.ForwardHook),
		Priority: knftables.PtrTo(knftables.FilterPriority),
		Policy:   knftables.PtrTo(knftables.AcceptPolicy),
	})
	tx.Flush(&knftables.Chain{Name: forwardChain})
	comments := isolationComments(owner, acceptMark, bridges)
	if acceptMark != 0 {
		tx.Add(&knftables.Rule{Chain: forwardChain, Rule: fmt.Sprintf("meta mark & 0x%x == 0x%x accept", acceptMark, acceptMark),
			Comment: knftables.PtrTo(comments[0])})
		comments = comments[1:]
	}
	for i, br := range bridges {
		q := strconv.Quote(br)
		tx.Add(&knftables.Rule{Chain: forwardChain, Rule: knftables.Concat("iifname", q, "oifname", "!=", q, "drop"),
			Comment: knftables.PtrTo(comments[2*i])})
		tx.Add(&knftables.Rule{Chain: forwardChain, Rule: knftables.Concat("oifname", q, "iifname", "!=", q, "drop"),
			Comment: knftables.PtrTo(comments[2*i+1])})
	}
}

// addLink creates a link with our signature MAC and gives it our alias
// (the kernel ignores an alias sent with the creation request, hence the
// signature: see interrupted). On failure nothing is left.
func (d *Datapath) addLink(l netlink.Link, alias string) (netlink.Link, error) {
	name := l.Attrs().Name
	l.Attrs().HardwareAddr = d.sigMAC(name)
	if err := d.h.LinkAdd(l); err != nil {
		return nil, fmt.Errorf("create %s %s: %w", l.Type(), name, err)
	}
	got, err := d.h.LinkByName(name)
	if err == nil {
		err = d.h.LinkSetAlias(got, alias)
	}
	if err != nil {
		d.rollbackLink(name)
		return nil, fmt.Errorf("create %s %s: %w", l.Type(), name, err)
	}
	got.Attrs().Alias = alias
	return got, nil
}
