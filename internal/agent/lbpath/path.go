package lbpath

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"

	"kurma.dev/kurma/internal/agent/nftbatch"
	"kurma.dev/kurma/internal/agent/nfthost"
	"kurma.dev/kurma/pkg/kerrors"
)

const (
	// msgElems bounds the elements of one netlink message (as
	// nftbatch.MsgElems, for the affinity purge's deletions).
	msgElems = nftbatch.MsgElems
)

// DefaultRouteProtocol is the routing protocol number of the routes a
// Path adds when Config.RouteProtocol is 0 (kurma-agent --uninstall
// removes the routes that carry it).
const DefaultRouteProtocol = 76

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
	// for its FIPs on ExtIface, and the service routes; default
	// DefaultRouteProtocol.
	RouteProtocol int
	// NodeIP is the address connections of external frontends are
	// source-NATed to (so that a member on another host replies through
	// this one), and the source of what the host itself sends into a VPC
	// bridge. Invalid: masquerade (the outgoing interface's address),
	// which only works for members on this host; so does a loopback
	// address, which cannot leave the host.
	NodeIP netip.Addr
	// NodeAddrs are the addresses node ports answer on; default NodeIP.
	NodeAddrs []netip.Addr
	// BridgeGlob matches the names of every VPC bridge of the agent (an
	// nft wildcard such as "kab*"): what leaves a VPC bridge for another
	// interface is egress. Required for NodeIP's host SNAT and Egress.
	BridgeGlob string
	// ServiceRoutes are ranges of VIPs the host must be able to open
	// connections to (Kubernetes' service range) even without a route
	// that covers them (a node without a default route): each gets a
	// route through lo with NodeIP as source, tagged RouteProtocol; the
	// output DNAT then sends the connection to its member.
	ServiceRoutes []netip.Prefix
	// Egress lets pods reach what lies outside their VPC through the
	// host's routing, masqueraded to the outgoing interface's address
	// (Kubernetes pods' egress). Without it only connections of load
	// balancers and floating IPs cross a VPC bridge.
	Egress bool
	// ConntrackCloseWait, when positive, is written (in whole seconds) to
	// net.netfilter.nf_conntrack_tcp_timeout_close_wait in the host
	// namespace, as kube-proxy's --conntrack-tcp-timeout-close-wait: the
	// kernel's 60 s drops the NAT of a half-closed connection whose peer
	// still sends.
	ConntrackCloseWait time.Duration
	Logger             *slog.Logger
}

// Path programs load balancers and floating IPs. It is safe for
// concurrent use; transactions are serialised by mu.
type Path struct {
	cfg    Config
	log    *slog.Logger
	nft    knftables.Interface   // skeleton and pick chains, through nft -f
	conn   *nfthost.Conn         // elements, through netlink
	w      nfthost.ElementWriter // writes elements: conn (tests: a nfthost.Recorder)
	r      nfthost.Reader        // reads the kernel back: conn (tests: a nfthost.Recorder)
	nlh    *netlink.Handle       // FIP routes
	tbl    *nftables.Table
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
	// gens: the data sets, in the generation the rules use (the other
	// one exists only while Sync rebuilds).
	gens    *nfthost.Generations
	syncing bool // inside Sync: unused pick chains stay until the switch
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
		cfg.RouteProtocol = DefaultRouteProtocol
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if len(cfg.NodeAddrs) == 0 && cfg.NodeIP.IsValid() {
		cfg.NodeAddrs = []netip.Addr{cfg.NodeIP}
	}
	for _, a := range append([]netip.Addr{cfg.NodeIP}, cfg.NodeAddrs...) {
		if a.IsValid() && !a.Is4() {
			return nil, kerrors.New(kerrors.Invalid, "lbpath: node address %v: want IPv4", a)
		}
	}
	if (cfg.Egress || cfg.NodeIP.IsValid()) && !validGlob(cfg.BridgeGlob) {
		return nil, kerrors.New(kerrors.Invalid, "lbpath: bridge glob %q: want a name prefix ending in '*'", cfg.BridgeGlob)
	}
	p := barePath(cfg)
	nsPath := cfg.HostNS
	if nsPath == "" {
		nsPath = "/proc/self/ns/net"
	}
	defer func() {
		if retErr != nil {
			p.Close()
		}
	}()
	if err := setCloseWait(cfg.HostNS, cfg.ConntrackCloseWait); err != nil {
		return nil, err
	}
	conn, err := nfthost.Open(cfg.HostNS)
	if err != nil {
		return nil, fmt.Errorf("lbpath: %w", err)
	}
	p.conn, p.w, p.r = conn, conn, conn
	nsh, err := netns.GetFromPath(nsPath)
	if err != nil {
		return nil, fmt.Errorf("lbpath: %w", err)
	}
	// Routes (FIPs, on-link VIPs) and conntrack (stale UDP flows).
	p.nlh, err = netlink.NewHandleAt(nsh, unix.NETLINK_ROUTE, unix.NETLINK_NETFILTER)
	_ = nsh.Close()
	if err != nil {
		return nil, fmt.Errorf("lbpath: netlink handle: %w", err)
	}
	if p.nft, err = nfthost.Knft(cfg.HostNS, knftables.InetFamily, cfg.Table); err != nil {
		return nil, fmt.Errorf("lbpath: %w", err)
	}
	if err := p.ensureServiceRoutes(); err != nil {
		return nil, err
	}
	p.setTable(nfthost.Inet(cfg.Table))
	tx := p.nft.NewTransaction()
	tx.Add(&knftables.Table{})
	if err := p.runNft(ctx, tx); err != nil {
		return nil, fmt.Errorf("lbpath: add table %s: %w", cfg.Table, err)
	}
	// Which generation of sets is in use.
	if err := p.gens.Detect(p.r); err != nil {
		return nil, fmt.Errorf("lbpath: %w", err)
	}
	if err := p.writeSkeleton(ctx, p.gens.Current(), ""); err != nil {
		return nil, err
	}
	return p, nil
}

// barePath is a Path without handles (New adds them).
func barePath(cfg Config) *Path {
	return &Path{cfg: cfg, log: cfg.Logger,
		lbs: map[string]*LB{}, fips: map[string]*FIP{}, fipsOfLB: map[string]map[string]bool{},
		owned: [2]map[string][]elem{{}, {}}, els: map[elem]slot{},
		pending: map[elem]bool{}, chains: map[string]bool{}, chainRefs: map[string]int{},
		affPurge: map[string]bool{}}
}

// Close releases the handles; the kernel state stays.
func (p *Path) Close() error {
	if p.conn != nil {
		_ = p.conn.Close()
	}
	if p.nlh != nil {
		p.nlh.Close()
	}
	return nil
}

// Table is the name of the nft table this Path owns.
func (p *Path) Table() string { return p.cfg.Table }

func (p *Path) inHost(f func() error) error { return nfthost.InHost(p.cfg.HostNS, f) }

func (p *Path) runNft(ctx context.Context, tx *knftables.Transaction) error {
	return p.inHost(func() error { return p.nft.Run(ctx, tx) })
}

// validGlob accepts an interface-name wildcard as nft takes it: 1 to 14
// bytes of a name, then '*'.
func validGlob(g string) bool {
	pfx, ok := strings.CutSuffix(g, "*")
	return ok && pfx != "" && len(pfx) < 15 && !strings.ContainsAny(pfx, "*\"/ \t")
}

func cloneLB(l *LB) *LB {
	c := *l
	c.Listeners = slices.Clone(l.Listeners)
	c.Members = slices.Clone(l.Members)
	for i := range c.Members {
		c.Members[i].Serves = slices.Clone(c.Members[i].Serves)
	}
	c.External = slices.Clone(l.External)
	return &c
}
