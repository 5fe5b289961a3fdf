package netpol

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// benchPods returns an engine holding the pods of bench/k8s/netpol: 1,000
// pods in namespace bench, 100 of them local, no policy yet.
func benchPods() *Engine {
	e := NewEngine(node)
	e.SetNamespace("bench", nil)
	for i := range 1000 {
		nd := "remote"
		if i < 100 {
			nd = node
		}
		e.SetPod(&Pod{Namespace: "bench", Name: fmt.Sprintf("p%d", i), Node: nd,
			IP:     netip.AddrFrom4([4]byte{10, 64, byte(i >> 8), byte(i)}),
			Labels: map[string]string{"app": fmt.Sprintf("app-%d", i%50), "grp": fmt.Sprintf("g-%d", i%10)}})
	}
	return e
}

// benchEngine is the shape of bench/k8s/netpol at 10,000 policies over
// benchPods, computed once.
func benchEngine() *Engine {
	e := benchPods()
	for j := range 10000 {
		_ = e.SetPolicy(benchPolicy(j))
	}
	e.Compute()
	return e
}

// BenchmarkPolicyChange: one policy selecting two local pods created and
// deleted (two Computes) among 10,000.
func BenchmarkPolicyChange(b *testing.B) {
	e := benchEngine()
	b.ResetTimer()
	for k := range b.N {
		p := benchPolicy(0)
		p.Name = "probe"
		p.Spec.Ingress[0].Ports[0].Port = ptr(intstr.FromInt32(int32(20000 + k%1000)))
		_ = e.SetPolicy(p)
		e.Compute()
		e.DeletePolicy("bench", "probe")
		e.Compute()
	}
}

// BenchmarkPeerLabelChange: one remote pod moved between two peer groups
// (1,000 policies each name it; 20 local pods gain or lose 200 allows).
func BenchmarkPeerLabelChange(b *testing.B) {
	e := benchEngine()
	b.ResetTimer()
	for k := range b.N {
		pod := *e.pods["bench/p101"]
		g := "g-0"
		if k%2 == 1 {
			g = "g-1"
		}
		pod.Labels = map[string]string{"app": pod.Labels["app"], "grp": g}
		e.SetPod(&pod)
		e.Compute()
	}
}

// BenchmarkColdCompute: the first Compute of benchEngine's state (a full
// sync after a restart): 100 local pods, 10,000 policies.
func BenchmarkColdCompute(b *testing.B) {
	for b.Loop() {
		b.StopTimer()
		e := benchPods()
		for j := range 10000 {
			_ = e.SetPolicy(benchPolicy(j))
		}
		b.StartTimer()
		e.Compute()
	}
}

// BenchmarkColdLoad: 10,000 policies handed to an engine holding
// benchPods, as a restarted agent's policy watch delivers them before
// its first full sync (the handler runs SetPolicy for each, serially).
func BenchmarkColdLoad(b *testing.B) {
	nps := make([]*networkingv1.NetworkPolicy, 10000)
	for j := range nps {
		nps[j] = benchPolicy(j)
	}
	for b.Loop() {
		b.StopTimer()
		e := benchPods()
		b.StartTimer()
		for _, np := range nps {
			_ = e.SetPolicy(np)
		}
	}
}

// BenchmarkHandOver: the engine's rules of one peer label change (20
// local pods of about 2,000 allows) handed to the path: by PathRules (the
// shared type) and, for comparison, by the element-wise copy that the
// agent made before the types were shared.
func BenchmarkHandOver(b *testing.B) {
	e := benchEngine()
	pod := *e.pods["bench/p101"]
	pod.Labels = map[string]string{"app": pod.Labels["app"], "grp": "g-0"}
	e.SetPod(&pod)
	ch := e.Compute()
	b.Run("shared", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			_ = PathRules(ch)
		}
	})
	b.Run("copied", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			out := make(map[string]*Rules, len(ch))
			for k, r := range ch {
				c := *r
				c.Ingress = Dir{Isolated: r.Ingress.Isolated, Base: slices.Clone(r.Ingress.List())}
				c.Egress = Dir{Isolated: r.Egress.Isolated, Base: slices.Clone(r.Egress.List())}
				out[k] = &c
			}
		}
	})
}
