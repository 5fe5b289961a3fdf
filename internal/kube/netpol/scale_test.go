package netpol

import (
	"fmt"
	"slices"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// benchPolicy j selects app-(j%50) and allows grp g-(j%10) on TCP port
// 1000+j%1000 (the shape of bench/k8s/netpol).
func benchPolicy(j int) *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "bench", Name: fmt.Sprintf("np%d", j)},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: *sel("app", fmt.Sprintf("app-%d", j%50)),
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{PodSelector: sel("grp", fmt.Sprintf("g-%d", j%10))}},
				Ports: []networkingv1.NetworkPolicyPort{{Port: ptr(intstr.FromInt32(int32(1000 + j%1000)))}}}}}}
}

// TestEngineScale times the engine alone (no API, no kernel) with 1,000
// pods, 100 of them local, and 100 / 1,000 / 10,000 policies: the first
// Compute, one policy added, one pod relabelled. Figures are logged; it
// skips under -short.
func TestEngineScale(t *testing.T) {
	if testing.Short() {
		t.Skip("timing")
	}
	for _, n := range []int{100, 1000, 10000} {
		e := benchPods()
		for j := range n {
			_ = e.SetPolicy(benchPolicy(j))
		}
		t0 := time.Now()
		all := e.Compute()
		cold := time.Since(t0)
		elems := 0
		for _, r := range all {
			elems += r.Ingress.Len()
		}
		var add, lbl []time.Duration
		for k := range 20 {
			p := benchPolicy(k)
			p.Name = fmt.Sprintf("probe%d", k)
			p.Spec.Ingress[0].Ports[0].Port = ptr(intstr.FromInt32(int32(20000 + k)))
			t0 := time.Now()
			_ = e.SetPolicy(p)
			e.Compute()
			add = append(add, time.Since(t0))
			i := 101 + 10*k
			pod := *e.pods[fmt.Sprintf("bench/p%d", i)]
			pod.Labels = map[string]string{"app": pod.Labels["app"], "grp": "g-0"}
			t0 = time.Now()
			e.SetPod(&pod)
			e.Compute()
			lbl = append(lbl, time.Since(t0))
		}
		slices.Sort(add)
		slices.Sort(lbl)
		t.Logf("%d policies: cold Compute %v (%d allows over %d pods); policy added p50 %v max %v; label change p50 %v max %v",
			n, cold, elems, len(all), add[10], add[19], lbl[10], lbl[19])
	}
}
