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
}

func slice(name string, at discoveryv1.AddressType, ports map[string]int32, eps ...ep) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}, AddressType: at}
	for n, p := range ports {
		s.Ports = append(s.Ports, discoveryv1.EndpointPort{Name: new(n), Port: new(p), Protocol: new(corev1.ProtocolTCP)})
	}
	for _, e := range eps {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{e.addr},
			Conditions: discoveryv1.EndpointConditions{Ready: e.ready}})
	}
	return s
}

func TestDesired(t *testing.T) {
	yes, no := new(true), new(false)
	affinity := svcOf("10.96.0.20", sp("", corev1.ProtocolTCP, 80, intstr.FromInt32(8080)))
	affinity.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
	affinity.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: new(int32(60))}}
	affinityDefault := svcOf("10.96.0.21", sp("", corev1.ProtocolTCP, 80, intstr.FromInt32(80)))
	affinityDefault.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
	external := svcOf("", sp("", corev1.ProtocolTCP, 80, intstr.FromInt32(80)))
	external.Spec.Type = corev1.ServiceTypeExternalName

	tests := []struct {
		name   string
		svc    *corev1.Service
		slices []*discoveryv1.EndpointSlice
		want   *wanted // Warnings compared by count only
		warns  int
	}{
		{name: "headless", svc: svcOf("None", sp("", "", 80, intstr.FromInt32(80)))},
		{name: "external name", svc: external},
		{name: "outside the service range", svc: svcOf("10.97.0.1", sp("", "", 80, intstr.FromInt32(80)))},
		{
			name: "no slices: numeric target, no members",
			svc:  svcOf("10.96.0.10", sp("http", "", 80, intstr.FromInt32(8080)), sp("dns", corev1.ProtocolUDP, 53, intstr.FromString("dns"))),
			want: &wanted{ID: "svc-u1", Name: "ns/web", VIP: "10.96.0.10", Listeners: []capi.Listener{
				{Protocol: "TCP", Port: 80, TargetPort: 8080}, {Protocol: "UDP", Port: 53, TargetPort: 53}}},
		},
		{
			name: "named target resolved, ready endpoints only, other family and outside-VPC dropped, duplicates once",
			svc:  svcOf("10.96.0.11", sp("http", corev1.ProtocolTCP, 80, intstr.FromString("web"))),
			slices: []*discoveryv1.EndpointSlice{
				slice("b", discoveryv1.AddressTypeIPv4, map[string]int32{"http": 9090},
					ep{"10.32.0.7", nil}, ep{"10.32.0.5", yes}, ep{"10.32.0.6", no}, ep{"192.168.1.1", yes}),
				slice("a", discoveryv1.AddressTypeIPv4, map[string]int32{"http": 9090}, ep{"10.32.0.5", yes}),
				slice("c", discoveryv1.AddressTypeIPv6, map[string]int32{"http": 1111}, ep{"fd00::1", yes}),
			},
			want: &wanted{ID: "svc-u1", Name: "ns/web", VIP: "10.96.0.11",
				Listeners: []capi.Listener{{Protocol: "TCP", Port: 80, TargetPort: 9090}},
				Members:   []capi.Member{{Address: "10.32.0.5"}, {Address: "10.32.0.7"}}},
		},
		{
			name: "one port resolving differently per slice: members carry the port",
			svc:  svcOf("10.96.0.12", sp("", corev1.ProtocolTCP, 80, intstr.FromString("web"))),
			slices: []*discoveryv1.EndpointSlice{
				slice("a", discoveryv1.AddressTypeIPv4, map[string]int32{"": 8080}, ep{"10.32.0.5", yes}),
				slice("b", discoveryv1.AddressTypeIPv4, map[string]int32{"": 8081}, ep{"10.32.0.6", yes}),
			},
			want: &wanted{ID: "svc-u1", Name: "ns/web", VIP: "10.96.0.12",
				Listeners: []capi.Listener{{Protocol: "TCP", Port: 80, TargetPort: 8080}},
				Members:   []capi.Member{{Address: "10.32.0.5", Port: 8080}, {Address: "10.32.0.6", Port: 8081}}},
		},
		{
			name: "several ports resolving differently: first slice wins, with a warning",
			svc: svcOf("10.96.0.13", sp("a", corev1.ProtocolTCP, 80, intstr.FromString("web")),
				sp("b", corev1.ProtocolTCP, 81, intstr.FromInt32(81))),
			slices: []*discoveryv1.EndpointSlice{
				slice("s1", discoveryv1.AddressTypeIPv4, map[string]int32{"a": 8080, "b": 81}, ep{"10.32.0.5", yes}),
				slice("s2", discoveryv1.AddressTypeIPv4, map[string]int32{"a": 8081, "b": 81}, ep{"10.32.0.6", yes}),
			},
			want: &wanted{ID: "svc-u1", Name: "ns/web", VIP: "10.96.0.13",
				Listeners: []capi.Listener{{Protocol: "TCP", Port: 80, TargetPort: 8080}, {Protocol: "TCP", Port: 81, TargetPort: 81}},
				Members:   []capi.Member{{Address: "10.32.0.5"}, {Address: "10.32.0.6"}}},
			warns: 1,
		},
		{
			name: "ClientIP affinity with a timeout",
			svc:  affinity,
			want: &wanted{ID: "svc-u1", Name: "ns/web", VIP: "10.96.0.20",
				Listeners:   []capi.Listener{{Protocol: "TCP", Port: 80, TargetPort: 8080}},
				Persistence: &capi.SessionPersistence{Type: capi.PersistenceSourceIP, Timeout: 60}},
		},
		{
			name: "ClientIP affinity, default timeout",
			svc:  affinityDefault,
			want: &wanted{ID: "svc-u1", Name: "ns/web", VIP: "10.96.0.21",
				Listeners:   []capi.Listener{{Protocol: "TCP", Port: 80, TargetPort: 80}},
				Persistence: &capi.SessionPersistence{Type: capi.PersistenceSourceIP, Timeout: DefaultAffinityTimeout}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := desired(tc.svc, tc.slices, testSvcCIDR, testVPC)
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
		eps = append(eps, ep{netip.AddrFrom4([4]byte{10, 33, byte(i >> 8), byte(i)}).String(), nil})
	}
	w := desired(svcOf("10.96.0.30", sp("", "", 80, intstr.FromInt32(80))),
		[]*discoveryv1.EndpointSlice{slice("a", discoveryv1.AddressTypeIPv4, nil, eps...)}, testSvcCIDR, testVPC)
	if len(w.Members) != MaxMembers || len(w.Warnings) != 1 {
		t.Fatalf("%d members, warnings %q; want %d and one warning", len(w.Members), w.Warnings, MaxMembers)
	}
}

func TestNormalizeMatchesDesired(t *testing.T) {
	w := desired(svcOf("10.96.0.11", sp("", "udp", 53, intstr.FromInt32(0)), sp("", "", 80, intstr.FromInt32(8080))),
		[]*discoveryv1.EndpointSlice{slice("a", discoveryv1.AddressTypeIPv4, nil, ep{"10.32.0.9", nil}, ep{"10.32.0.2", nil})},
		testSvcCIDR, testVPC)
	// What the controller returns: its own order, target_port omitted
	// where equal to the port, protocols in upper case.
	lb := &capi.LoadBalancer{Listeners: []capi.Listener{{Protocol: "UDP", Port: 53}, {Protocol: "TCP", Port: 80, TargetPort: 8080}},
		Members: []capi.Member{{Address: "10.32.0.9"}, {Address: "10.32.0.2"}}}
	ls, ms := normalize(lb)
	if !reflect.DeepEqual(ls, w.Listeners) || !sameMembers(ms, w.Members) {
		t.Fatalf("normalized %+v %+v, desired %+v %+v", ls, ms, w.Listeners, w.Members)
	}
	// The prints the reconciler keeps instead of the object agree too, and
	// tell a member change (one SetMembers) from any other.
	lb.Name, lb.VIPAddress = w.Name, w.VIP
	if got, want := printOf(lb), w.print(); got != want {
		t.Fatalf("print of the controller's %+v, of desired %+v", got, want)
	}
	lb.Members[0].Port = 81
	if got, want := printOf(lb), w.print(); got.spec != want.spec || got.members == want.members {
		t.Fatalf("member port changed: print %+v, desired %+v; want the same spec, other members", got, want)
	}
	lb.Members[0].Port = 0
	lb.SessionPersistence = &capi.SessionPersistence{Type: "source_ip"}
	w.Persistence = &capi.SessionPersistence{Type: capi.PersistenceSourceIP, Timeout: DefaultAffinityTimeout}
	if got, want := printOf(lb), w.print(); got != want {
		t.Fatalf("persistence in other case and default timeout: print %+v, desired %+v", got, want)
	}
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
