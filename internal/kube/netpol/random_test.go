package netpol

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// TestIncrementalEqualsScratch applies random changes (pods relabelled,
// moved, readdressed, deleted; namespaces relabelled; policies of every
// shape set and deleted) and checks after each Compute that the engine's
// rules equal those of a new engine fed the same objects at once.
func TestIncrementalEqualsScratch(t *testing.T) {
	for _, seed := range []uint64{7, 1, 2, 3, 4, 5} {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { incrementalEqualsScratch(t, seed, false) })
	}
	// Many policies alike in peers and ports (one signature, few shapes),
	// as the bench's: a peer's change is applied once per shape, weighted.
	for _, seed := range []uint64{8, 9, 10, 12, 13, 14} {
		t.Run(fmt.Sprintf("alike-%d", seed), func(t *testing.T) { incrementalEqualsScratch(t, seed, true) })
	}
}

func incrementalEqualsScratch(t *testing.T, seed uint64, alike bool) {
	r := rand.New(rand.NewPCG(seed, 11))
	pick := func(vs ...string) string { return vs[r.IntN(len(vs))] }
	randPod := func(i int) *Pod {
		nd := pick(node, "n2")
		p := &Pod{Namespace: pick("a", "b"), Name: fmt.Sprintf("p%d", i), Node: nd,
			IP:     netip.AddrFrom4([4]byte{10, 0, byte(r.IntN(2)), byte(i)}),
			Labels: map[string]string{"app": pick("x", "y", "z"), "tier": pick("1", "2")}}
		if r.IntN(2) == 0 {
			p.Ports = []NamedPort{{Name: "web", Proto: TCP, Port: uint16(8000 + r.IntN(3))}}
		}
		p.Inactive = r.IntN(10) == 0
		return p
	}
	randPeer := func() networkingv1.NetworkPolicyPeer {
		switch r.IntN(4) {
		case 0:
			return networkingv1.NetworkPolicyPeer{PodSelector: sel("app", pick("x", "y", "z"))}
		case 1:
			return networkingv1.NetworkPolicyPeer{NamespaceSelector: sel("team", pick("p", "q"))}
		case 2:
			return networkingv1.NetworkPolicyPeer{NamespaceSelector: sel(), PodSelector: sel("tier", pick("1", "2"))}
		}
		return networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/23", Except: []string{"10.0.1.0/25"}}}
	}
	randPorts := func() []networkingv1.NetworkPolicyPort {
		var out []networkingv1.NetworkPolicyPort
		for range r.IntN(3) {
			switch r.IntN(3) {
			case 0:
				out = append(out, networkingv1.NetworkPolicyPort{Port: ptr(intstr.FromInt32(int32(80 + r.IntN(2))))})
			case 1:
				out = append(out, networkingv1.NetworkPolicyPort{Port: ptr(intstr.FromString("web"))})
			default:
				out = append(out, networkingv1.NetworkPolicyPort{Protocol: ptr(corev1.ProtocolUDP), Port: ptr(intstr.FromInt32(53)), EndPort: ptr(int32(60))})
			}
		}
		return out
	}
	randPolicy := func(i int) *networkingv1.NetworkPolicy {
		spec := networkingv1.NetworkPolicySpec{}
		if alike {
			port := ptr(intstr.FromInt32(int32(80 + r.IntN(2))))
			if r.IntN(3) == 0 {
				port = ptr(intstr.FromString("web"))
			}
			ports := []networkingv1.NetworkPolicyPort{{Port: port}}
			peers := []networkingv1.NetworkPolicyPeer{{PodSelector: sel("tier", "1")}}
			if r.IntN(2) == 0 {
				spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: peers, Ports: ports}}
			} else {
				spec.Egress = []networkingv1.NetworkPolicyEgressRule{{To: peers, Ports: ports}}
				spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
			}
			return pol("a", fmt.Sprintf("np%d", i), sel("app", pick("x", "y", "z")), spec)
		}
		for range r.IntN(3) {
			var peers []networkingv1.NetworkPolicyPeer
			for range r.IntN(3) {
				peers = append(peers, randPeer())
			}
			spec.Ingress = append(spec.Ingress, networkingv1.NetworkPolicyIngressRule{From: peers, Ports: randPorts()})
		}
		for range r.IntN(3) {
			var peers []networkingv1.NetworkPolicyPeer
			for range r.IntN(3) {
				peers = append(peers, randPeer())
			}
			spec.Egress = append(spec.Egress, networkingv1.NetworkPolicyEgressRule{To: peers, Ports: randPorts()})
		}
		return pol(pick("a", "b"), fmt.Sprintf("np%d", i), sel("app", pick("x", "y", "z")), spec)
	}
	e := NewEngine(node)
	pods := map[string]*Pod{}
	nss := map[string]map[string]string{}
	pols := map[string]*networkingv1.NetworkPolicy{}
	for step := range 3000 {
		switch r.IntN(10) {
		case 0, 1, 2, 3, 4:
			p := randPod(r.IntN(20))
			if old := pods[p.Namespace+"/"+p.Name]; old == nil && r.IntN(2) == 0 {
				// a relabel of an existing pod, keeping the rest
				for _, q := range pods {
					c := *q
					c.Labels = map[string]string{"app": pick("x", "y", "z"), "tier": pick("1", "2")}
					p = &c
					break
				}
			}
			for k, q := range pods { // one object per name
				if q.Name == p.Name && k != p.Key() {
					e.DeletePod(q.Namespace, q.Name)
					delete(pods, k)
				}
			}
			pods[p.Key()] = p
			e.SetPod(p)
		case 5:
			for k, q := range pods {
				e.DeletePod(q.Namespace, q.Name)
				delete(pods, k)
				break
			}
		case 6:
			n, l := pick("a", "b"), map[string]string{"team": pick("p", "q")}
			nss[n] = l
			e.SetNamespace(n, l)
		case 7, 8:
			n := 8
			if alike {
				n = 40
			}
			p := randPolicy(r.IntN(n))
			for k, q := range pols {
				if q.Name == p.Name && k != p.Namespace+"/"+p.Name {
					e.DeletePolicy(q.Namespace, q.Name)
					delete(pols, k)
				}
			}
			pols[p.Namespace+"/"+p.Name] = p
			_ = e.SetPolicy(p)
		case 9:
			for k, q := range pols {
				e.DeletePolicy(q.Namespace, q.Name)
				delete(pols, k)
				break
			}
		}
		if r.IntN(3) > 0 {
			continue
		}
		e.Compute()
		f := NewEngine(node)
		for n, l := range nss {
			f.SetNamespace(n, l)
		}
		for _, p := range pods {
			f.SetPod(p)
		}
		for _, p := range pols {
			_ = f.SetPolicy(p)
		}
		f.Compute()
		got, want := e.All(), f.All()
		if !maps.EqualFunc(got, want, func(a, b *Rules) bool { return a.Equal(b) }) {
			for k := range want {
				if !got[k].Equal(want[k]) {
					t.Logf("%s: got %+v\nwant %+v", k, got[k], want[k])
				}
			}
			t.Fatalf("step %d: incremental rules differ from a fresh computation (%d vs %d pods)", step, len(got), len(want))
		}
	}
}
