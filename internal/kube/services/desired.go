package services

import (
	"cmp"
	"crypto/sha256"
	"encoding/json"
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
const MaxMembers = capi.MaxMembers

// DefaultAffinityTimeout is Kubernetes' default ClientIP affinity timeout
// (seconds), used when sessionAffinityConfig leaves it unset.
const DefaultAffinityTimeout = capi.DefaultAffinityTimeout

// wanted is the load balancer a Service should have, in the canonical
// form of the controller's contract (controllerapi's Normalize
// functions), so that it compares equal to what the controller returns.
type wanted struct {
	ID, Name, VIP string
	Listeners     []capi.Listener
	Members       []capi.Member
	Persistence   *capi.SessionPersistence
	Policy        capi.Policy
	// Warnings say what could not be represented (logged, not fatal).
	Warnings []string
}

// Labels that hand a Service to another proxy, or mark it headless: as
// kube-proxy, the watcher serves no Service that carries either, whatever
// its value (the upstream specs "should implement
// service.kubernetes.io/service-proxy-name" and ".../headless").
const (
	LabelServiceProxyName = "service.kubernetes.io/service-proxy-name"
	LabelHeadless         = "service.kubernetes.io/headless"
)

// clusterIP returns the Service's clusterIP that lies in svcCIDR, or an
// invalid address when it has none (headless, ExternalName, another
// family, outside the range) or is not ours to serve (LabelServiceProxyName,
// LabelHeadless).
func clusterIP(svc *corev1.Service, svcCIDR addrRange) netip.Addr {
	if svc == nil || svc.Spec.Type == corev1.ServiceTypeExternalName {
		return netip.Addr{}
	}
	if _, ok := svc.Labels[LabelServiceProxyName]; ok {
		return netip.Addr{}
	}
	if _, ok := svc.Labels[LabelHeadless]; ok {
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

// backup reports whether an endpoint that is not ready may still take
// connections when no ready one is left: serving and terminating (as
// kube-proxy falls back to them).
func backup(e discoveryv1.Endpoint) bool {
	return e.Conditions.Serving != nil && *e.Conditions.Serving && e.Conditions.Terminating != nil && *e.Conditions.Terminating
}

// hostOf maps a node name to the host id its agent binds ports to.
type hostOf func(node string) string

// desired computes the load balancer of svc from its EndpointSlices. It
// returns nil when the Service should have none. vpc is the VPC's range:
// members outside it (node addresses of the API servers and of
// hostNetwork pods) are marked external. hosts maps an endpoint's node
// to its host id (nil: the node name).
func desired(svc *corev1.Service, sls []*discoveryv1.EndpointSlice, svcCIDR addrRange, vpc netip.Prefix, hosts hostOf) *wanted {
	vip := clusterIP(svc, svcCIDR)
	if !vip.IsValid() {
		return nil
	}
	if hosts == nil {
		hosts = func(n string) string { return n }
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

	nodePorts := svc.Spec.Type == corev1.ServiceTypeNodePort || svc.Spec.Type == corev1.ServiceTypeLoadBalancer
	// Each Service port is a listener, whose members are the endpoints of
	// the slices that carry a port of its name and protocol, at that
	// slice's number (upstream selects endpoints per Service port).
	type memberKey struct {
		addr netip.Addr
		port int
	}
	members := map[memberKey]*capi.Member{}
	seen := map[string]bool{}
	for _, sp := range svc.Spec.Ports {
		proto := protocol(sp.Protocol)
		if sp.Port < 1 || sp.Port > 65535 {
			w.Warnings = append(w.Warnings, "port "+itoa(int(sp.Port))+" out of range; skipped")
			continue
		}
		l := capi.Listener{Protocol: proto, Port: int(sp.Port), TargetPort: int(sp.Port)}
		if seen[l.Key()] {
			continue // the API server refuses this; be safe anyway
		}
		seen[l.Key()] = true
		if t := sp.TargetPort.IntValue(); t > 0 && t <= 65535 {
			l.TargetPort = t
		}
		if nodePorts && sp.NodePort > 0 && sp.NodePort <= 65535 {
			l.NodePort = int(sp.NodePort)
		}
		first := true
		for _, s := range own {
			n := portIn(s, proto, sp.Name)
			if n == 0 {
				continue
			}
			if first && hasReady(s) {
				l.TargetPort, first = n, false
			}
			for _, e := range s.Endpoints {
				ok, bk := ready(e), backup(e)
				if !ok && !bk || len(e.Addresses) == 0 {
					continue
				}
				a, err := netip.ParseAddr(e.Addresses[0])
				if err != nil || a.Is4() != vip.Is4() {
					continue
				}
				a = a.Unmap()
				k := memberKey{a, n}
				m := members[k]
				if m == nil {
					m = &capi.Member{Address: a.String(), Port: n, Backup: !ok, External: !vpc.Contains(a)}
					if e.NodeName != nil && *e.NodeName != "" {
						m.HostID = hosts(*e.NodeName)
					}
					if r := e.TargetRef; r != nil && r.Kind == "Pod" && r.UID != "" {
						m.PortID = "pod-" + string(r.UID)
					}
					members[k] = m
				}
				m.Backup = m.Backup && !ok
				if !slices.Contains(m.Listeners, l.Key()) {
					m.Listeners = append(m.Listeners, l.Key())
				}
			}
		}
		w.Listeners = append(w.Listeners, l)
	}
	for _, m := range members {
		if len(m.Listeners) == len(w.Listeners) {
			m.Listeners = nil // serves every listener
		}
		w.Members = append(w.Members, *m)
	}
	slices.SortFunc(w.Members, capi.CompareMembers)
	if len(w.Members) > MaxMembers {
		w.Warnings = append(w.Warnings, "more than "+itoa(MaxMembers)+" endpoints; the rest are left out")
		w.Members = w.Members[:MaxMembers]
	}
	if svc.Spec.SessionAffinity == corev1.ServiceAffinityClientIP {
		t := DefaultAffinityTimeout
		if c := svc.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
			t = int(*c.ClientIP.TimeoutSeconds)
		}
		w.Persistence = &capi.SessionPersistence{Type: capi.PersistenceSourceIP, Timeout: t}
	}
	w.Policy = capi.Policy{HostAccess: true,
		InternalLocal: svc.Spec.InternalTrafficPolicy != nil && *svc.Spec.InternalTrafficPolicy == corev1.ServiceInternalTrafficPolicyLocal,
		ExternalLocal: nodePorts && svc.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal}
	if w.Policy.ExternalLocal && svc.Spec.Type == corev1.ServiceTypeLoadBalancer && svc.Spec.HealthCheckNodePort > 0 {
		w.Policy.HealthCheckNodePort = int(svc.Spec.HealthCheckNodePort)
	}
	for _, s := range svc.Spec.ExternalIPs {
		if a, err := netip.ParseAddr(s); err == nil && a.Is4() == vip.Is4() {
			w.Policy.ExternalAddresses = append(w.Policy.ExternalAddresses, s)
		} else {
			w.Warnings = append(w.Warnings, "externalIP "+s+" is not an address of the Service's family; skipped")
		}
	}
	// The controller's canonical form (it refuses what breaks the
	// contract: the sync then says why).
	var err error
	if w.Listeners, err = capi.NormalizeListeners(w.Listeners); err == nil {
		if w.Members, err = capi.NormalizeMembers(w.Members); err == nil {
			err = capi.NormalizePolicy(&w.Policy)
		}
	}
	if err != nil {
		w.Warnings = append(w.Warnings, "the load balancer is refused: "+err.Error())
	}
	return w
}

// portIn is the number the slice gives the Service port named name
// (protocol proto), 0 when it has none.
func portIn(s *discoveryv1.EndpointSlice, proto, name string) int {
	for _, p := range s.Ports {
		if p.Port != nil && *p.Port >= 1 && *p.Port <= 65535 && protocol(ptrProto(p.Protocol)) == proto && strp(p.Name) == name {
			return int(*p.Port)
		}
	}
	return 0
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

func itoa(n int) string { return strconv.Itoa(n) }

// lbPrint is what the reconciler keeps of a load balancer the controller
// holds: its VIP and digests of the rest in canonical form, enough to
// tell whether it equals a wanted one and which request fixes it (a
// member replacement when only the members differ). Keeping this instead
// of the controller's object is a few dozen bytes per Service.
type lbPrint struct {
	vip     netip.Addr
	spec    [16]byte // name, listeners, session persistence and policy
	members [16]byte
}

// lbEntry is a Service's load balancer as the reconciler knows it: its
// id is LBID(uid).
type lbEntry struct {
	uid types.UID
	lbPrint
}

// printOf is the print of a load balancer the controller returned (in
// canonical form already: the controller stores it so).
func printOf(lb *capi.LoadBalancer) lbPrint {
	vip, _ := netip.ParseAddr(lb.VIPAddress)
	return lbPrint{vip: vip, spec: specDigest(lb.Name, lb.Listeners, lb.SessionPersistence, lb.Policy),
		members: digest(lb.Members)}
}

// print is the print of the load balancer w describes.
func (w *wanted) print() lbPrint {
	vip, _ := netip.ParseAddr(w.VIP)
	return lbPrint{vip: vip, spec: specDigest(w.Name, w.Listeners, w.Persistence, w.Policy), members: digest(w.Members)}
}

// specDigest digests the name, listeners, session persistence and
// policy of a load balancer in canonical form.
func specDigest(name string, ls []capi.Listener, p *capi.SessionPersistence, pol capi.Policy) [16]byte {
	return digest(struct {
		Name        string
		Listeners   []capi.Listener
		Persistence *capi.SessionPersistence
		Policy      capi.Policy
	}{name, ls, p, pol})
}

// digest hashes v's JSON: canonical forms have one encoding.
func digest(v any) [16]byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // plain structs of strings, numbers and bools
	}
	h := sha256.Sum256(b)
	return [16]byte(h[:16])
}
