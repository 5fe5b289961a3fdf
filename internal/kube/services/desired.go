package services

import (
	"cmp"
	"crypto/sha256"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"

	capi "kurma.dev/kurma/pkg/controllerapi"
)

// LBPrefix starts the id of every load balancer and floating IP this
// package makes; the rest is the Service's UID.
const LBPrefix = "svc-"

// Description marks load balancers and floating IPs made for Services.
const Description = "kurma.dev/k8s-services"

// LBID is the id of the load balancer (and of the floating IP) of the
// Service with this UID.
func LBID(uid types.UID) string { return LBPrefix + string(uid) }

// MaxMembers is the controller's limit of members per load balancer.
const MaxMembers = 5000

// DefaultAffinityTimeout is Kubernetes' default ClientIP affinity timeout
// (seconds), used when sessionAffinityConfig leaves it unset.
const DefaultAffinityTimeout = 10800

// wanted is the load balancer a Service should have, in the canonical
// form compared against what the controller holds.
type wanted struct {
	ID, Name, VIP string
	Listeners     []capi.Listener
	Members       []capi.Member
	Persistence   *capi.SessionPersistence
	// Warnings say what could not be represented (logged, not fatal).
	Warnings []string
}

// clusterIP returns the Service's clusterIP that lies in svcCIDR, or an
// invalid address when it has none (headless, ExternalName, another
// family, outside the range).
func clusterIP(svc *corev1.Service, svcCIDR netip.Prefix) netip.Addr {
	if svc == nil || svc.Spec.Type == corev1.ServiceTypeExternalName {
		return netip.Addr{}
	}
	ips := svc.Spec.ClusterIPs
	if len(ips) == 0 && svc.Spec.ClusterIP != "" {
		ips = []string{svc.Spec.ClusterIP}
	}
	for _, s := range ips {
		if s == corev1.ClusterIPNone {
			return netip.Addr{}
		}
		a, err := netip.ParseAddr(s)
		if err == nil && svcCIDR.Contains(a) {
			return a
		}
	}
	return netip.Addr{}
}

func addressType(a netip.Addr) discoveryv1.AddressType {
	if a.Is4() {
		return discoveryv1.AddressTypeIPv4
	}
	return discoveryv1.AddressTypeIPv6
}

func protocol(p corev1.Protocol) string {
	if p == "" {
		return capi.ProtocolTCP
	}
	return strings.ToUpper(string(p))
}

func strp(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// ready reports whether kube-proxy would send new connections to an
// endpoint: ready unset counts as ready (the API's rule).
func ready(e discoveryv1.Endpoint) bool {
	return e.Conditions.Ready == nil || *e.Conditions.Ready
}

// desired computes the load balancer of svc from its EndpointSlices. It
// returns nil when the Service should have none. vpc is the set of
// addresses members may have (the controller refuses others, e.g. the
// node addresses of hostNetwork pods).
func desired(svc *corev1.Service, sls []*discoveryv1.EndpointSlice, svcCIDR, vpc netip.Prefix) *wanted {
	vip := clusterIP(svc, svcCIDR)
	if !vip.IsValid() {
		return nil
	}
	w := &wanted{ID: LBID(svc.UID), Name: svc.Namespace + "/" + svc.Name, VIP: vip.String()}
	at := addressType(vip)
	var own []*discoveryv1.EndpointSlice
	for _, s := range sls {
		if s.AddressType == at {
			own = append(own, s)
		}
	}
	// Stable order: the member list must not change with informer order.
	slices.SortFunc(own, func(a, b *discoveryv1.EndpointSlice) int { return cmp.Compare(a.Name, b.Name) })

	// Resolve each Service port's target through the slices' ports (the
	// slice port of the same name and protocol carries the number).
	perMember := false
	var sliceTarget []map[string]int // per slice: "proto/name" -> number
	for _, s := range own {
		m := map[string]int{}
		for _, p := range s.Ports {
			if p.Port != nil && *p.Port >= 1 && *p.Port <= 65535 {
				m[protocol(ptrProto(p.Protocol))+"/"+strp(p.Name)] = int(*p.Port)
			}
		}
		sliceTarget = append(sliceTarget, m)
	}
	seen := map[string]bool{}
	for _, sp := range svc.Spec.Ports {
		proto := protocol(sp.Protocol)
		if seen[proto+"/"+itoa(int(sp.Port))] {
			continue // the API server refuses this; be safe anyway
		}
		seen[proto+"/"+itoa(int(sp.Port))] = true
		if sp.Port < 1 || sp.Port > 65535 {
			w.Warnings = append(w.Warnings, "port "+itoa(int(sp.Port))+" out of range; skipped")
			continue
		}
		l := capi.Listener{Protocol: proto, Port: int(sp.Port), TargetPort: int(sp.Port)}
		if sp.TargetPort.IntValue() > 0 && sp.TargetPort.IntValue() <= 65535 {
			l.TargetPort = sp.TargetPort.IntValue()
		}
		found := map[int]bool{}
		first := 0
		for i, s := range own {
			if n, ok := sliceTarget[i][proto+"/"+sp.Name]; ok && hasReady(s) {
				if first == 0 {
					first = n
				}
				found[n] = true
			}
		}
		if first != 0 {
			l.TargetPort = first
		}
		if len(found) > 1 {
			if len(svc.Spec.Ports) == 1 {
				perMember = true
			} else {
				w.Warnings = append(w.Warnings, "port "+sp.Name+" resolves to several numbers across slices; using "+itoa(first))
			}
		}
		w.Listeners = append(w.Listeners, l)
	}
	slices.SortFunc(w.Listeners, cmpListener)

	mseen := map[capi.Member]bool{}
	for i, s := range own {
		port := 0
		if perMember {
			sp := svc.Spec.Ports[0]
			port = sliceTarget[i][protocol(sp.Protocol)+"/"+sp.Name]
		}
		for _, e := range s.Endpoints {
			if !ready(e) || len(e.Addresses) == 0 {
				continue
			}
			a, err := netip.ParseAddr(e.Addresses[0])
			if err != nil || !vpc.Contains(a) {
				continue
			}
			m := capi.Member{Address: a.String(), Port: port}
			if mseen[m] {
				continue
			}
			mseen[m] = true
			if r := e.TargetRef; r != nil && r.Kind == "Pod" && r.UID != "" {
				m.PortID = "pod-" + string(r.UID)
			}
			w.Members = append(w.Members, m)
		}
	}
	slices.SortFunc(w.Members, cmpMember)
	if len(w.Members) > MaxMembers {
		w.Warnings = append(w.Warnings, "more than "+itoa(MaxMembers)+" ready endpoints; the rest are left out")
		w.Members = w.Members[:MaxMembers]
	}
	if svc.Spec.SessionAffinity == corev1.ServiceAffinityClientIP {
		t := DefaultAffinityTimeout
		if c := svc.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
			t = int(*c.ClientIP.TimeoutSeconds)
		}
		w.Persistence = &capi.SessionPersistence{Type: capi.PersistenceSourceIP, Timeout: t}
	}
	return w
}

func ptrProto(p *corev1.Protocol) corev1.Protocol {
	if p == nil {
		return corev1.ProtocolTCP
	}
	return *p
}

func hasReady(s *discoveryv1.EndpointSlice) bool {
	return slices.ContainsFunc(s.Endpoints, ready)
}

func cmpListener(a, b capi.Listener) int {
	return cmp.Or(cmp.Compare(a.Protocol, b.Protocol), cmp.Compare(a.Port, b.Port))
}

func cmpMember(a, b capi.Member) int {
	pa, _ := netip.ParseAddr(a.Address)
	pb, _ := netip.ParseAddr(b.Address)
	return cmp.Or(pa.Compare(pb), cmp.Compare(a.Port, b.Port))
}

// normalize puts a load balancer the controller returned in the canonical
// form of wanted: sorted listeners with explicit target ports, sorted
// members.
func normalize(lb *capi.LoadBalancer) (ls []capi.Listener, ms []capi.Member) {
	for _, l := range lb.Listeners {
		l.Protocol = strings.ToUpper(l.Protocol)
		if l.TargetPort == 0 {
			l.TargetPort = l.Port
		}
		ls = append(ls, l)
	}
	slices.SortFunc(ls, cmpListener)
	ms = slices.Clone(lb.Members)
	slices.SortFunc(ms, cmpMember)
	return ls, ms
}

// sameMembers compares member sets ignoring PortID when one side lacks it
// (informational only).
func sameMembers(a, b []capi.Member) bool {
	return slices.EqualFunc(a, b, func(x, y capi.Member) bool {
		return x.Address == y.Address && x.Port == y.Port && x.PortID == y.PortID
	})
}

func itoa(n int) string { return strconv.Itoa(n) }

// lbPrint is what the reconciler keeps of a load balancer the controller
// holds: its VIP and digests of the rest in canonical form, enough to
// tell whether it equals a wanted one and which request fixes it (a
// member replacement when only the members differ). Keeping this instead
// of the controller's object is a few dozen bytes per Service.
type lbPrint struct {
	vip     netip.Addr
	spec    [16]byte // name, listeners and session persistence
	members [16]byte
}

// lbEntry is a Service's load balancer as the reconciler knows it: its
// id is LBID(uid).
type lbEntry struct {
	uid types.UID
	lbPrint
}

// printOf is the print of a load balancer the controller returned.
func printOf(lb *capi.LoadBalancer) lbPrint {
	ls, ms := normalize(lb)
	vip, _ := netip.ParseAddr(lb.VIPAddress)
	return lbPrint{vip: vip, spec: specDigest(lb.Name, ls, lb.SessionPersistence), members: memberDigest(ms)}
}

// print is the print of the load balancer w describes.
func (w *wanted) print() lbPrint {
	vip, _ := netip.ParseAddr(w.VIP)
	return lbPrint{vip: vip, spec: specDigest(w.Name, w.Listeners, w.Persistence), members: memberDigest(w.Members)}
}

// specDigest digests a name, normalized listeners and a session
// persistence (timeout 0 meaning the default, the type in any case, as
// samePersistence compares them).
func specDigest(name string, ls []capi.Listener, p *capi.SessionPersistence) [16]byte {
	h := sha256.New()
	b := append([]byte(name), 0)
	for _, l := range ls {
		b = append(b, l.Protocol...)
		b = fmt.Appendf(b, "/%d/%d;", l.Port, l.TargetPort)
	}
	b = append(b, 0)
	if p != nil {
		t := p.Timeout
		if t == 0 {
			t = DefaultAffinityTimeout
		}
		b = fmt.Appendf(b, "%s/%d", strings.ToUpper(p.Type), t)
	}
	h.Write(b)
	var d [16]byte
	copy(d[:], h.Sum(nil))
	return d
}

// memberDigest digests sorted members (address, port and port id, as
// sameMembers compares them).
func memberDigest(ms []capi.Member) [16]byte {
	h := sha256.New()
	var b []byte
	for _, m := range ms {
		b = fmt.Appendf(b[:0], "%s/%d/%s;", m.Address, m.Port, m.PortID)
		h.Write(b)
	}
	var d [16]byte
	copy(d[:], h.Sum(nil))
	return d
}
