package netpol

import (
	"encoding/binary"
	"fmt"
	"maps"
	"math"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"

	"kurma.dev/kurma/internal/kube/podnet"
	"kurma.dev/kurma/internal/policyrule"
)

// Proto is an IP protocol number (0: every protocol).
type Proto = policyrule.Proto

// The protocols a NetworkPolicy port names.
const (
	TCP  Proto = 6
	UDP  Proto = 17
	SCTP Proto = 132
)

func protoOf(p *corev1.Protocol) (Proto, bool) {
	if p == nil {
		return TCP, true
	}
	switch *p {
	case corev1.ProtocolTCP, "":
		return TCP, true
	case corev1.ProtocolUDP:
		return UDP, true
	case corev1.ProtocolSCTP:
		return SCTP, true
	}
	return 0, false
}

// NamedPort is a container port with a name.
type NamedPort struct {
	Name  string
	Proto Proto
	Port  uint16
}

// Pod is the compact copy of a pod the engine keeps.
type Pod struct {
	Namespace, Name string
	Node            string
	IP              netip.Addr // invalid: no address yet
	Labels          map[string]string
	Ports           []NamedPort
	// Inactive: terminal phase, host network or being deleted with no
	// address; neither selected nor a peer.
	Inactive bool
}

// Key is namespace/name.
func (p *Pod) Key() string { return p.Namespace + "/" + p.Name }

// PodFrom compacts a pod. Its address is the first IPv4 address of
// status.podIPs, or before the kubelet reports one, of the
// kurma.dev/pod-networks annotation (so that a pod's rules are in place
// before its sandbox's CNI ADD returns).
func PodFrom(p *corev1.Pod) *Pod {
	c := &Pod{Namespace: p.Namespace, Name: p.Name, Node: p.Spec.NodeName, Labels: p.Labels,
		Inactive: p.Spec.HostNetwork || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed}
	for _, ip := range p.Status.PodIPs {
		if a, err := netip.ParseAddr(ip.IP); err == nil && a.Is4() {
			c.IP = a
			break
		}
	}
	if !c.IP.IsValid() && !c.Inactive {
		if s, ok := p.Annotations[podnet.Annotation]; ok {
			if ns, err := podnet.Decode(s); err == nil {
				if n, ok := ns.Default(); ok {
					for _, pfx := range n.Prefixes() {
						if pfx.Addr().Is4() {
							c.IP = pfx.Addr()
							break
						}
					}
				}
			}
		}
	}
	for _, ctr := range p.Spec.Containers {
		for _, cp := range ctr.Ports {
			if cp.Name == "" || cp.ContainerPort <= 0 || cp.ContainerPort > math.MaxUint16 {
				continue
			}
			pr, ok := protoOf(&cp.Protocol)
			if !ok {
				continue
			}
			c.Ports = append(c.Ports, NamedPort{Name: cp.Name, Proto: pr, Port: uint16(cp.ContainerPort)})
		}
	}
	return c
}

// active reports whether p may be selected or be a peer.
func (p *Pod) active() bool { return p != nil && !p.Inactive && p.IP.Is4() }

// namedPort resolves a port name on p.
func (p *Pod) namedPort(name string, pr Proto) (uint16, bool) {
	for _, np := range p.Ports {
		if np.Name == name && np.Proto == pr {
			return np.Port, true
		}
	}
	return 0, false
}

// The rule types are policyrule's, shared with the agent's datapath so
// that a change's allow lists reach it without a copy.
type (
	Addr4 = policyrule.Addr4
	Allow = policyrule.Allow
	Dir   = policyrule.Dir
)

// A4 is the Addr4 of an IPv4 address (0 for any other).
func A4(a netip.Addr) Addr4 { return policyrule.A4(a) }

const (
	anyLo Addr4 = 0
	anyHi Addr4 = math.MaxUint32
)

// Rules are a local pod's computed rules: a policyrule.Pod (Path
// converts a *Rules to a *policyrule.Pod without copying).
type Rules policyrule.Pod

// PathRules is rules as the datapath's type: the same values, only the
// map is new (a nil *Rules stays nil). The lists are shared, never
// copied: the engine never modifies a list it has handed out (a change
// builds a new one), and the path must not modify them either.
func PathRules(rules map[string]*Rules) map[string]*policyrule.Pod {
	out := make(map[string]*policyrule.Pod, len(rules))
	for k, r := range rules {
		out[k] = (*policyrule.Pod)(r)
	}
	return out
}

// Equal reports whether r and o program the same state.
func (r *Rules) Equal(o *Rules) bool {
	if r == nil || o == nil {
		return r == o
	}
	return r.IP == o.IP && r.Ingress.Equal(o.Ingress) && r.Egress.Equal(o.Egress)
}

// policy is a compiled NetworkPolicy.
type policy struct {
	namespace, name  string
	selector         labels.Selector
	ingress, egress  bool // policy types
	inRules, egRules []rule
	// peerSig is equal for two policies exactly when namesPeer answers
	// the same for them (namespace, types, peers, named ports): a pod's
	// change checks each distinct signature once.
	peerSig string
	// shape is equal for two policies of one signature exactly when
	// their rules also have the same ports: for a given local pod and
	// peer they contribute the same allows (see peersChanged).
	shape string
}

func (p *policy) signature() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s|%v|%v", p.namespace, p.ingress, p.egress)
	for d, rs := range [][]rule{p.inRules, p.egRules} {
		for _, r := range rs {
			named := false
			for _, pt := range r.ports {
				named = named || pt.name != ""
			}
			fmt.Fprintf(&b, "|%d:%v:%v", d, r.allPeers, named)
			for _, pe := range r.peers {
				fmt.Fprintf(&b, ";%s/%s/%v/%v", selString(pe.pods), selString(pe.nsSel), pe.block, pe.ranges)
			}
		}
	}
	return b.String()
}

type rule struct {
	allPeers bool // no peers listed
	peers    []peer
	allPorts bool // no ports listed
	ports    []port
}

type peer struct {
	pods labels.Selector // nil: any pod (only with nsSel)
	// nsSel nil: the policy's namespace; else namespaces it matches.
	nsSel  labels.Selector
	ranges [][2]Addr4 // ipBlock, when set (pods and nsSel nil)
	block  bool
}

type port struct {
	proto  Proto
	all    bool   // no port: every port of proto
	name   string // named port
	lo, hi uint16
}

// compile turns a NetworkPolicy into a policy; what the API server would
// reject (bad selector, CIDR, port) is an error.
func compile(np *networkingv1.NetworkPolicy, sc *selCache) (*policy, error) {
	p := &policy{namespace: np.Namespace, name: np.Name}
	var err error
	if p.selector, err = sc.selector(&np.Spec.PodSelector); err != nil {
		return nil, fmt.Errorf("podSelector: %w", err)
	}
	if len(np.Spec.PolicyTypes) == 0 {
		p.ingress, p.egress = true, len(np.Spec.Egress) > 0
	}
	for _, t := range np.Spec.PolicyTypes {
		switch t {
		case networkingv1.PolicyTypeIngress:
			p.ingress = true
		case networkingv1.PolicyTypeEgress:
			p.egress = true
		default:
			return nil, fmt.Errorf("policyTypes: unknown %q", t)
		}
	}
	for i, r := range np.Spec.Ingress {
		cr, err := compileRule(r.From, r.Ports, sc)
		if err != nil {
			return nil, fmt.Errorf("ingress[%d]: %w", i, err)
		}
		p.inRules = append(p.inRules, cr)
	}
	for i, r := range np.Spec.Egress {
		cr, err := compileRule(r.To, r.Ports, sc)
		if err != nil {
			return nil, fmt.Errorf("egress[%d]: %w", i, err)
		}
		p.egRules = append(p.egRules, cr)
	}
	p.peerSig = p.signature()
	p.shape = p.portsShape()
	return p, nil
}

// portsShape encodes the ports of p's rules, in order.
func (p *policy) portsShape() string {
	var b strings.Builder
	for d, rs := range [][]rule{p.inRules, p.egRules} {
		for _, r := range rs {
			fmt.Fprintf(&b, "|%d:%v", d, r.allPorts)
			for _, pt := range r.ports {
				fmt.Fprintf(&b, ";%d/%v/%s/%d/%d", pt.proto, pt.all, pt.name, pt.lo, pt.hi)
			}
		}
	}
	return b.String()
}

func compileRule(peers []networkingv1.NetworkPolicyPeer, ports []networkingv1.NetworkPolicyPort, sc *selCache) (rule, error) {
	r := rule{allPeers: len(peers) == 0, allPorts: len(ports) == 0}
	for i, pp := range peers {
		var cp peer
		var err error
		switch {
		case pp.IPBlock != nil:
			if pp.PodSelector != nil || pp.NamespaceSelector != nil {
				return r, fmt.Errorf("peer %d: ipBlock with a selector", i)
			}
			cp.block = true
			rs, err := BlockRanges(pp.IPBlock.CIDR, pp.IPBlock.Except)
			if err != nil {
				return r, fmt.Errorf("peer %d: %w", i, err)
			}
			for _, rg := range rs {
				cp.ranges = append(cp.ranges, [2]Addr4{A4(rg[0]), A4(rg[1])})
			}
		case pp.PodSelector == nil && pp.NamespaceSelector == nil:
			return r, fmt.Errorf("peer %d: empty", i)
		default:
			if pp.PodSelector != nil {
				if cp.pods, err = sc.selector(pp.PodSelector); err != nil {
					return r, fmt.Errorf("peer %d: podSelector: %w", i, err)
				}
			}
			if pp.NamespaceSelector != nil {
				if cp.nsSel, err = sc.selector(pp.NamespaceSelector); err != nil {
					return r, fmt.Errorf("peer %d: namespaceSelector: %w", i, err)
				}
			}
		}
		r.peers = append(r.peers, cp)
	}
	for i, pp := range ports {
		pr, ok := protoOf(pp.Protocol)
		if !ok {
			return r, fmt.Errorf("port %d: unknown protocol %q", i, *pp.Protocol)
		}
		cp := port{proto: pr}
		switch {
		case pp.Port == nil:
			cp.all, cp.lo, cp.hi = true, 0, math.MaxUint16
		case pp.Port.Type == intstr.String:
			if pp.EndPort != nil {
				return r, fmt.Errorf("port %d: endPort with a named port", i)
			}
			cp.name = pp.Port.StrVal
		default:
			v := pp.Port.IntVal
			if v < 1 || v > math.MaxUint16 {
				return r, fmt.Errorf("port %d: %d out of range", i, v)
			}
			cp.lo, cp.hi = uint16(v), uint16(v)
			if pp.EndPort != nil {
				e := *pp.EndPort
				if e < v || e > math.MaxUint16 {
					return r, fmt.Errorf("port %d: endPort %d below port %d or out of range", i, e, v)
				}
				cp.hi = uint16(e)
			}
		}
		r.ports = append(r.ports, cp)
	}
	return r, nil
}

// maxExcept bounds the excepts of one ipBlock (outside input).
const maxExcept = 1024

// BlockRanges is an IPv4 CIDR minus its excepts as sorted, disjoint,
// inclusive address ranges. Excepts must lie inside the CIDR, as the API
// server checks. IPv6 blocks yield no range (the datapath is IPv4).
func BlockRanges(cidr string, except []string) ([][2]netip.Addr, error) {
	pfx, err := netip.ParsePrefix(cidr)
	if err != nil {
		return nil, fmt.Errorf("ipBlock cidr %q: %w", cidr, err)
	}
	if len(except) > maxExcept {
		return nil, fmt.Errorf("ipBlock %q: %d excepts, at most %d", cidr, len(except), maxExcept)
	}
	pfx = pfx.Masked()
	var holes [][2]uint32
	for _, e := range except {
		ep, err := netip.ParsePrefix(e)
		if err != nil {
			return nil, fmt.Errorf("ipBlock except %q: %w", e, err)
		}
		ep = ep.Masked()
		if ep.Addr().Is4() != pfx.Addr().Is4() || ep.Bits() < pfx.Bits() || !pfx.Contains(ep.Addr()) {
			return nil, fmt.Errorf("ipBlock except %q: not inside %q", e, cidr)
		}
		if ep.Addr().Is4() {
			lo, hi := prefixBounds(ep)
			holes = append(holes, [2]uint32{lo, hi})
		}
	}
	if !pfx.Addr().Is4() {
		return nil, nil
	}
	lo, hi := prefixBounds(pfx)
	slices.SortFunc(holes, func(a, b [2]uint32) int {
		if a[0] != b[0] {
			if a[0] < b[0] {
				return -1
			}
			return 1
		}
		return 0
	})
	var out [][2]netip.Addr
	next := uint64(lo) // first address not yet emitted or excluded
	for _, h := range holes {
		if uint64(h[0]) > next {
			out = append(out, [2]netip.Addr{addr4(uint32(next)), addr4(h[0] - 1)})
		}
		if uint64(h[1])+1 > next {
			next = uint64(h[1]) + 1
		}
	}
	if next <= uint64(hi) {
		out = append(out, [2]netip.Addr{addr4(uint32(next)), addr4(hi)})
	}
	return out, nil
}

func prefixBounds(p netip.Prefix) (uint32, uint32) {
	b := p.Addr().As4()
	lo := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	size := uint64(1) << (32 - p.Bits())
	return lo, uint32(uint64(lo) + size - 1)
}

func addr4(v uint32) netip.Addr {
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

func compileSelector(np *networkingv1.NetworkPolicy) (labels.Selector, error) {
	return metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
}

// selCache keeps the selectors compiled from label selectors: policies
// mostly repeat a few selectors, and compiling one (validating every key
// and value) costs more than looking it up. It forgets everything when
// it grows past maxSelCache. A nil selCache compiles every time.
type selCache struct {
	m   map[string]labels.Selector
	buf []byte
}

const maxSelCache = 4096

// selector compiles ls (nil: every label set, as LabelSelectorAsSelector
// says; the callers pass nil never).
func (c *selCache) selector(ls *metav1.LabelSelector) (labels.Selector, error) {
	if c == nil || ls == nil {
		return metav1.LabelSelectorAsSelector(ls)
	}
	// Every string length-prefixed, so that no two selectors share a key.
	b := c.buf[:0]
	str := func(v string) {
		b = binary.AppendUvarint(b, uint64(len(v)))
		b = append(b, v...)
	}
	b = binary.AppendUvarint(b, uint64(len(ls.MatchLabels)))
	for _, k := range slices.Sorted(maps.Keys(ls.MatchLabels)) {
		str(k)
		str(ls.MatchLabels[k])
	}
	for _, r := range ls.MatchExpressions {
		str(r.Key)
		str(string(r.Operator))
		b = binary.AppendUvarint(b, uint64(len(r.Values)))
		for _, v := range r.Values {
			str(v)
		}
	}
	c.buf = b
	if s, ok := c.m[string(b)]; ok {
		return s, nil
	}
	s, err := metav1.LabelSelectorAsSelector(ls)
	if err != nil {
		return nil, err
	}
	if c.m == nil || len(c.m) >= maxSelCache {
		c.m = map[string]labels.Selector{}
	}
	c.m[string(b)] = s
	return s, nil
}
