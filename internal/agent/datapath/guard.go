package datapath

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"

	"github.com/google/nftables"
	"sigs.k8s.io/knftables"

	"kurma.dev/kurma/internal/agent/nftbatch"
	"kurma.dev/kurma/internal/agent/nfthost"
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

// The guard sets, keyed by the host-side veth's name: the chain's rules
// are fixed, a port's guard is its elements.
const (
	gsPort = iota // ifname: the guarded host ends
	gsMAC         // ifname . ether_addr: each one's MAC
	gsARP         // ifname . ipv4_addr: ARP senders (its IPv4 addresses and 0.0.0.0)
	gsV4          // ifname . ipv4_addr: IPv4 sources
	gsV6          // ifname . ipv6_addr: IPv6 sources (link-local and :: pass by rule)
	gsCount
)

var guardSets = [gsCount]struct{ name, decl string }{
	{"guard-port", "ifname"},
	{"guard-mac", "ifname . ether_addr"},
	{"guard-arp", "ifname . ipv4_addr"},
	{"guard-v4", "ifname . ipv4_addr"},
	{"guard-v6", "ifname . ipv6_addr"},
}

// gelem is one element of a guard set.
type gelem struct {
	set  uint8
	ifn  string // the host end's name
	rest string // "" (gsPort), a MAC, or an address
}

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

// SetGuards makes our bridge-family table enforce exactly guards. The
// first call reads back the guards a previous agent left (a restart
// rewrites nothing that is in place); when the table is missing, and
// after a failure, it writes the chain, its sets and every element in one
// nft transaction; later calls write only the
// elements that changed, through netlink in one transaction, so a port's
// arrival costs the same at 10 ports as at 10,000 and runs no nft
// process. Rules match the host veth by name, so a guard may be set
// before its port is plugged.
func (d *Datapath) SetGuards(ctx context.Context, guards []Guard) error {
	if err := checkCtx(ctx); err != nil {
		return err
	}
	want := map[gelem]bool{}
	for _, g := range guards {
		if err := g.Validate(); err != nil {
			return err
		}
		for _, e := range guardElems(g, d.names.hostVeth(g.PortID)) {
			want[e] = true
		}
	}
	d.nftMu.Lock()
	defer d.nftMu.Unlock()
	if d.gin == nil {
		// A restarted agent finds the guards of its predecessor: it
		// reads them back and changes only what differs, so no guard is
		// ever removed and added back.
		d.gin = d.readGuards()
	}
	if d.gin == nil {
		err := d.writeGuards(ctx, want)
		if err == nil {
			d.gin = want
		}
		return err
	}
	type op struct {
		e   gelem
		del bool
	}
	var ops []op
	for e := range d.gin {
		if !want[e] {
			ops = append(ops, op{e, true})
		}
	}
	for e := range want {
		if !d.gin[e] {
			ops = append(ops, op{e: e})
		}
	}
	if len(ops) == 0 {
		return nil
	}
	err := nftbatch.Commit(d.gw, ops,
		func(o op) nftbatch.Key { return nftbatch.Key{Set: d.gsets[o.e.set], Order: int(o.e.set), Del: o.del} },
		func(o op) nftables.SetElement { return nftables.SetElement{Key: o.e.key()} },
		func(tx []op) {
			for _, o := range tx {
				if o.del {
					delete(d.gin, o.e)
				} else {
					d.gin[o.e] = true
				}
			}
		})
	if err != nil {
		d.gin = nil // unknown: the retry rewrites the table whole
		return fmt.Errorf("nftables: port guards: %w", err)
	}
	return nil
}

// readGuards returns the elements of the guard sets in the kernel, or nil
// when the table, its chain or one of its sets is missing or unreadable
// (the caller then writes the table whole).
func (d *Datapath) readGuards() map[gelem]bool {
	t := d.gsets[gsPort].Table
	chains, err := d.gr.ListChainsOfTableFamily(nftables.TableFamilyBridge)
	if err != nil || !slices.ContainsFunc(chains, func(c *nftables.Chain) bool {
		return c.Table != nil && c.Table.Name == t.Name && c.Name == guardChain
	}) {
		return nil
	}
	have := map[gelem]bool{}
	for i, set := range d.gsets {
		els, err := d.gr.GetSetElements(set)
		if err != nil {
			return nil
		}
		for _, el := range els {
			e, ok := gelemOf(uint8(i), el.Key)
			if !ok {
				return nil
			}
			have[e] = true
		}
	}
	return have
}

// gelemOf decodes a guard set's element key (see gelem.key).
func gelemOf(set uint8, k []byte) (gelem, bool) {
	if len(k) < ifNameSize {
		return gelem{}, false
	}
	e := gelem{set: set, ifn: string(bytes.TrimRight(k[:ifNameSize], "\x00"))}
	rest := k[ifNameSize:]
	switch {
	case set == gsPort && len(rest) == 0:
	case set == gsMAC && len(rest) == 8:
		e.rest = net.HardwareAddr(rest[:6]).String()
	case (set == gsARP || set == gsV4) && len(rest) == 4:
		e.rest = net.IP(rest).String()
	case set == gsV6 && len(rest) == 16:
		e.rest = net.IP(rest).String()
	default:
		return gelem{}, false
	}
	return e, true
}

// writeGuards writes the bridge table, its guard chain and sets, and the
// elements of want, in one transaction; elements not in want are gone.
func (d *Datapath) writeGuards(ctx context.Context, want map[gelem]bool) error {
	tx := d.bnft.NewTransaction()
	guardSkeleton(tx, d.cfg.Owner)
	for e := range want {
		tx.Add(&knftables.Element{Set: guardSets[e.set].name, Key: e.text()})
	}
	return d.inHost(func() error {
		if err := d.bnft.Run(ctx, tx); err != nil {
			return fmt.Errorf("nftables: port guards: %w", err)
		}
		return nil
	})
}

// guardElems are the set elements of guard g on host end ifn.
func guardElems(g Guard, ifn string) []gelem {
	out := []gelem{{set: gsPort, ifn: ifn}, {set: gsMAC, ifn: ifn, rest: g.MAC.String()},
		{set: gsARP, ifn: ifn, rest: "0.0.0.0"}}
	for _, ip := range g.IPs {
		if ip4 := ip.To4(); ip4 != nil {
			out = append(out, gelem{set: gsARP, ifn: ifn, rest: ip4.String()}, gelem{set: gsV4, ifn: ifn, rest: ip4.String()})
		} else {
			out = append(out, gelem{set: gsV6, ifn: ifn, rest: ip.String()})
		}
	}
	return out
}

// text is the element's key as knftables writes it.
func (e gelem) text() []string {
	if e.set == gsPort {
		return []string{strconv.Quote(e.ifn)}
	}
	return []string{strconv.Quote(e.ifn), e.rest}
}

// key is the element's key as the kernel holds it: the interface name
// zero-padded to IFNAMSIZ, then the MAC (padded to 8 bytes) or the
// address.
func (e gelem) key() []byte {
	k := make([]byte, ifNameSize, ifNameSize+16)
	copy(k, e.ifn)
	switch e.set {
	case gsMAC:
		mac, _ := net.ParseMAC(e.rest) // made from a valid MAC
		k = append(append(k, mac...), 0, 0)
	case gsARP, gsV4:
		k = append(k, net.ParseIP(e.rest).To4()...)
	case gsV6:
		k = append(k, net.ParseIP(e.rest).To16()...)
	}
	return k
}

// ifNameSize is the kernel's IFNAMSIZ: an interface name in an nft
// register, zero-padded.
const ifNameSize = 16

// guardSkeleton fills tx with the bridge table, its guard sets (emptied)
// and chain, and the chain's fixed rules: a frame from a guarded host end
// is dropped unless its source MAC, its type, and its ARP sender, IPv4 or
// IPv6 source are among that host end's elements.
func guardSkeleton(tx *knftables.Transaction, owner string) {
	tx.Add(&knftables.Table{Comment: knftables.PtrTo(owner + ": port security")})
	for _, s := range guardSets {
		tx.Add(&knftables.Set{Name: s.name, Type: s.decl})
		tx.Flush(&knftables.Set{Name: s.name})
	}
	tx.Add(&knftables.Chain{
		Name:     guardChain,
		Type:     knftables.PtrTo(knftables.FilterType),
		Hook:     knftables.PtrTo(knftables.PreroutingHook),
		Priority: knftables.PtrTo(knftables.FilterPriority),
		Policy:   knftables.PtrTo(knftables.AcceptPolicy),
	})
	tx.Flush(&knftables.Chain{Name: guardChain})
	guarded := []string{"iifname", "@" + guardSets[gsPort].name}
	for _, r := range [][]string{
		{"iifname", ".", "ether", "saddr", "!=", "@" + guardSets[gsMAC].name, "drop"},
		{"ether", "type", "!=", "{", "ip,", "arp,", "ip6", "}", "drop"},
		{"iifname", ".", "arp", "saddr", "ip", "!=", "@" + guardSets[gsARP].name, "drop"},
		{"iifname", ".", "ip", "saddr", "!=", "@" + guardSets[gsV4].name, "drop"},
		{"ip6", "saddr", "!=", "{", "fe80::/10,", "::", "}", "iifname", ".", "ip6", "saddr", "!=", "@" + guardSets[gsV6].name, "drop"},
	} {
		tx.Add(&knftables.Rule{Chain: guardChain, Rule: knftables.Concat(guarded, r), Comment: knftables.PtrTo(owner + ":guard")})
	}
}

// guardSetsOf are the netlink handles of the guard sets in the bridge
// table named table.
func guardSetsOf(table string) [gsCount]*nftables.Set {
	t := nfthost.Bridge(table)
	var out [gsCount]*nftables.Set
	for i, s := range guardSets {
		out[i] = &nftables.Set{Table: t, Name: s.name, Concatenation: strings.Contains(s.decl, ".")}
	}
	return out
}
