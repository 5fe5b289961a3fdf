package netpol

import (
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

const node = "n1"

func pod(ns, name, nodeName, ip string, lbl map[string]string, ports ...NamedPort) *Pod {
	return &Pod{Namespace: ns, Name: name, Node: nodeName, IP: netip.MustParseAddr(ip), Labels: lbl, Ports: ports}
}

func sel(kv ...string) *metav1.LabelSelector {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return &metav1.LabelSelector{MatchLabels: m}
}

func ptr[T any](v T) *T { return &v }

func tcp(port int) networkingv1.NetworkPolicyPort {
	return networkingv1.NetworkPolicyPort{Protocol: ptr(corev1.ProtocolTCP), Port: ptr(intstr.FromInt32(int32(port)))}
}

func pol(ns, name string, podSel *metav1.LabelSelector, spec networkingv1.NetworkPolicySpec) *networkingv1.NetworkPolicy {
	spec.PodSelector = *podSel
	return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: spec}
}

// world is the fixture: namespaces a (team=x) and b (team=y); local pods
// a/web (10.0.0.1, port http=8080) and a/db; remote pods a/client,
// b/client, b/other.
func world(t *testing.T) *Engine {
	t.Helper()
	e := NewEngine(node)
	e.SetNamespace("a", map[string]string{"team": "x", "kubernetes.io/metadata.name": "a"})
	e.SetNamespace("b", map[string]string{"team": "y", "kubernetes.io/metadata.name": "b"})
	e.SetPod(pod("a", "web", node, "10.0.0.1", map[string]string{"app": "web"}, NamedPort{"http", TCP, 8080}))
	e.SetPod(pod("a", "db", node, "10.0.0.2", map[string]string{"app": "db"}))
	e.SetPod(pod("a", "client", "n2", "10.0.1.1", map[string]string{"app": "client"}))
	e.SetPod(pod("b", "client", "n2", "10.0.1.2", map[string]string{"app": "client"}, NamedPort{"dns", UDP, 53}))
	e.SetPod(pod("b", "other", "n2", "10.0.1.3", map[string]string{"app": "other"}))
	e.Compute()
	return e
}

func allows(d Dir) string {
	var s []string
	for a := range d.All() {
		s = append(s, a.String())
	}
	return strings.Join(s, ",")
}

func TestEngine(t *testing.T) {
	for _, tc := range []struct {
		name     string
		policies []*networkingv1.NetworkPolicy
		pod      string
		isoIn    bool
		in       string
		isoEg    bool
		eg       string
	}{
		{name: "no policy", pod: "a/web"},
		{name: "deny all ingress", pod: "a/web", isoIn: true,
			policies: []*networkingv1.NetworkPolicy{pol("a", "deny", sel(), networkingv1.NetworkPolicySpec{})}},
		{name: "other pod not selected", pod: "a/db",
			policies: []*networkingv1.NetworkPolicy{pol("a", "deny", sel("app", "web"), networkingv1.NetworkPolicySpec{})}},
		{name: "allow all ingress rule", pod: "a/web",
			policies: []*networkingv1.NetworkPolicy{pol("a", "all", sel(), networkingv1.NetworkPolicySpec{
				Ingress: []networkingv1.NetworkPolicyIngressRule{{}}})}},
		{name: "pod selector, one port", pod: "a/web", isoIn: true, in: "10.0.1.1 6/80",
			policies: []*networkingv1.NetworkPolicy{pol("a", "p", sel("app", "web"), networkingv1.NetworkPolicySpec{
				Ingress: []networkingv1.NetworkPolicyIngressRule{{
					From:  []networkingv1.NetworkPolicyPeer{{PodSelector: sel("app", "client")}},
					Ports: []networkingv1.NetworkPolicyPort{tcp(80)}}}})}},
		{name: "namespace selector, all ports", pod: "a/web", isoIn: true, in: "10.0.1.2,10.0.1.3",
			policies: []*networkingv1.NetworkPolicy{pol("a", "p", sel(), networkingv1.NetworkPolicySpec{
				Ingress: []networkingv1.NetworkPolicyIngressRule{{
					From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: sel("team", "y")}}}}})}},
		{name: "namespace and pod selector", pod: "a/web", isoIn: true, in: "10.0.1.2",
			policies: []*networkingv1.NetworkPolicy{pol("a", "p", sel(), networkingv1.NetworkPolicySpec{
				Ingress: []networkingv1.NetworkPolicyIngressRule{{
					From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: sel("team", "y"), PodSelector: sel("app", "client")}}}}})}},
		{name: "two policies add up", pod: "a/web", isoIn: true, in: "10.0.1.1 6/80,10.0.1.2 6/81",
			policies: []*networkingv1.NetworkPolicy{
				pol("a", "p1", sel(), networkingv1.NetworkPolicySpec{Ingress: []networkingv1.NetworkPolicyIngressRule{{
					From: []networkingv1.NetworkPolicyPeer{{PodSelector: sel("app", "client")}}, Ports: []networkingv1.NetworkPolicyPort{tcp(80)}}}}),
				pol("a", "p2", sel(), networkingv1.NetworkPolicySpec{Ingress: []networkingv1.NetworkPolicyIngressRule{{
					From:  []networkingv1.NetworkPolicyPeer{{NamespaceSelector: sel("team", "y"), PodSelector: sel("app", "client")}},
					Ports: []networkingv1.NetworkPolicyPort{tcp(81)}}}})}},
		{name: "ipBlock with except", pod: "a/web", isoIn: true, in: "10.1.0.0-10.1.0.255 6/80,10.1.2.0-10.1.255.255 6/80",
			policies: []*networkingv1.NetworkPolicy{pol("a", "p", sel(), networkingv1.NetworkPolicySpec{
				Ingress: []networkingv1.NetworkPolicyIngressRule{{
					From:  []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "10.1.0.0/16", Except: []string{"10.1.1.0/24"}}}},
					Ports: []networkingv1.NetworkPolicyPort{tcp(80)}}}})}},
		{name: "named port on the destination (ingress)", pod: "a/web", isoIn: true, in: "0.0.0.0-255.255.255.255 6/8080",
			policies: []*networkingv1.NetworkPolicy{pol("a", "p", sel(), networkingv1.NetworkPolicySpec{
				Ingress: []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{
					{Port: ptr(intstr.FromString("http"))}, {Port: ptr(intstr.FromString("nope"))}}}}})}},
		{name: "named port on the destination (egress)", pod: "a/web", isoEg: true, eg: "10.0.1.2 17/53",
			policies: []*networkingv1.NetworkPolicy{pol("a", "p", sel(), networkingv1.NetworkPolicySpec{
				PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
				Egress: []networkingv1.NetworkPolicyEgressRule{{Ports: []networkingv1.NetworkPolicyPort{
					{Protocol: ptr(corev1.ProtocolUDP), Port: ptr(intstr.FromString("dns"))}}}}})}},
		{name: "endPort and protocols", pod: "a/web", isoEg: true, eg: "10.0.1.1 6/1000-2000,10.0.1.1 17/0-65535,10.0.1.1 132/9",
			policies: []*networkingv1.NetworkPolicy{pol("a", "p", sel(), networkingv1.NetworkPolicySpec{
				PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
				Egress: []networkingv1.NetworkPolicyEgressRule{{
					To: []networkingv1.NetworkPolicyPeer{{PodSelector: sel("app", "client")}},
					Ports: []networkingv1.NetworkPolicyPort{
						{Port: ptr(intstr.FromInt32(1000)), EndPort: ptr(int32(2000))},
						{Protocol: ptr(corev1.ProtocolUDP)},
						{Protocol: ptr(corev1.ProtocolSCTP), Port: ptr(intstr.FromInt32(9))}}}}})}},
		{name: "egress rules imply egress type", pod: "a/web", isoIn: true, isoEg: true, eg: "10.0.1.1",
			policies: []*networkingv1.NetworkPolicy{pol("a", "p", sel(), networkingv1.NetworkPolicySpec{
				Egress: []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{{PodSelector: sel("app", "client")}}}}})}},
		{name: "policy of another namespace", pod: "a/web",
			policies: []*networkingv1.NetworkPolicy{pol("b", "p", sel(), networkingv1.NetworkPolicySpec{})}},
		{name: "bad policy fails closed", pod: "a/web", isoIn: true, isoEg: true,
			policies: []*networkingv1.NetworkPolicy{pol("a", "p", sel(), networkingv1.NetworkPolicySpec{
				Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "nonsense"}}}}}})}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := world(t)
			for _, p := range tc.policies {
				_ = e.SetPolicy(p)
			}
			e.Compute()
			r := e.Rules(tc.pod)
			if r == nil {
				t.Fatalf("no rules for %s", tc.pod)
			}
			if r.Ingress.Isolated != tc.isoIn || allows(r.Ingress) != tc.in {
				t.Errorf("ingress: isolated %v %q, want %v %q", r.Ingress.Isolated, allows(r.Ingress), tc.isoIn, tc.in)
			}
			if r.Egress.Isolated != tc.isoEg || allows(r.Egress) != tc.eg {
				t.Errorf("egress: isolated %v %q, want %v %q", r.Egress.Isolated, allows(r.Egress), tc.isoEg, tc.eg)
			}
		})
	}
}

// TestIncremental checks that each change recomputes and reports only the
// pods it affects.
func TestIncremental(t *testing.T) {
	e := world(t)
	p := pol("a", "p", sel("app", "web"), networkingv1.NetworkPolicySpec{
		Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{
			{NamespaceSelector: sel("team", "y"), PodSelector: sel("app", "client")}}}}})
	steps := []struct {
		name    string
		do      func()
		changed string // keys reported by Compute
		in      string // a/web's ingress afterwards
	}{
		{"policy created", func() { _ = e.SetPolicy(p) }, "a/web", "10.0.1.2"},
		{"same policy again", func() { _ = e.SetPolicy(p) }, "", "10.0.1.2"},
		{"peer relabelled in", func() {
			e.SetPod(pod("b", "other", "n2", "10.0.1.3", map[string]string{"app": "client"}))
		}, "a/web", "10.0.1.2,10.0.1.3"},
		{"unrelated pod relabelled", func() {
			e.SetPod(pod("a", "client", "n2", "10.0.1.1", map[string]string{"app": "zzz"}))
		}, "", "10.0.1.2,10.0.1.3"},
		{"namespace relabelled out", func() { e.SetNamespace("b", map[string]string{"team": "z"}) }, "a/web", ""},
		{"namespace back", func() { e.SetNamespace("b", map[string]string{"team": "y"}) }, "a/web", "10.0.1.2,10.0.1.3"},
		{"peer deleted", func() { e.DeletePod("b", "client") }, "a/web", "10.0.1.3"},
		{"local pod relabelled out of the policy", func() {
			e.SetPod(pod("a", "web", node, "10.0.0.1", map[string]string{"app": "x"}))
		}, "a/web", ""},
		{"local pod back", func() {
			e.SetPod(pod("a", "web", node, "10.0.0.1", map[string]string{"app": "web"}))
		}, "a/web", "10.0.1.3"},
		{"policy deleted", func() { e.DeletePolicy("a", "p") }, "a/web", ""},
		{"local pod deleted", func() { e.DeletePod("a", "web") }, "a/web", ""},
	}
	for _, s := range steps {
		s.do()
		ch := e.Compute()
		var keys []string
		for k := range ch {
			keys = append(keys, k)
		}
		if got := strings.Join(keys, ","); got != s.changed {
			t.Errorf("%s: changed %q, want %q", s.name, got, s.changed)
		}
		if r := e.Rules("a/web"); r != nil && allows(r.Ingress) != s.in {
			t.Errorf("%s: ingress %q, want %q", s.name, allows(r.Ingress), s.in)
		}
	}
	if e.Rules("a/web") != nil {
		t.Error("deleted pod keeps rules")
	}
}

func TestBlockRanges(t *testing.T) {
	for _, tc := range []struct {
		cidr   string
		except []string
		want   string
		err    bool
	}{
		{cidr: "10.0.0.0/8", want: "10.0.0.0-10.255.255.255"},
		{cidr: "10.0.0.5/8", want: "10.0.0.0-10.255.255.255"},
		{cidr: "0.0.0.0/0", except: []string{"10.0.0.0/8", "10.1.0.0/16"}, want: "0.0.0.0-9.255.255.255,11.0.0.0-255.255.255.255"},
		{cidr: "10.0.0.0/24", except: []string{"10.0.0.0/24"}, want: ""},
		{cidr: "10.0.0.0/24", except: []string{"10.0.0.255/32", "10.0.0.0/32"}, want: "10.0.0.1-10.0.0.254"},
		{cidr: "fd00::/8", want: ""},
		{cidr: "10.0.0.0/24", except: []string{"10.0.1.0/24"}, err: true},
		{cidr: "10.0.0.0/24", except: []string{"fd00::/8"}, err: true},
		{cidr: "x", err: true},
	} {
		rs, err := BlockRanges(tc.cidr, tc.except)
		if (err != nil) != tc.err {
			t.Errorf("%s %v: err %v", tc.cidr, tc.except, err)
			continue
		}
		var s []string
		for _, r := range rs {
			s = append(s, r[0].String()+"-"+r[1].String())
		}
		if got := strings.Join(s, ","); got != tc.want {
			t.Errorf("%s %v: %q, want %q", tc.cidr, tc.except, got, tc.want)
		}
	}
}

func TestPodFrom(t *testing.T) {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "x", Labels: map[string]string{"k": "v"},
		Annotations: map[string]string{"kurma.dev/pod-networks": `{"default":{"port_id":"p","project_id":"j","subnet_id":"s","mac_address":"02:00:00:00:00:01","ip_addresses":["10.2.0.7/16"],"pod_uid":"u","host_id":"h"}}`}},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Ports: []corev1.ContainerPort{
			{Name: "web", ContainerPort: 80}, {ContainerPort: 81}, {Name: "q", ContainerPort: 53, Protocol: corev1.ProtocolUDP}}}}}}
	c := PodFrom(p)
	if c.IP.String() != "10.2.0.7" || len(c.Ports) != 2 || c.Ports[1] != (NamedPort{"q", UDP, 53}) || !c.active() {
		t.Fatalf("from annotation: %+v", c)
	}
	p.Status.PodIPs = []corev1.PodIP{{IP: "fd00::1"}, {IP: "10.2.0.8"}}
	if c := PodFrom(p); c.IP.String() != "10.2.0.8" {
		t.Fatalf("from status: %v", c.IP)
	}
	p.Status.Phase = corev1.PodSucceeded
	if c := PodFrom(p); c.active() {
		t.Fatal("terminal pod active")
	}
}
