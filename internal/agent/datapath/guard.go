package datapath

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"

	"sigs.k8s.io/knftables"

	"kurma.dev/kurma/pkg/kerrors"
)

// Guard is the anti-spoofing filter of one port (port_security): what the
// pod sends into the bridge through the port's host-side veth must come
// from the port's MAC, be IPv4, ARP or IPv6, and carry one of the port's
// addresses as its source (ARP: sender address; 0.0.0.0 is allowed for
// ARP probes; IPv6 also allows link-local and :: sources, for neighbour
// discovery). Everything else is dropped.
type Guard struct {
	PortID string
	MAC    net.HardwareAddr
	IPs    []net.IP
}

// guardChain is the chain of our bridge-family table that holds the
// guards; it hooks bridge prerouting, so it sees every frame a pod sends
// into the bridge, whether it is bridged or routed afterwards.
const guardChain = "port-guard"

// Validate checks a guard.
func (g Guard) Validate() error {
	if err := ValidatePortID(g.PortID); err != nil {
		return err
	}
	if len(g.MAC) != 6 || isZeroMAC(g.MAC) {
		return kerrors.New(kerrors.Invalid, "guard of port %s: mac %q is not a unicast ethernet address", g.PortID, g.MAC)
	}
	for _, ip := range g.IPs {
		if ip == nil || ip.IsUnspecified() {
			return kerrors.New(kerrors.Invalid, "guard of port %s: address %v is not usable", g.PortID, ip)
		}
	}
	return nil
}

// SetGuards makes our bridge-family table hold exactly guards (one
// atomic transaction). Rules match the host veth by name, so a guard may
// be set before its port is plugged.
func (d *Datapath) SetGuards(ctx context.Context, guards []Guard) error {
	if err := checkCtx(ctx); err != nil {
		return err
	}
	for _, g := range guards {
		if err := g.Validate(); err != nil {
			return err
		}
	}
	guards = slices.Clone(guards)
	slices.SortFunc(guards, func(a, b Guard) int { return strings.Compare(a.PortID, b.PortID) })
	d.nftMu.Lock()
	defer d.nftMu.Unlock()
	tx := d.bnft.NewTransaction()
	guardRules(tx, d.cfg.Owner, guards, d.names.hostVeth)
	return d.inHost(func() error {
		if err := d.bnft.Run(ctx, tx); err != nil {
			return fmt.Errorf("nftables: port guards: %w", err)
		}
		return nil
	})
}

// guardRules fills tx with the bridge table, its guard chain, and the
// rules of each guard (veth names the port's host-side veth).
func guardRules(tx *knftables.Transaction, owner string, guards []Guard, veth func(string) string) {
	tx.Add(&knftables.Table{Comment: knftables.PtrTo(owner + ": port security")})
	tx.Add(&knftables.Chain{
		Name:     guardChain,
		Type:     knftables.PtrTo(knftables.FilterType),
		Hook:     knftables.PtrTo(knftables.PreroutingHook),
		Priority: knftables.PtrTo(knftables.FilterPriority),
		Policy:   knftables.PtrTo(knftables.AcceptPolicy),
	})
	tx.Flush(&knftables.Chain{Name: guardChain})
	for _, g := range guards {
		name := veth(g.PortID)
		iif := strconv.Quote(name)
		// The veth name, not the port id: comments are limited to 128
		// bytes and port ids may hold quotes.
		comment := knftables.PtrTo(owner + ":guard:" + name)
		var v4, v6 []string
		for _, ip := range g.IPs {
			if ip4 := ip.To4(); ip4 != nil {
				v4 = append(v4, ip4.String())
			} else {
				v6 = append(v6, ip.String())
			}
		}
		rules := [][]string{
			{"iifname", iif, "ether", "saddr", "!=", g.MAC.String(), "drop"},
			{"iifname", iif, "ether", "type", "!=", "{", "ip,", "arp,", "ip6", "}", "drop"},
			{"iifname", iif, "arp", "saddr", "ip", "!=", set(append(v4, "0.0.0.0")), "drop"},
			{"iifname", iif, "ip6", "saddr", "!=", set(append(v6, "fe80::/10", "::")), "drop"},
		}
		if len(v4) > 0 {
			rules = append(rules, []string{"iifname", iif, "ip", "saddr", "!=", set(v4), "drop"})
		} else {
			rules = append(rules, []string{"iifname", iif, "ether", "type", "ip", "drop"})
		}
		for _, r := range rules {
			tx.Add(&knftables.Rule{Chain: guardChain, Rule: knftables.Concat(r), Comment: comment})
		}
	}
}

func set(elems []string) string { return "{ " + strings.Join(elems, ", ") + " }" }
