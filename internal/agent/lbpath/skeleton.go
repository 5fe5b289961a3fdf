package lbpath

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/userdata"
	"sigs.k8s.io/knftables"

	"kurma.dev/kurma/internal/agent/nfthost"
)

// genDefs declares the data sets to nfthost.Generations, which keeps
// them in two generations ("services-a", "services-b", ...): Sync fills
// the unused one and switches the rules to it in one transaction.
func genDefs() []nfthost.SetDef {
	out := make([]nfthost.SetDef, len(setDefs))
	for i, d := range setDefs {
		out[i] = nfthost.SetDef{Name: d.name, IsMap: d.isMap, Decl: d.decl}
	}
	return out
}

// setTable sets the table this Path writes, its data sets' generations
// (the current one "a", until New reads the kernel's) and the affinity
// map.
func (p *Path) setTable(tbl *nftables.Table) {
	p.tbl = tbl
	p.gens = nfthost.NewGenerations(tbl, genDefs())
	p.affSet = &nftables.Set{Table: tbl, Name: "affinity", IsMap: true, HasTimeout: true}
}

// SetName is the current kernel name of one of the sets ("services",
// "backends", ...).
func (p *Path) SetName(base string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return base + "-" + p.gens.Current()
}

// writeSkeleton adds the table, its sets and base chains, and rewrites
// the base chains' rules. Adding what exists changes nothing, so this is
// safe on a table a previous run left.
// With drop set, the sets of that generation are deleted in the same
// transaction that points the rules at gen.
//
// A chain whose rules are already the wanted ones (its last rule carries
// their fingerprint as comment, see chainFingerprint) is left alone, and
// node-addrs changes only by the addresses that differ: a restarted agent
// rewrites nothing that is in place.
func (p *Path) writeSkeleton(ctx context.Context, gen, drop string) error {
	have, err := p.chainPrints()
	if err != nil {
		return err
	}
	nodeAddrs, err := p.setAddrs(nodeAddrsSet)
	if err != nil {
		return err
	}
	tx := p.nft.NewTransaction()
	tx.Add(&knftables.Table{})
	for _, o := range p.gens.Objects(gen) {
		tx.Add(o)
	}
	// Declared with types, not typeof: nft 1.0.6 fails to read back the
	// typeof of some of these from the kernel when the table exists.
	tx.Add(&knftables.Map{Name: "affinity", Type: "ipv4_addr . ipv4_addr . inet_proto . inet_service : mark",
		Flags: []knftables.SetFlag{knftables.DynamicFlag, knftables.TimeoutFlag}, Size: knftables.PtrTo[uint64](1 << 20),
		Timeout: knftables.PtrTo(3 * time.Hour)})
	tx.Add(&knftables.Map{Name: "classes", Type: "mark : verdict", Comment: knftables.PtrTo("class (member count, affinity) -> pick chain")})
	// rewrite flushes chain name and adds rules unless they are in place.
	rewrite := func(name string, rules []string, def ...string) {
		fp := chainFingerprint(name, rules, def...)
		if got, ok := have[name]; ok && got == fp {
			return
		}
		tx.Flush(&knftables.Chain{Name: name})
		for i, r := range rules {
			rule := &knftables.Rule{Chain: name, Rule: r}
			if i == len(rules)-1 {
				rule.Comment = knftables.PtrTo(fp)
			}
			tx.Add(rule)
		}
	}
	tx.Add(&knftables.Chain{Name: emptyChain, Comment: knftables.PtrTo("load balancers without members")})
	rewrite(emptyChain, []string{"meta l4proto tcp reject with tcp reset", "reject"})
	tx.Add(&knftables.Element{Map: "classes", Key: []string{"0"}, Value: []string{"goto " + emptyChain}})
	tx.Add(&knftables.Set{Name: nodeAddrsSet, Type: "ipv4_addr", Comment: knftables.PtrTo("addresses node ports answer on")})
	for _, a := range nodeAddrs {
		if !slices.Contains(p.cfg.NodeAddrs, a) {
			tx.Delete(&knftables.Element{Set: nodeAddrsSet, Key: []string{a.String()}})
		}
	}
	for _, a := range p.cfg.NodeAddrs {
		if !slices.Contains(nodeAddrs, a) {
			tx.Add(&knftables.Element{Set: nodeAddrsSet, Key: []string{a.String()}})
		}
	}

	base := func(name string, typ knftables.BaseChainType, hook knftables.BaseChainHook, prio knftables.BaseChainPriority, rules ...string) {
		tx.Add(&knftables.Chain{Name: name, Type: &typ, Hook: &hook, Priority: &prio})
		rewrite(name, rules, string(typ), string(hook), string(prio))
	}
	for _, r := range p.rules(gen) {
		base(r.name, r.typ, r.hook, r.prio, r.rules...)
	}
	if drop != "" {
		p.gens.Drop(tx, drop)
	}
	if err := p.runNft(ctx, tx); err != nil {
		return fmt.Errorf("lbpath: write table %s: %w", p.cfg.Table, err)
	}
	return nil
}

// chainFingerprint names a chain's rules (and definition def): the
// comment of its last rule, by which writeSkeleton knows the chain is in
// place. A chain without rules has the fingerprint "".
func chainFingerprint(name string, rules []string, def ...string) string {
	if len(rules) == 0 {
		return ""
	}
	h := sha256.New()
	for _, s := range append(append([]string{name}, def...), rules...) {
		h.Write([]byte(s))
		h.Write([]byte{0})
	}
	return "kurma " + hex.EncodeToString(h.Sum(nil)[:8])
}

// chainPrints reads, through netlink (no element is loaded), the
// fingerprint of each chain of the table that has rules: the comment of
// its last rule ("" for a chain without rules, "?" when the last rule has
// no comment).
func (p *Path) chainPrints() (map[string]string, error) {
	chains, err := p.r.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return nil, fmt.Errorf("lbpath: list chains: %w", err)
	}
	out := map[string]string{}
	for _, c := range chains {
		if c.Table == nil || c.Table.Name != p.cfg.Table || strings.HasPrefix(c.Name, "pick-") {
			continue
		}
		rules, err := p.r.GetRules(p.tbl, c)
		if err != nil {
			return nil, fmt.Errorf("lbpath: list rules of %s: %w", c.Name, err)
		}
		fp := ""
		if n := len(rules); n > 0 {
			fp = "?"
			if s, ok := userdata.GetString(rules[n-1].UserData, userdata.TypeComment); ok {
				fp = s
			}
		}
		out[c.Name] = fp
	}
	return out, nil
}

// setAddrs lists the IPv4 addresses of a set of the table (none when it
// does not exist yet).
func (p *Path) setAddrs(name string) ([]netip.Addr, error) {
	sets, err := p.r.GetSets(p.tbl)
	if err != nil {
		return nil, nil // no table (deleted by someone): the skeleton adds it
	}
	var set *nftables.Set
	for _, s := range sets {
		if s.Name == name {
			set = s
		}
	}
	if set == nil {
		return nil, nil
	}
	els, err := p.r.GetSetElements(set)
	if err != nil {
		return nil, fmt.Errorf("lbpath: list %s: %w", name, err)
	}
	var out []netip.Addr
	for _, e := range els {
		if a, ok := netip.AddrFromSlice(e.Key); ok && a.Is4() {
			out = append(out, a)
		}
	}
	return out, nil
}

// CtMarkSNAT is the connection-mark bit of connections that nat-post
// source-NATs to the node address: those of external frontends of load
// balancers without ExternalLocal, and those the host opens into a VPC
// bridge. Other users of the connection mark on the host must keep away
// from it. nfthost owns the agent's marks.
const CtMarkSNAT = nfthost.CtMarkSNAT

// nodeAddrsSet holds Config.NodeAddrs; it is written with the skeleton.
const nodeAddrsSet = "node-addrs"

// baseChain is one base chain and its rules.
type baseChain struct {
	name  string
	typ   knftables.BaseChainType
	hook  knftables.BaseChainHook
	prio  knftables.BaseChainPriority
	rules []string
}

// baseChains are the names of the chains rules returns (Check wants them).
var baseChains = []string{"select-member", "select-out", "nat-pre", "nat-out", "nat-post", "filter-fwd", "filter-in"}

// rules are the base chains and their rules, pointing at the sets of
// generation gen.
//
// A new connection is matched in this order, in select-member (packets
// arriving) and select-out (packets the host sends), the nat chains doing
// the same lookups for the DNAT: a frontend keyed by input interface (a
// VIP on its bridge, "" for the host's own connections, a FIP on the
// external interface), then an external address on any interface, then a
// node port on a node address. The first map that holds the packet's key
// sets the class, whose pick chain sets the member index in the mark.
func (p *Path) rules(gen string) []baseChain {
	set := func(i int) string { return "@" + p.gens.Name(i, gen) }
	ext := strconv.Quote(p.cfg.ExtIface)
	svcTuple := "iifname . ip daddr . meta l4proto . th dport"
	extTuple := "ip daddr . meta l4proto . th dport"
	npTuple := "meta l4proto . th dport"
	nodeAddr := "ip daddr @" + nodeAddrsSet + " "
	snatMark := fmt.Sprintf("ct mark set ct mark | 0x%x", CtMarkSNAT)
	sel := []string{
		// External frontends whose connections are source-NATed to the
		// node address: decided here, where the frontend is still the
		// destination, and carried to nat-post in the connection's mark.
		"ct state new " + extTuple + " " + set(setSNATFront) + " " + snatMark,
		"ct state new " + nodeAddr + npTuple + " " + set(setSNATNP) + " " + snatMark,
		"ct state new meta mark set " + svcTuple + " map " + set(setSvc) + " meta mark vmap @classes",
		"ct state new meta mark set " + extTuple + " map " + set(setExt) + " meta mark vmap @classes",
		"ct state new " + nodeAddr + "meta mark set " + npTuple + " map " + set(setNP) + " meta mark vmap @classes",
	}
	dnat := []string{
		"dnat ip to " + svcTuple + " . meta mark map " + set(setBackend),
		"dnat ip to " + extTuple + " . meta mark map " + set(setExtBackend),
		nodeAddr + "dnat ip to " + npTuple + " . meta mark map " + set(setNPBackend),
	}
	dnatIn := slices.Clone(dnat)
	snat := []string{"ct status dnat ip saddr . ip daddr " + set(setHairpin) + " masquerade"}
	var fwd, input []string
	if p.cfg.ExtIface != "" {
		dnatIn = append(dnatIn, "iifname "+ext+" dnat ip to ip daddr map "+set(setFIPDNAT))
		snat = append(snat, "oifname "+ext+" snat ip to ip saddr map "+set(setFIPSNAT))
		input = append(input, "ip daddr "+set(setFIPAddrs)+" reject")
	}
	// Connections of external frontends are source-NATed to the node
	// address unless their load balancer keeps the client's (local
	// members only), so that a member on another host replies through
	// this one.
	// A loopback node address (a single-host setup) cannot leave the
	// host: masquerade, and the host's own connections into a VPC keep
	// the bridge gateway's address, as without a node address.
	nodeIP := p.cfg.NodeIP.IsValid() && !p.cfg.NodeIP.IsLoopback()
	toNode := "masquerade"
	if nodeIP {
		toNode = "snat ip to " + p.cfg.NodeIP.String()
	}
	snat = append(snat, fmt.Sprintf("ct mark & 0x%x == 0x%x %s", CtMarkSNAT, CtMarkSNAT, toNode))
	selOut := sel
	if g := p.cfg.BridgeGlob; g != "" {
		br := strconv.Quote(g)
		if nodeIP {
			// What the host sends into a VPC leaves from the bridge's
			// gateway address, which every host shares: a pod on another
			// host would answer its own host. The node address is unique.
			selOut = append([]string{"ct state new oifname " + br + " ip saddr != " + p.cfg.NodeIP.String() + " " + snatMark}, sel...)
		}
		// Members outside the VPC (host addresses) on another host, and,
		// with Egress, whatever pods send out: replies must come back
		// through this host.
		if p.cfg.Egress {
			snat = append(snat, "iifname "+br+" oifname != "+br+" masquerade")
		} else {
			snat = append(snat, "ct status dnat iifname "+br+" oifname != "+br+" masquerade")
		}
	}
	if p.cfg.AcceptMark != 0 {
		m := fmt.Sprintf("meta mark set meta mark | 0x%x", p.cfg.AcceptMark)
		// The VPC isolation drops what is routed into or out of a VPC
		// bridge unless this bit is set: let NATed connections through
		// (FIPs DNATed to a port or VIP and SNATed from a port, load
		// balancer connections of external frontends and outside
		// members, the runtime's host ports), and with Egress what pods
		// send out.
		fwd = append(fwd, "ct status dnat "+m, "ct status snat "+m)
		if p.cfg.ExtIface != "" {
			// The first packet of a FIP port's egress: its reply tuple is
			// not NATed yet.
			fwd = append(fwd, "oifname "+ext+" ip saddr "+set(setFIPPorts)+" "+m)
		}
		if p.cfg.Egress && p.cfg.BridgeGlob != "" {
			br := strconv.Quote(p.cfg.BridgeGlob)
			fwd = append(fwd, "iifname "+br+" oifname != "+br+" "+m)
		}
	}
	return []baseChain{
		{"select-member", knftables.FilterType, knftables.PreroutingHook, "dstnat - 10", sel},
		// The priority names of prerouting do not exist for output.
		{"select-out", knftables.FilterType, knftables.OutputHook, "-110", selOut},
		{"nat-pre", knftables.NATType, knftables.PreroutingHook, knftables.DNATPriority, dnatIn},
		{"nat-out", knftables.NATType, knftables.OutputHook, "-100", dnat},
		{"nat-post", knftables.NATType, knftables.PostroutingHook, knftables.SNATPriority, snat},
		{"filter-fwd", knftables.FilterType, knftables.ForwardHook, "filter - 10", fwd},
		{"filter-in", knftables.FilterType, knftables.InputHook, knftables.FilterPriority, input},
	}
}
