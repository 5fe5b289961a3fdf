package services

import (
	"net/netip"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	capi "kurma.dev/kurma/pkg/controllerapi"
)

var (
	testSvcCIDR = netip.MustParsePrefix("10.96.0.0/16")
	testVPC     = netip.MustParsePrefix("10.32.0.0/11")
)

func svcOf(ip string, ports ...corev1.ServicePort) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web", UID: "u1"},
		Spec:       corev1.ServiceSpec{ClusterIP: ip, ClusterIPs: []string{ip}, Ports: ports, Type: corev1.ServiceTypeClusterIP},
	}
}

func sp(name string, proto corev1.Protocol, port int32, target intstr.IntOrString) corev1.ServicePort {
	return corev1.ServicePort{Name: name, Protocol: proto, Port: port, TargetPort: target}
}

type ep struct {
	addr  string
	ready *bool
	// terminating: serving but terminating (a backup); node: its node.
	terminating bool
	node        string
}

func slice(name string, at discoveryv1.AddressType, ports map[string]int32, eps ...ep) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}, AddressType: at}
	for n, p := range ports {
		s.Ports = append(s.Ports, discoveryv1.EndpointPort{Name: new(n), Port: new(p), Protocol: new(corev1.ProtocolTCP)})
	}
	for _, e := range eps {
		de := discoveryv1.Endpoint{Addresses: []string{e.addr}, Conditions: discoveryv1.EndpointConditions{Ready: e.ready}}
		if e.terminating {
			de.Conditions = discoveryv1.EndpointConditions{Ready: new(false), Serving: new(true), Terminating: new(true)}
		}
		if e.node != "" {
			de.NodeName = new(e.node)
		}
		s.Endpoints = append(s.Endpoints, de)
	}
	return s
}

func mem(addr string, port int, listeners ...string) capi.Member {
	return capi.Member{Address: addr, Port: port, Listeners: listeners}
}

// hostAccess is the policy of every Service without traffic policies.
var hostAccess = capi.Policy{HostAccess: true}

func TestDesired(t *testing.T) {
	yes, no := new(true), new(false)
	affinity := svcOf("10.96.0.20", sp("", corev1.ProtocolTCP, 80, intstr.FromInt32(8080)))
	affinity.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
	affinity.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: new(int32(60))}}
	affinityDefault := svcOf("10.96.0.21", sp("", corev1.ProtocolTCP, 80, intstr.FromInt32(80)))
	affinityDefault.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
	external := svcOf("", sp("", corev1.ProtocolTCP, 80, intstr.FromInt32(80)))
	external.Spec.Type = corev1.ServiceTypeExternalName
	nodePort := svcOf("10.96.0.40", sp("", corev1.ProtocolTCP, 80, intstr.FromInt32(8080)))
	nodePort.Spec.Type = corev1.ServiceTypeNodePort
	nodePort.Spec.Ports[0].NodePort = 30080
	nodePort.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	nodePort.Spec.InternalTrafficPolicy = new(corev1.ServiceInternalTrafficPolicyLocal)
	nodePort.Spec.ExternalIPs = []string{"192.0.2.9", "192.0.2.1", "fd00::1"}
	lbLocal := svcOf("10.96.0.41", sp("", corev1.ProtocolUDP, 53, intstr.FromInt32(53)))
	lbLocal.Spec.Type = corev1.ServiceTypeLoadBalancer
	lbLocal.Spec.Ports[0].NodePort = 30053
	lbLocal.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	lbLocal.Spec.HealthCheckNodePort = 31000
	clusterOnly := svcOf("10.96.0.42", sp("", corev1.ProtocolTCP, 80, intstr.FromInt32(80)))
	clusterOnly.Spec.Ports[0].NodePort = 30099 // not a NodePort Service: ignored
	clusterOnly.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	otherProxy := svcOf("10.96.0.43", sp("", corev1.ProtocolTCP, 80, intstr.FromInt32(80)))
	otherProxy.Labels = map[string]string{LabelServiceProxyName: "foo-bar"}
	labelledHeadless := svcOf("10.96.0.44", sp("", corev1.ProtocolTCP, 80, intstr.FromInt32(80)))
	labelledHeadless.Labels = map[string]string{LabelHeadless: ""}

	tests := []struct {
		name   string
		svc    *corev1.Service
		slices []*discoveryv1.EndpointSlice
		want   *wanted // Warnings compared by count only
		warns  int
	}{
		{name: "headless", svc: svcOf("None", sp("", "", 80, intstr.FromInt32(80)))},
		{name: "external name", svc: external},
		{name: "another proxy's (service-proxy-name label)", svc: otherProxy},
		{name: "headless label", svc: labelledHeadless},
		{name: "outside the service range", svc: svcOf("10.97.0.1", sp("", "", 80, intstr.FromInt32(80)))},
		{
			name: "no slices: numeric target, no members",
			svc:  svcOf("10.96.0.10", sp("http", "", 80, intstr.FromInt32(8080)), sp("dns", corev1.ProtocolUDP, 53, intstr.FromString("dns"))),
			want: &wanted{ID: "svc-u1", Name: "ns/web", VIP: "10.96.0.10", Listeners: []capi.Listener{
				{Protocol: "TCP", Port: 80, TargetPort: 8080}, {Protocol: "UDP", Port: 53, TargetPort: 53}}, Policy: hostAccess},
		},
		{
			name: "named target resolved, ready endpoints, other family dropped, outside the VPC external, duplicates once",
			svc:  svcOf("10.96.0.11", sp("http", corev1.ProtocolTCP, 80, intstr.FromString("web"))),
			slices: []*discoveryv1.EndpointSlice{
				slice("b", discoveryv1.AddressTypeIPv4, map[string]int32{"http": 9090},
					ep{addr: "10.32.0.7"}, ep{addr: "10.32.0.5", ready: yes}, ep{addr: "10.32.0.6", ready: no},
					ep{addr: "192.168.1.1", ready: yes, node: "n1"}),
				slice("a", discoveryv1.AddressTypeIPv4, map[string]int32{"http": 9090}, ep{addr: "10.32.0.5", ready: yes}),
				slice("c", discoveryv1.AddressTypeIPv6, map[string]int32{"http": 1111}, ep{addr: "fd00::1", ready: yes}),
			},
			want: &wanted{ID: "svc-u1", Name: "ns/web", VIP: "10.96.0.11",
				Listeners: []capi.Listener{{Protocol: "TCP", Port: 80, TargetPort: 9090}},
				Members: []capi.Member{mem("10.32.0.5", 9090), mem("10.32.0.7", 9090),
					{Address: "192.168.1.1", Port: 9090, External: true, HostID: "host-of-n1"}},
				Policy: hostAccess},
		},
		{
			name: "one port resolving differently per slice: each member at its number",
			svc:  svcOf("10.96.0.12", sp("", corev1.ProtocolTCP, 80, intstr.FromString("web"))),
			slices: []*discoveryv1.EndpointSlice{
				slice("a", discoveryv1.AddressTypeIPv4, map[string]int32{"": 8080}, ep{addr: "10.32.0.5", ready: yes}),
				slice("b", discoveryv1.AddressTypeIPv4, map[string]int32{"": 8081}, ep{addr: "10.32.0.6", ready: yes}),
			},
			want: &wanted{ID: "svc-u1", Name: "ns/web", VIP: "10.96.0.12",
				Listeners: []capi.Listener{{Protocol: "TCP", Port: 80, TargetPort: 8080}},
				Members:   []capi.Member{mem("10.32.0.5", 8080), mem("10.32.0.6", 8081)}, Policy: hostAccess},
		},
		{
			name: "several ports resolving differently: members per port",
			svc: svcOf("10.96.0.13", sp("a", corev1.ProtocolTCP, 80, intstr.FromString("web")),
				sp("b", corev1.ProtocolTCP, 81, intstr.FromInt32(81))),
			slices: []*discoveryv1.EndpointSlice{
				slice("s1", discoveryv1.AddressTypeIPv4, map[string]int32{"a": 8080, "b": 81}, ep{addr: "10.32.0.5", ready: yes}),
				slice("s2", discoveryv1.AddressTypeIPv4, map[string]int32{"a": 8081, "b": 81}, ep{addr: "10.32.0.6", ready: yes}),
			},
			want: &wanted{ID: "svc-u1", Name: "ns/web", VIP: "10.96.0.13",
				Listeners: []capi.Listener{{Protocol: "TCP", Port: 80, TargetPort: 8080}, {Protocol: "TCP", Port: 81, TargetPort: 81}},
				Members: []capi.Member{mem("10.32.0.5", 81, "TCP/81"), mem("10.32.0.5", 8080, "TCP/80"),
					mem("10.32.0.6", 81, "TCP/81"), mem("10.32.0.6", 8081, "TCP/80")},
				Policy: hostAccess},
		},
		{
			// The upstream EndpointSlice Conformance case: each Service
			// port reaches only the endpoints of the slice that names it.
			name: "ports in separate slices: members per listener",
			svc: svcOf("10.96.0.14", sp("example-int-port", corev1.ProtocolTCP, 80, intstr.FromString("example-name")),
				sp("example-int-port2", corev1.ProtocolTCP, 81, intstr.FromString("example-name2"))),
			slices: []*discoveryv1.EndpointSlice{
				slice("e1", discoveryv1.AddressTypeIPv4, map[string]int32{"example-int-port": 3000}, ep{addr: "10.32.0.5", ready: yes}),
				slice("e2", discoveryv1.AddressTypeIPv4, map[string]int32{"example-int-port2": 3001}, ep{addr: "10.32.0.6", ready: yes}),
			},
			want: &wanted{ID: "svc-u1", Name: "ns/web", VIP: "10.96.0.14",
				Listeners: []capi.Listener{{Protocol: "TCP", Port: 80, TargetPort: 3000}, {Protocol: "TCP", Port: 81, TargetPort: 3001}},
				Members:   []capi.Member{mem("10.32.0.5", 3000, "TCP/80"), mem("10.32.0.6", 3001, "TCP/81")},
				Policy:    hostAccess},
		},
		{
			name: "terminating endpoints are backups; not serving ones are left out",
			svc:  svcOf("10.96.0.15", sp("", corev1.ProtocolTCP, 80, intstr.FromInt32(80))),
			slices: []*discoveryv1.EndpointSlice{
				slice("a", discoveryv1.AddressTypeIPv4, map[string]int32{"": 80},
					ep{addr: "10.32.0.5", ready: yes}, ep{addr: "10.32.0.6", terminating: true}, ep{addr: "10.32.0.7", ready: no}),
			},
			want: &wanted{ID: "svc-u1", Name: "ns/web", VIP: "10.96.0.15",
				Listeners: []capi.Listener{{Protocol: "TCP", Port: 80, TargetPort: 80}},
				Members:   []capi.Member{mem("10.32.0.5", 80), {Address: "10.32.0.6", Port: 80, Backup: true}},
				Policy:    hostAccess},
		},
		{
			name: "NodePort, Local traffic policies, external IPs of its family",
			svc:  nodePort,
			slices: []*discoveryv1.EndpointSlice{
				slice("a", discoveryv1.AddressTypeIPv4, map[string]int32{"": 8080}, ep{addr: "10.32.0.5", ready: yes, node: "n2"}),
			},
			want: &wanted{ID: "svc-u1", Name: "ns/web", VIP: "10.96.0.40",
				Listeners: []capi.Listener{{Protocol: "TCP", Port: 80, TargetPort: 8080, NodePort: 30080}},
				Members:   []capi.Member{{Address: "10.32.0.5", Port: 8080, HostID: "host-of-n2"}},
				Policy: capi.Policy{HostAccess: true, ExternalAddresses: []string{"192.0.2.1", "192.0.2.9"},
					ExternalLocal: true, InternalLocal: true}},
			warns: 1,
		},
		{
			name: "LoadBalancer, Local: health check node port",
			svc:  lbLocal,
			want: &wanted{ID: "svc-u1", Name: "ns/web", VIP: "10.96.0.41",
				Listeners: []capi.Listener{{Protocol: "UDP", Port: 53, TargetPort: 53, NodePort: 30053}},
				Policy:    capi.Policy{HostAccess: true, ExternalLocal: true, HealthCheckNodePort: 31000}},
		},
		{
			name: "ClusterIP: node port and external policy ignored",
			svc:  clusterOnly,
			want: &wanted{ID: "svc-u1", Name: "ns/web", VIP: "10.96.0.42",
				Listeners: []capi.Listener{{Protocol: "TCP", Port: 80, TargetPort: 80}}, Policy: hostAccess},
		},
		{
			name: "ClientIP affinity with a timeout",
			svc:  affinity,
			want: &wanted{ID: "svc-u1", Name: "ns/web", VIP: "10.96.0.20",
				Listeners:   []capi.Listener{{Protocol: "TCP", Port: 80, TargetPort: 8080}},
				Persistence: &capi.SessionPersistence{Type: capi.PersistenceSourceIP, Timeout: 60}, Policy: hostAccess},
		},
		{
			name: "ClientIP affinity, default timeout",
			svc:  affinityDefault,
			want: &wanted{ID: "svc-u1", Name: "ns/web", VIP: "10.96.0.21",
				Listeners:   []capi.Listener{{Protocol: "TCP", Port: 80, TargetPort: 80}},
				Persistence: &capi.SessionPersistence{Type: capi.PersistenceSourceIP, Timeout: DefaultAffinityTimeout}, Policy: hostAccess},
		},
	}
	hosts := func(n string) string { return "host-of-" + n }
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := desired(tc.svc, tc.slices, testSvcCIDR, testVPC, hosts)
			if tc.want == nil {
				if got != nil {
					t.Fatalf("want no load balancer, got %+v", got)
				}
				return
			}
			if got == nil {
				t.Fatal("want a load balancer, got none")
			}
			if len(got.Warnings) != tc.warns {
				t.Errorf("warnings %q, want %d", got.Warnings, tc.warns)
			}
			got.Warnings = nil
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestMembersCapped(t *testing.T) {
	var eps []ep
	for i := range MaxMembers + 10 {
		eps = append(eps, ep{addr: netip.AddrFrom4([4]byte{10, 33, byte(i >> 8), byte(i)}).String()})
	}
	w := desired(svcOf("10.96.0.30", sp("", "", 80, intstr.FromInt32(80))),
		[]*discoveryv1.EndpointSlice{slice("a", discoveryv1.AddressTypeIPv4, map[string]int32{"": 80}, eps...)}, testSvcCIDR, testVPC, nil)
	if len(w.Members) != MaxMembers || len(w.Warnings) != 1 {
		t.Fatalf("%d members, warnings %q; want %d and one warning", len(w.Members), w.Warnings, MaxMembers)
	}
}

// TestPrintMatchesController: what the controller stores (the request
// normalized by the shared contract, whatever the request's order and
// case) prints as desired does, and the prints tell a member change (one
// SetMembers) from any other.
func TestPrintMatchesController(t *testing.T) {
	sl := slice("a", discoveryv1.AddressTypeIPv4, map[string]int32{"dns": 53}, ep{addr: "10.32.0.9"}, ep{addr: "10.32.0.2"})
	sl.Ports[0].Protocol = new(corev1.ProtocolUDP)
	w := desired(svcOf("10.96.0.11", sp("dns", "udp", 53, intstr.FromInt32(0)), sp("web", "", 80, intstr.FromInt32(8080))),
		[]*discoveryv1.EndpointSlice{sl}, testSvcCIDR, testVPC, nil)
	stored := func() *capi.LoadBalancer {
		lb := &capi.LoadBalancer{Name: w.Name, VIPAddress: w.VIP,
			Listeners: []capi.Listener{{Protocol: "udp", Port: 53}, {Protocol: "TCP", Port: 80, TargetPort: 8080}},
			Members:   []capi.Member{mem("10.32.0.9", 53, "udp/53"), mem("10.32.0.2", 53, "UDP/53")},
			Policy:    capi.Policy{HostAccess: true}}
		var err error
		if lb.Listeners, err = capi.NormalizeListeners(lb.Listeners); err != nil {
			t.Fatal(err)
		}
		if lb.Members, err = capi.NormalizeMembers(lb.Members); err != nil {
			t.Fatal(err)
		}
		return lb
	}
	if got, want := printOf(stored()), w.print(); got != want {
		t.Fatalf("print of the controller's %+v, of desired %+v (desired %+v)", got, want, w)
	}
	lb := stored()
	lb.Members[0].Port = 81
	if got, want := printOf(lb), w.print(); got.spec != want.spec || got.members == want.members {
		t.Fatalf("member port changed: print %+v, desired %+v; want the same spec, other members", got, want)
	}
	lb = stored()
	lb.ExternalLocal = true
	if got, want := printOf(lb), w.print(); got.spec == want.spec || got.members != want.members {
		t.Fatalf("policy changed: print %+v, desired %+v; want another spec, the same members", got, want)
	}
	lb = stored()
	lb.Name = "other"
	if got, want := printOf(lb), w.print(); got.spec == want.spec || got.members != want.members {
		t.Fatalf("name changed: print %+v, desired %+v; want another spec, the same members", got, want)
	}
}

func TestServiceSubnetPlan(t *testing.T) {
	tests := []struct {
		rng       string
		exact     bool
		cidr, gw  string
		gwOutside bool
	}{
		{rng: "10.96.0.0/16", cidr: "10.96.0.0/15", gw: "10.97.255.254", gwOutside: true},
		{rng: "10.97.0.0/16", cidr: "10.96.0.0/15", gw: "10.96.0.1", gwOutside: true},
		{rng: "10.96.0.0/12", cidr: "10.96.0.0/11", gw: "10.127.255.254", gwOutside: true},
		{rng: "10.96.0.0/16", exact: true, cidr: "10.96.0.0/16", gw: "10.96.255.254"},
		{rng: "fd00:10:96::/108", cidr: "fd00:10:96::/107", gw: "fd00:10:96::1f:ffff", gwOutside: true},
	}
	for _, tc := range tests {
		rng := netip.MustParsePrefix(tc.rng)
		cidr, gw := serviceSubnetPlan(rng, tc.exact)
		if cidr.String() != tc.cidr || gw.String() != tc.gw || rng.Contains(gw) == tc.gwOutside || !cidr.Contains(gw) {
			t.Errorf("%s exact=%v: got %s gw %s, want %s gw %s", tc.rng, tc.exact, cidr, gw, tc.cidr, tc.gw)
		}
	}
}
