package lbpath

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	mnl "github.com/mdlayher/netlink"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"

	"kurma.dev/kurma/pkg/kerrors"
)

const (
	// msgElems bounds the elements of one netlink message: their list is
	// one attribute, whose length field has 16 bits.
	msgElems = 256
	// txOps bounds the element operations of one transaction; only a cold
	// sync of tens of thousands of load balancers is split.
	txOps = 400000
	// sockBuf is the send buffer of our netlink socket: a transaction is
	// one sendmsg.
	sockBuf = 64 << 20
)

// Config configures a Path.
type Config struct {
	// HostNS is the path of the network namespace that plays the host;
	// empty means the namespace the process runs in.
	HostNS string
	// Table names our inet table; default "kurma-lb". It may be shared
	// with other owners whose object names differ from ours (the agent
	// shares its VPC isolation table); we never set its comment or delete
	// it.
	Table string
	// ExtIface is the interface toward the external network; empty
	// disables floating IPs.
	ExtIface string
	// AcceptMark, when non-zero, is ORed into the packet mark of flows the
	// VPC isolation must let through: DNATed or SNATed connections, and a
	// FIP port's egress to ExtIface.
	AcceptMark uint32
	// RouteProtocol tags the local routes that make the host answer ARP
	// for its FIPs on ExtIface; default 76.
	RouteProtocol int
	Logger        *slog.Logger
}

// Path programs load balancers and floating IPs. It is safe for
// concurrent use; transactions are serialised by mu.
type Path struct {
	cfg    Config
	log    *slog.Logger
	nsf    *os.File            // the host namespace, kept open for conn
	nft    knftables.Interface // skeleton and pick chains, through nft -f
	conn   *nftables.Conn      // elements, through netlink
	nlh    *netlink.Handle     // FIP routes
	tbl    *nftables.Table
	sets   [numSets]*nftables.Set
	affSet *nftables.Set

	mu       sync.Mutex // guards everything below
	lbs      map[string]*LB
	fips     map[string]*FIP
	fipsOfLB map[string]map[string]bool // lb id -> ids of its FIPs
	// owned: per owner kind (ownLB, ownFIP), id -> the elements it
	// contributes (exact length; keyed by the object's own ID string).
	owned [2]map[string][]elem
	// els: every element wanted or in the kernel, with both states (one
	// map rather than a wanted map and a kernel mirror: at tens of
	// thousands of load balancers these maps are most of the agent's
	// memory).
	els       map[elem]slot
	pending   map[elem]bool   // keys whose kernel state may differ from want
	chains    map[string]bool // pick chains that exist in the kernel
	chainRefs map[string]int  // pick chain -> services elements that want it
	// affPurge holds the frontends (vip . proto . port, as in the
	// affinity map's key) whose affinity entries must go: their load
	// balancer was deleted or its members changed.
	affPurge map[string]bool
	gen      string // generation of the sets the rules use ("a" or "b")
	syncing  bool   // inside Sync: unused pick chains stay until the switch
}

// op is one change of the kernel: an element (or route) to add with val,
// or to delete.
type op struct {
	e   elem
	val string
	del bool
}

type contrib struct {
	e   elem
	val string
}

// slot is an element's wanted and kernel states.
type slot struct {
	want string // the wanted value, when refs > 0
	have string // the kernel's value, when in
	refs int32  // owners that want it; 0: not wanted
	in   bool   // the kernel holds it (as last read or written)
}

// setSlot stores s, or forgets e when it is neither wanted nor in the
// kernel.
func (p *Path) setSlot(e elem, s slot) {
	if s.refs <= 0 && !s.in {
		delete(p.els, e)
		return
	}
	p.els[e] = s
}

// setHave records the kernel's state of e.
func (p *Path) setHave(e elem, in bool, val string) {
	s := p.els[e]
	s.in, s.have = in, val
	if !in {
		s.have = ""
	}
	p.setSlot(e, s)
}

// clearHave forgets the kernel's state of every element (before it is
// read again).
func (p *Path) clearHave() {
	for e, s := range p.els {
		if s.in {
			s.in, s.have = false, ""
			p.setSlot(e, s)
		}
	}
}

// clearWant forgets what is wanted (before a Sync recomputes it).
func (p *Path) clearWant() {
	for e, s := range p.els {
		if s.refs > 0 {
			s.refs, s.want = 0, ""
			p.setSlot(e, s)
		}
	}
}

// New opens the host namespace and writes the table skeleton (table,
// sets, base chains). Existing elements are kept until Sync.
func New(ctx context.Context, cfg Config) (_ *Path, retErr error) {
	if cfg.Table == "" {
		cfg.Table = "kurma-lb"
	}
	if cfg.RouteProtocol == 0 {
		cfg.RouteProtocol = 76
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	p := &Path{cfg: cfg, log: cfg.Logger,
		lbs: map[string]*LB{}, fips: map[string]*FIP{}, fipsOfLB: map[string]map[string]bool{},
		owned: [2]map[string][]elem{{}, {}}, els: map[elem]slot{},
		pending: map[elem]bool{}, chains: map[string]bool{}, chainRefs: map[string]int{},
		affPurge: map[string]bool{}}
	nsPath := cfg.HostNS
	if nsPath == "" {
		nsPath = "/proc/self/ns/net"
	}
	f, err := os.Open(nsPath)
	if err != nil {
		return nil, kerrors.New(kerrors.NotFound, "lbpath: host netns %s: %v", nsPath, err)
	}
	p.nsf = f
	defer func() {
		if retErr != nil {
			p.Close()
		}
	}()
	p.conn, err = nftables.New(nftables.WithNetNSFd(int(f.Fd())), nftables.AsLasting(), nftables.WithSockOptions(bigBuffers))
	if err != nil {
		return nil, fmt.Errorf("lbpath: nftables netlink: %w", err)
	}
	nsh, err := netns.GetFromPath(nsPath)
	if err != nil {
		return nil, fmt.Errorf("lbpath: %w", err)
	}
	p.nlh, err = netlink.NewHandleAt(nsh, unix.NETLINK_ROUTE)
	_ = nsh.Close()
	if err != nil {
		return nil, fmt.Errorf("lbpath: netlink handle: %w", err)
	}
	err = p.inHost(func() error {
		var err error
		p.nft, err = knftables.New(knftables.InetFamily, cfg.Table)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("lbpath: nftables: %w", err)
	}
	p.tbl = &nftables.Table{Name: cfg.Table, Family: nftables.TableFamilyINet}
	p.affSet = &nftables.Set{Table: p.tbl, Name: "affinity", IsMap: true, HasTimeout: true}
	p.gen = "a"
	// Which generation of sets is in use: through netlink, as nft would
	// load every element first.
	tx := p.nft.NewTransaction()
	tx.Add(&knftables.Table{})
	if err := p.runNft(ctx, tx); err != nil {
		return nil, fmt.Errorf("lbpath: add table %s: %w", cfg.Table, err)
	}
	var maps []string
	sets, err := p.conn.GetSets(p.tbl)
	if err != nil {
		return nil, fmt.Errorf("lbpath: list sets: %w", err)
	}
	for _, s := range sets {
		maps = append(maps, s.Name)
	}
	if slices.Contains(maps, setName(setSvc, "b")) && !slices.Contains(maps, setName(setSvc, "a")) {
		p.gen = "b"
	}
	p.useGen(p.gen)
	if err := p.writeSkeleton(ctx, p.gen, ""); err != nil {
		return nil, err
	}
	return p, nil
}

// setName is the name of set i in generation gen ("a" or "b"): Sync fills
// the other generation and switches the rules to it in one transaction.
func setName(i int, gen string) string { return setDefs[i].name + "-" + gen }

// SetName is the current kernel name of one of the sets ("services",
// "backends", ...).
func (p *Path) SetName(base string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return base + "-" + p.gen
}

func (p *Path) useGen(gen string) {
	p.gen = gen
	for i, d := range setDefs {
		p.sets[i] = &nftables.Set{Table: p.tbl, Name: setName(i, gen), IsMap: d.isMap}
	}
}

func otherGen(g string) string {
	if g == "a" {
		return "b"
	}
	return "a"
}

// addSets adds the sets of generation gen to tx.
func addSets(tx *knftables.Transaction, gen string) {
	for i, d := range setDefs {
		if d.isMap {
			tx.Add(&knftables.Map{Name: setName(i, gen), Type: d.decl})
		} else {
			tx.Add(&knftables.Set{Name: setName(i, gen), Type: d.decl})
		}
	}
}

// Close releases the handles; the kernel state stays.
func (p *Path) Close() error {
	if p.conn != nil {
		_ = p.conn.CloseLasting()
	}
	if p.nlh != nil {
		p.nlh.Close()
	}
	if p.nsf != nil {
		_ = p.nsf.Close()
	}
	return nil
}

// Table is the name of the nft table this Path owns.
func (p *Path) Table() string { return p.cfg.Table }

func (p *Path) inHost(f func() error) error {
	if p.cfg.HostNS == "" {
		return f()
	}
	return ns.WithNetNSPath(p.cfg.HostNS, func(ns.NetNS) error { return f() })
}

func (p *Path) runNft(ctx context.Context, tx *knftables.Transaction) error {
	return p.inHost(func() error { return p.nft.Run(ctx, tx) })
}

// writeSkeleton adds the table, its sets and base chains, and rewrites
// the base chains' rules. Adding what exists changes nothing, so this is
// safe on a table a previous run left.
// With drop set, the sets of that generation are deleted in the same
// transaction that points the rules at gen.
func (p *Path) writeSkeleton(ctx context.Context, gen, drop string) error {
	tx := p.nft.NewTransaction()
	tx.Add(&knftables.Table{})
	addSets(tx, gen)
	// Declared with types, not typeof: nft 1.0.6 fails to read back the
	// typeof of some of these from the kernel when the table exists.
	tx.Add(&knftables.Map{Name: "affinity", Type: "ipv4_addr . ipv4_addr . inet_proto . inet_service : mark",
		Flags: []knftables.SetFlag{knftables.DynamicFlag, knftables.TimeoutFlag}, Size: knftables.PtrTo[uint64](1 << 20),
		Timeout: knftables.PtrTo(3 * time.Hour)})
	tx.Add(&knftables.Map{Name: "classes", Type: "mark : verdict", Comment: knftables.PtrTo("class (member count, affinity) -> pick chain")})
	tx.Add(&knftables.Chain{Name: emptyChain, Comment: knftables.PtrTo("load balancers without members")})
	tx.Flush(&knftables.Chain{Name: emptyChain})
	tx.Add(&knftables.Rule{Chain: emptyChain, Rule: "meta l4proto tcp reject with tcp reset"})
	tx.Add(&knftables.Rule{Chain: emptyChain, Rule: "reject"})
	tx.Add(&knftables.Element{Map: "classes", Key: []string{"0"}, Value: []string{"goto " + emptyChain}})

	base := func(name string, typ knftables.BaseChainType, hook knftables.BaseChainHook, prio knftables.BaseChainPriority, rules ...string) {
		tx.Add(&knftables.Chain{Name: name, Type: &typ, Hook: &hook, Priority: &prio})
		tx.Flush(&knftables.Chain{Name: name})
		for _, r := range rules {
			tx.Add(&knftables.Rule{Chain: name, Rule: r})
		}
	}
	ext := strconv.Quote(p.cfg.ExtIface)
	svcTuple := "iifname . ip daddr . meta l4proto . th dport"
	base("select-member", knftables.FilterType, knftables.PreroutingHook, "dstnat - 10",
		"ct state new meta mark set "+svcTuple+" map @"+setName(setSvc, gen)+" meta mark vmap @classes")
	dnat := []string{"dnat ip to " + svcTuple + " . meta mark map @" + setName(setBackend, gen)}
	snat := []string{"ct status dnat ip saddr . ip daddr @" + setName(setHairpin, gen) + " masquerade"}
	var fwd, input []string
	if p.cfg.ExtIface != "" {
		dnat = append(dnat, "iifname "+ext+" dnat ip to ip daddr map @"+setName(setFIPDNAT, gen))
		snat = append(snat, "oifname "+ext+" snat ip to ip saddr map @"+setName(setFIPSNAT, gen))
		if p.cfg.AcceptMark != 0 {
			// Only flows of our FIPs cross between the external interface
			// and a VPC (load balancer flows stay on their VPC's bridge):
			// DNATed to a port or VIP, SNATed from a port, and the first
			// packet of the latter (its reply tuple is not NATed yet).
			addrs, ports := setName(setFIPAddrs, gen), setName(setFIPPorts, gen)
			m := fmt.Sprintf("meta mark set meta mark | 0x%x", p.cfg.AcceptMark)
			fwd = append(fwd, "ct original ip daddr @"+addrs+" "+m, "ct reply ip daddr @"+addrs+" "+m,
				"oifname "+ext+" ip saddr @"+ports+" "+m)
		}
		input = append(input, "ip daddr @"+setName(setFIPAddrs, gen)+" reject")
	}
	base("nat-pre", knftables.NATType, knftables.PreroutingHook, knftables.DNATPriority, dnat...)
	base("nat-post", knftables.NATType, knftables.PostroutingHook, knftables.SNATPriority, snat...)
	base("filter-fwd", knftables.FilterType, knftables.ForwardHook, "filter - 10", fwd...)
	base("filter-in", knftables.FilterType, knftables.InputHook, knftables.FilterPriority, input...)
	if drop != "" {
		addSets(tx, drop)
		for i, d := range setDefs {
			if d.isMap {
				tx.Delete(&knftables.Map{Name: setName(i, drop)})
			} else {
				tx.Delete(&knftables.Set{Name: setName(i, drop)})
			}
		}
	}
	if err := p.runNft(ctx, tx); err != nil {
		return fmt.Errorf("lbpath: write table %s: %w", p.cfg.Table, err)
	}
	return nil
}

// Apply makes the changes live in one nft transaction that touches only
// the elements they change.
func (p *Path) Apply(ctx context.Context, ch Changes) error {
	for i := range ch.LBs {
		if err := ch.LBs[i].Validate(); err != nil {
			return err
		}
	}
	for i := range ch.FIPs {
		if err := ch.FIPs[i].Validate(); err != nil {
			return err
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	touched := map[string]bool{}
	for i := range ch.LBs {
		l := cloneLB(&ch.LBs[i])
		if old, ok := p.lbs[l.ID]; ok && old.Affinity > 0 && (l.Affinity == 0 || !slices.Equal(old.Members, l.Members)) {
			p.purgeAffinity(old)
		}
		p.lbs[l.ID] = l
		touched[l.ID] = true
	}
	for _, id := range ch.DeleteLBs {
		if old, ok := p.lbs[id]; ok && old.Affinity > 0 {
			p.purgeAffinity(old)
		}
		delete(p.lbs, id)
		touched[id] = true
	}
	for i := range ch.FIPs {
		f := ch.FIPs[i]
		p.setFIP(&f, touched)
	}
	for _, id := range ch.DeleteFIP {
		p.setFIP(&FIP{ID: id}, touched)
		delete(p.fips, id)
		p.setContrib(ownFIP, id, nil)
	}
	for id := range touched {
		p.refreshLB(id)
	}
	return p.commit(ctx)
}

// purgeAffinity queues the affinity entries of l's frontends for removal.
func (p *Path) purgeAffinity(l *LB) {
	for _, f := range p.frontends(l) {
		for _, ls := range l.Listeners {
			p.affPurge[string(putPort(putProto(putAddr(nil, f.addr), ls.Proto), ls.Port))] = true
		}
	}
}

// setFIP records f (an empty Addr: removal) and its own contributions,
// marking the load balancers whose frontends it changes.
func (p *Path) setFIP(f *FIP, touched map[string]bool) {
	if old, ok := p.fips[f.ID]; ok && old.LBID != "" {
		delete(p.fipsOfLB[old.LBID], f.ID)
		touched[old.LBID] = true
	}
	if !f.Addr.IsValid() {
		return
	}
	p.fips[f.ID] = f
	if f.LBID != "" {
		if p.fipsOfLB[f.LBID] == nil {
			p.fipsOfLB[f.LBID] = map[string]bool{}
		}
		p.fipsOfLB[f.LBID][f.ID] = true
		touched[f.LBID] = true
	}
	var cs []contrib
	if p.cfg.ExtIface != "" {
		fipElems(f, p.cfg.ExtIface, func(e elem, v string) { cs = append(cs, contrib{e, v}) })
	}
	p.setContrib(ownFIP, f.ID, cs)
}

func (p *Path) refreshLB(id string) {
	l, ok := p.lbs[id]
	if !ok {
		p.setContrib(ownLB, id, nil)
		return
	}
	var cs []contrib
	lbElems(l, p.frontends(l), func(e elem, v string) { cs = append(cs, contrib{e, v}) })
	p.setContrib(ownLB, l.ID, cs)
}

// frontends are the addresses l answers on: its VIP on its interface and
// its FIPs on the external one.
func (p *Path) frontends(l *LB) []frontend {
	fronts := []frontend{{l.Iface, l.VIP}}
	if p.cfg.ExtIface != "" {
		ids := make([]string, 0, len(p.fipsOfLB[l.ID]))
		for fid := range p.fipsOfLB[l.ID] {
			ids = append(ids, fid)
		}
		slices.Sort(ids)
		for _, fid := range ids {
			fronts = append(fronts, frontend{p.cfg.ExtIface, p.fips[fid].Addr})
		}
	}
	return fronts
}

// Owner kinds of Path.owned.
const (
	ownLB = iota
	ownFIP
)

// setContrib replaces what owner id of kind contributes to the wanted
// elements.
func (p *Path) setContrib(kind int, id string, cs []contrib) {
	owned := p.owned[kind]
	for _, e := range owned[id] {
		w, ok := p.els[e]
		if !ok || w.refs <= 0 {
			continue
		}
		w.refs--
		if w.refs <= 0 {
			p.chainRef(e, w.want, -1)
			w.want = ""
		}
		p.setSlot(e, w)
		p.pending[e] = true
	}
	for _, c := range cs {
		w := p.els[c.e]
		switch {
		case w.refs <= 0:
			w.want = c.val
			p.chainRef(c.e, c.val, 1)
		case w.want != c.val:
			// Two owners disagree (e.g. the same VIP and port twice): the
			// later one wins.
			p.chainRef(c.e, w.want, -1)
			p.chainRef(c.e, c.val, 1)
			w.want = c.val
		}
		w.refs++
		p.els[c.e] = w
		p.pending[c.e] = true
	}
	if len(cs) == 0 {
		delete(owned, id)
	} else {
		es := make([]elem, len(cs))
		for i, c := range cs {
			es[i] = c.e
		}
		owned[id] = es
	}
}

func (p *Path) chainRef(e elem, val string, d int) {
	if e.set != setSvc || len(val) != 4 {
		return
	}
	c := binary.NativeEndian.Uint32([]byte(val))
	if c == 0 {
		return
	}
	name := chainOfClass(c)
	p.chainRefs[name] += d
	if p.chainRefs[name] <= 0 {
		delete(p.chainRefs, name)
	}
}

// commit brings every pending element to its wanted state: missing pick
// chains first (nft -f), then one netlink transaction of element
// deletions and additions, then FIP routes, then unused pick chains.
func (p *Path) commit(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("lbpath: %w", err)
	}
	var missing []string
	for c := range p.chainRefs {
		if !p.chains[c] {
			missing = append(missing, c)
		}
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		tx := p.nft.NewTransaction()
		for _, c := range missing {
			if err := addPickChain(tx, c); err != nil {
				return err
			}
		}
		if err := p.runNft(ctx, tx); err != nil {
			return fmt.Errorf("lbpath: add chains %v: %w", missing, err)
		}
		for _, c := range missing {
			p.chains[c] = true
		}
	}

	var ops, routeOps []op
	for e := range p.pending {
		sl := p.els[e]
		wok, hok := sl.refs > 0, sl.in
		if e.set == setRoute {
			if wok != hok {
				routeOps = append(routeOps, op{e: e, del: hok})
			}
			continue
		}
		if hok && (!wok || sl.want != sl.have) {
			ops = append(ops, op{e: e, del: true})
		}
		if wok && (!hok || sl.want != sl.have) {
			ops = append(ops, op{e: e, val: sl.want})
		}
	}
	// Deletions first (a replaced element is deleted, then added), grouped
	// by set into messages of at most msgElems elements; one transaction
	// unless the change is larger than txOps (only a cold sync is).
	slices.SortFunc(ops, func(a, b op) int {
		if a.del != b.del {
			if a.del {
				return -1
			}
			return 1
		}
		return int(a.e.set) - int(b.e.set)
	})
	for len(ops) > 0 {
		tx := ops[:min(len(ops), txOps)]
		ops = ops[len(tx):]
		for i := 0; i < len(tx); {
			j := i + 1
			for j < len(tx) && j-i < msgElems && tx[j].del == tx[i].del && tx[j].e.set == tx[i].e.set {
				j++
			}
			els := make([]nftables.SetElement, 0, j-i)
			for _, o := range tx[i:j] {
				if o.del {
					els = append(els, nftables.SetElement{Key: []byte(o.e.key)})
				} else {
					els = append(els, p.element(o.e, o.val))
				}
			}
			var err error
			if tx[i].del {
				err = p.conn.SetDeleteElements(p.sets[tx[i].e.set], els)
			} else {
				err = p.conn.SetAddElements(p.sets[tx[i].e.set], els)
			}
			if err != nil {
				return fmt.Errorf("lbpath: %w", err)
			}
			i = j
		}
		if err := p.conn.Flush(); err != nil {
			return fmt.Errorf("lbpath: nft transaction of %d changes: %w", len(tx), err)
		}
		for _, o := range tx {
			p.setHave(o.e, !o.del, o.val)
		}
	}
	clear(p.pending)
	if len(p.affPurge) > 0 {
		if err := p.purge(func(tail string) bool { return p.affPurge[tail] }); err != nil {
			return err
		}
		clear(p.affPurge)
	}
	if err := p.syncRoutes(routeOps); err != nil {
		return err
	}
	if p.syncing {
		return nil
	}
	return p.gcChains(ctx)
}

// gcChains deletes the pick chains no services element wants.
func (p *Path) gcChains(ctx context.Context) error {
	var unused []string
	for c := range p.chains {
		if p.chainRefs[c] == 0 {
			unused = append(unused, c)
		}
	}
	if len(unused) > 0 {
		tx := p.nft.NewTransaction()
		for _, c := range unused {
			// Add first: deleting what a crash already removed fails.
			if err := addPickChain(tx, c); err != nil {
				return err
			}
			class, _ := classOfChain(c)
			tx.Delete(&knftables.Element{Map: "classes", Key: []string{strconv.FormatUint(uint64(class), 10)}})
			tx.Delete(&knftables.Chain{Name: c})
		}
		if err := p.runNft(ctx, tx); err != nil {
			return fmt.Errorf("lbpath: delete chains %v: %w", unused, err)
		}
		for _, c := range unused {
			delete(p.chains, c)
		}
	}
	return nil
}

func (p *Path) element(e elem, val string) nftables.SetElement {
	el := nftables.SetElement{Key: []byte(e.key)}
	switch {
	case setDefs[e.set].vmap:
		el.VerdictData = &expr.Verdict{Kind: expr.VerdictGoto, Chain: val}
	case setDefs[e.set].isMap:
		el.Val = []byte(val)
	}
	return el
}

// purge deletes the affinity entries whose frontend (the key's last 12
// bytes: vip . proto . port) drop selects, in one transaction.
func (p *Path) purge(drop func(tail string) bool) error {
	els, err := p.conn.GetSetElements(p.affSet)
	if err != nil {
		return fmt.Errorf("lbpath: list affinity: %w", err)
	}
	var del []nftables.SetElement
	for _, el := range els {
		if len(el.Key) == 16 && drop(string(el.Key[4:])) {
			del = append(del, nftables.SetElement{Key: el.Key})
		}
	}
	if len(del) == 0 {
		return nil
	}
	for c := range slices.Chunk(del, msgElems) {
		if err := p.conn.SetDeleteElements(p.affSet, c); err != nil {
			return fmt.Errorf("lbpath: %w", err)
		}
	}
	if err := p.conn.Flush(); err != nil {
		return fmt.Errorf("lbpath: purge %d affinity entries: %w", len(del), err)
	}
	return nil
}

// addPickChain adds (or rewrites) a shared chain that sets the packet
// mark to the index of one of n members: at random, or with affinity the
// one the client was sent to before.
func addPickChain(tx *knftables.Transaction, name string) error {
	rest, ok := strings.CutPrefix(name, "pick-")
	if !ok {
		return fmt.Errorf("lbpath: not a pick chain: %q", name)
	}
	nStr, affStr, aff := strings.Cut(rest, "-aff-")
	n, err := strconv.Atoi(nStr)
	if err != nil || n < 1 || n > MaxMembers {
		return fmt.Errorf("lbpath: bad pick chain %q", name)
	}
	secs := 0
	if aff {
		if secs, err = strconv.Atoi(affStr); err != nil || secs < 1 {
			return fmt.Errorf("lbpath: bad pick chain %q", name)
		}
	}
	tx.Add(&knftables.Chain{Name: name})
	tx.Flush(&knftables.Chain{Name: name})
	defer tx.Add(&knftables.Element{Map: "classes", Key: []string{strconv.FormatUint(uint64(classOf(n, time.Duration(secs)*time.Second)), 10)},
		Value: []string{"goto " + name}})
	pick := fmt.Sprintf("meta mark set numgen random mod %d", n)
	if aff {
		key := "ip saddr . ip daddr . meta l4proto . th dport"
		tx.Add(&knftables.Rule{Chain: name, Rule: fmt.Sprintf("meta mark set %s map @affinity meta mark < %d accept", key, n)})
		tx.Add(&knftables.Rule{Chain: name, Rule: fmt.Sprintf("%s update @affinity { %s timeout %ds : meta mark } accept", pick, key, secs)})
		return nil
	}
	tx.Add(&knftables.Rule{Chain: name, Rule: pick + " accept"})
	return nil
}

// classOfChain is the class a pick chain serves.
func classOfChain(name string) (uint32, bool) {
	rest, ok := strings.CutPrefix(name, "pick-")
	if !ok {
		return 0, false
	}
	nStr, affStr, aff := strings.Cut(rest, "-aff-")
	n, err := strconv.Atoi(nStr)
	if err != nil {
		return 0, false
	}
	secs := 0
	if aff {
		if secs, err = strconv.Atoi(affStr); err != nil {
			return 0, false
		}
	}
	return classOf(n, time.Duration(secs)*time.Second), true
}

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

// Sync makes the kernel match s exactly: it reads back every element,
// route and pick chain, adds what is missing and removes what is stale.
// Call it at start and after a failed Apply.
func (p *Path) Sync(ctx context.Context, s State) error {
	for i := range s.LBs {
		if err := s.LBs[i].Validate(); err != nil {
			return err
		}
	}
	for i := range s.FIPs {
		if err := s.FIPs[i].Validate(); err != nil {
			return err
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.lbs, p.fips, p.fipsOfLB = map[string]*LB{}, map[string]*FIP{}, map[string]map[string]bool{}
	p.owned, p.chainRefs = [2]map[string][]elem{{}, {}}, map[string]int{}
	p.clearWant()
	touched := map[string]bool{}
	for i := range s.LBs {
		l := cloneLB(&s.LBs[i])
		p.lbs[l.ID] = l
		touched[l.ID] = true
	}
	for i := range s.FIPs {
		f := s.FIPs[i]
		p.setFIP(&f, touched)
	}
	for id := range touched {
		p.refreshLB(id)
	}
	// Reading tens of thousands of elements back takes the kernel seconds
	// (a dump restarts its hash walk per message); writing them takes
	// less. So the sets are flushed and refilled in the same transaction:
	// atomic for traffic, and nothing stale can survive.
	if err := p.read(ctx, false); err != nil {
		return err
	}
	old, gen := p.gen, otherGen(p.gen)
	// The skeleton first: someone may have deleted the table.
	if err := p.writeSkeleton(ctx, old, ""); err != nil {
		return err
	}
	tx := p.nft.NewTransaction()
	addSets(tx, gen)
	for i, d := range setDefs {
		if d.isMap {
			tx.Flush(&knftables.Map{Name: setName(i, gen)})
		} else {
			tx.Flush(&knftables.Set{Name: setName(i, gen)})
		}
	}
	if err := p.runNft(ctx, tx); err != nil {
		return fmt.Errorf("lbpath: prepare sets %s: %w", gen, err)
	}
	p.useGen(gen)
	for e := range p.els {
		p.pending[e] = true
	}
	p.syncing = true
	err := p.commit(ctx)
	p.syncing = false
	if err == nil {
		err = p.writeSkeleton(ctx, gen, old)
	}
	if err != nil {
		p.useGen(old)
		return err
	}
	if err := p.gcChains(ctx); err != nil {
		return err
	}
	keep := map[string]bool{}
	for _, l := range p.lbs {
		if l.Affinity == 0 {
			continue
		}
		for _, f := range p.frontends(l) {
			for _, ls := range l.Listeners {
				keep[string(putPort(putProto(putAddr(nil, f.addr), ls.Proto), ls.Port))] = true
			}
		}
	}
	return p.purge(func(tail string) bool { return !keep[tail] })
}

// readKernel refreshes the mirror of elements, pick chains and routes.
func (p *Path) readKernel(ctx context.Context) error {
	return p.read(ctx, true)
}

// read refreshes the mirror of pick chains and routes, and of elements
// when elements is set (else the mirror holds no element).
func (p *Path) read(ctx context.Context, elements bool) error {
	have := map[elem]string{}
	replaced := false
	defer func() {
		// Once the elements are read, they (and the routes read after
		// them) replace the kernel state of every element.
		if replaced {
			p.clearHave()
			for e, v := range have {
				p.setHave(e, true, v)
			}
		}
	}()
	for s := range numSets {
		if !elements {
			break
		}
		els, err := p.conn.GetSetElements(p.sets[s])
		if err != nil {
			return fmt.Errorf("lbpath: list %s: %w", setDefs[s].name, err)
		}
		for _, el := range els {
			val := string(el.Val)
			have[elem{uint8(s), string(el.Key)}] = val
		}
	}
	replaced = true
	// Through netlink: `nft list chains` loads every element of the
	// table first, seconds at tens of thousands.
	chains, err := p.conn.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return fmt.Errorf("lbpath: list chains: %w", err)
	}
	p.chains = map[string]bool{}
	for _, c := range chains {
		if c.Table != nil && c.Table.Name == p.cfg.Table && strings.HasPrefix(c.Name, "pick-") {
			p.chains[c.Name] = true
		}
	}
	rs, err := p.listRoutes()
	if err != nil {
		return err
	}
	for _, r := range rs {
		a, ok := netip.AddrFromSlice(r.Dst.IP.To4())
		if !ok {
			continue
		}
		l, err := p.nlh.LinkByIndex(r.LinkIndex)
		if err != nil {
			continue
		}
		have[routeElem(l.Attrs().Name, a)] = ""
	}
	return nil
}

// listRoutes returns our FIP routes (by protocol tag), retrying a dump
// the kernel interrupted.
func (p *Path) listRoutes() ([]netlink.Route, error) {
	filter := &netlink.Route{Table: unix.RT_TABLE_LOCAL, Protocol: netlink.RouteProtocol(p.cfg.RouteProtocol)}
	for range 5 {
		rs, err := p.nlh.RouteListFiltered(netlink.FAMILY_V4, filter, netlink.RT_FILTER_TABLE|netlink.RT_FILTER_PROTOCOL)
		if errors.Is(err, netlink.ErrDumpInterrupted) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("lbpath: list routes: %w", err)
		}
		return rs, nil
	}
	return nil, fmt.Errorf("lbpath: list routes: %w", netlink.ErrDumpInterrupted)
}

// bigBuffers lets one sendmsg carry a large transaction (the default
// limit, wmem_max, is a few MiB) and the socket receive its acks.
func bigBuffers(c *mnl.Conn) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	err = rc.Control(func(fd uintptr) {
		serr = errors.Join(unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, sockBuf),
			unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 8<<20))
	})
	return errors.Join(err, serr)
}

func cloneLB(l *LB) *LB {
	c := *l
	c.Listeners = slices.Clone(l.Listeners)
	c.Members = slices.Clone(l.Members)
	return &c
}

// readKernelLocked is readKernel under mu.
func (p *Path) readKernelLocked(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.readKernel(ctx)
}

// Counts reports how many elements the kernel holds per set and how many
// pick chains exist, as last read or written.
func (p *Path) Counts() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[string]int{"chains": len(p.chains)}
	for e, sl := range p.els {
		if !sl.in {
			continue
		}
		if e.set == setRoute {
			out["routes"]++
		} else {
			out[setDefs[e.set].name]++
		}
	}
	return out
}

// ErrDrift is returned by Check when the kernel lacks what this Path
// wrote (a table deleted or flushed by someone else): call Sync.
var ErrDrift = errors.New("lbpath: the kernel lacks objects this path wrote")

// Check compares the table's chains and sets with what this Path wrote,
// through two small netlink listings (no element is read). It does not
// notice single elements removed by hand; Sync repairs those.
func (p *Path) Check(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("lbpath: %w", err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	chains, err := p.conn.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return fmt.Errorf("lbpath: list chains: %w", err)
	}
	have := map[string]bool{}
	for _, c := range chains {
		if c.Table != nil && c.Table.Name == p.cfg.Table {
			have[c.Name] = true
		}
	}
	for _, c := range []string{"select-member", "nat-pre", "nat-post", "filter-fwd", "filter-in", emptyChain} {
		if !have[c] {
			return fmt.Errorf("%w: chain %s", ErrDrift, c)
		}
	}
	for c := range p.chains {
		if !have[c] {
			return fmt.Errorf("%w: chain %s", ErrDrift, c)
		}
	}
	sets, err := p.conn.GetSets(p.tbl)
	if err != nil {
		return fmt.Errorf("%w: list sets: %v", ErrDrift, err)
	}
	names := map[string]bool{}
	for _, s := range sets {
		names[s.Name] = true
	}
	for i := range setDefs {
		if !names[setName(i, p.gen)] {
			return fmt.Errorf("%w: set %s", ErrDrift, setName(i, p.gen))
		}
	}
	return nil
}
