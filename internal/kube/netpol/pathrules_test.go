package netpol

import (
	"fmt"
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/util/intstr"
)

// TestHandedOutListsUnchanged: the path keeps the allow lists it is handed
// (PathRules shares them), so the engine must never modify a list after
// Compute returned it. Every list handed out over a run of peer label
// changes, policy changes and pod deletions still holds what it held.
func TestHandedOutListsUnchanged(t *testing.T) {
	e := benchPods()
	for j := range 300 {
		if err := e.SetPolicy(benchPolicy(j)); err != nil {
			t.Fatal(err)
		}
	}
	type kept struct {
		key        string
		list, copy Dir
	}
	var all []kept
	keep := func(ch map[string]*Rules) {
		for k, r := range ch {
			if r == nil {
				continue
			}
			for _, d := range []Dir{r.Ingress, r.Egress} {
				all = append(all, kept{k, d, Dir{Isolated: d.Isolated, Base: slices.Clone(d.Base), Add: slices.Clone(d.Add), Del: slices.Clone(d.Del)}})
			}
		}
	}
	keep(e.Compute())
	steps := []struct {
		name string
		do   func(k int)
	}{
		{"peer relabelled", func(k int) {
			pod := *e.pods["bench/p101"]
			pod.Labels = map[string]string{"app": pod.Labels["app"], "grp": fmt.Sprintf("g-%d", k%3)}
			e.SetPod(&pod)
		}},
		{"policy added and changed", func(k int) {
			p := benchPolicy(0)
			p.Name = "probe"
			p.Spec.Ingress[0].Ports[0].Port = ptr(intstr.FromInt32(int32(20000 + k)))
			if err := e.SetPolicy(p); err != nil {
				t.Fatal(err)
			}
		}},
		{"policy deleted", func(int) { e.DeletePolicy("bench", "probe") }},
		{"remote peer deleted and back", func(k int) {
			pod := *e.pods["bench/p102"]
			e.DeletePod("bench", "p102")
			keep(e.Compute())
			e.SetPod(&pod)
		}},
	}
	changed := 0
	for k := range 6 {
		for _, s := range steps {
			s.do(k)
			ch := e.Compute()
			changed += len(ch)
			keep(ch)
			for i, kp := range all {
				if !slices.Equal(kp.list.Base, kp.copy.Base) || !slices.Equal(kp.list.Add, kp.copy.Add) || !slices.Equal(kp.list.Del, kp.copy.Del) {
					t.Fatalf("%s (round %d): list %d of %s was modified after it was handed out", s.name, k, i, kp.key)
				}
			}
		}
	}
	if changed == 0 {
		t.Fatal("no step changed any pod's rules: the test proves nothing")
	}
}

// TestPathRules: the datapath's view shares the engine's values (no copy)
// and keeps a deleted pod's nil.
func TestPathRules(t *testing.T) {
	r := &Rules{Ingress: Dir{Isolated: true, Base: []Allow{{PeerLo: 1, PeerHi: 1, Proto: TCP, PortLo: 80, PortHi: 80}}}}
	out := PathRules(map[string]*Rules{"a/web": r, "a/gone": nil})
	if len(out) != 2 {
		t.Fatalf("got %d pods, want 2", len(out))
	}
	if p, ok := out["a/gone"]; !ok || p != nil {
		t.Errorf("deleted pod: got %v (present %v), want a nil entry", p, ok)
	}
	p := out["a/web"]
	if p == nil || &p.Ingress.Base[0] != &r.Ingress.Base[0] {
		t.Errorf("a/web's allow list was copied or lost: %+v", p)
	}
}
