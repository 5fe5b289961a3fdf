package netpol

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/prometheus/client_golang/prometheus"

	"kurma.dev/kurma/internal/kube/podnet"
)

// fakeDP records what the controller programs.
type fakeDP struct {
	mu    sync.Mutex
	state map[string]*Rules
	syncs int
}

func (f *fakeDP) Apply(_ context.Context, ch map[string]*Rules) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for k, r := range ch {
		if r == nil {
			delete(f.state, k)
		} else {
			f.state[k] = r
		}
	}
	return nil
}

func (f *fakeDP) Sync(_ context.Context, all map[string]*Rules) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.state, f.syncs = all, f.syncs+1
	return nil
}

func (f *fakeDP) get(k string) *Rules {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.state[k]
}

func kpod(ns, name, nodeName, ip string, lbl map[string]string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: lbl},
		Spec: corev1.PodSpec{NodeName: nodeName}, Status: corev1.PodStatus{PodIPs: []corev1.PodIP{{IP: ip}}}}
}

// TestController: the first full sync, WaitPod for a new pod, a policy
// created and relabelled peers reach the datapath.
func TestController(t *testing.T) {
	kc := fake.NewClientset(
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "a", Labels: map[string]string{"kubernetes.io/metadata.name": "a"}}},
		kpod("a", "web", node, "10.0.0.1", map[string]string{"app": "web"}),
		kpod("a", "client", "n2", "10.0.1.1", map[string]string{"app": "client"}),
	)
	dp := &fakeDP{state: map[string]*Rules{}}
	reg := prometheus.NewRegistry()
	c, err := New(Config{Kube: kc, NodeName: node, Datapath: dp, Metrics: reg})
	if err != nil {
		t.Fatal(err)
	}
	ctx := runController(t, c)
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	defer wcancel()
	if err := c.WaitPod(wctx, "a", "web", netip.MustParseAddr("10.0.0.1")); err != nil {
		t.Fatal(err)
	}
	// A pod created now: WaitPod returns once it is programmed.
	if _, err := kc.CoreV1().Pods("a").Create(ctx, kpod("a", "new", node, "10.0.0.2", nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitPod(wctx, "a", "new", netip.MustParseAddr("10.0.0.2")); err != nil {
		t.Fatal(err)
	}
	if dp.get("a/new") == nil {
		t.Fatal("WaitPod returned before the pod was programmed")
	}
	np := pol("a", "p", sel("app", "web"), networkingv1.NetworkPolicySpec{Ingress: []networkingv1.NetworkPolicyIngressRule{{
		From: []networkingv1.NetworkPolicyPeer{{PodSelector: sel("app", "client")}}}}})
	if _, err := kc.NetworkingV1().NetworkPolicies("a").Create(ctx, np, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "policy programmed", func() bool {
		r := dp.get("a/web")
		return r != nil && r.Ingress.Isolated && allows(r.Ingress) == "10.0.1.1"
	})
	if _, err := kc.CoreV1().Pods("a").Update(ctx, kpod("a", "client", "n2", "10.0.1.1", map[string]string{"app": "x"}), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "peer relabel programmed", func() bool {
		r := dp.get("a/web")
		return r != nil && r.Ingress.Isolated && allows(r.Ingress) == ""
	})
	// The policy and the relabel were applied as deltas; their lag from
	// the watch event is still observed.
	if n := histCount(t, reg, "kurma_netpol_programming_seconds", "partial"); n < 2 {
		t.Errorf("programming lag observed %d times for partial syncs, want at least 2 (policy, relabel)", n)
	}
	// An unknown pod's wait ends with its context.
	sctx, scancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer scancel()
	if err := c.WaitPod(sctx, "a", "ghost", netip.MustParseAddr("10.0.0.9")); err == nil {
		t.Fatal("WaitPod of an unknown pod succeeded")
	}
}

// histCount returns the sample count of histogram name{kind}.
func histCount(t *testing.T, g prometheus.Gatherer, name, kind string) uint64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "kind" && l.GetValue() == kind {
					return m.GetHistogram().GetSampleCount()
				}
			}
		}
	}
	return 0
}

func waitFor(t *testing.T, what string, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: timed out", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestFirstSyncSeesEverything: the first full sync (which readies
// WaitPod) holds every object of the initial lists, not only those the
// handlers had delivered when the caches synced.
func TestFirstSyncSeesEverything(t *testing.T) {
	var objs []runtime.Object
	objs = append(objs, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "a"}})
	for i := range 500 {
		objs = append(objs, kpod("a", fmt.Sprintf("p%d", i), node, fmt.Sprintf("10.0.%d.%d", i/200, i%200+1), map[string]string{"app": "web"}))
	}
	objs = append(objs, pol("a", "deny", sel(), networkingv1.NetworkPolicySpec{}))
	dp := &fakeDP{state: map[string]*Rules{}}
	c, err := New(Config{Kube: fake.NewClientset(objs...), NodeName: node, Datapath: dp})
	if err != nil {
		t.Fatal(err)
	}
	ctx := runController(t, c)
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	defer wcancel()
	if err := c.WaitPod(wctx, "a", "p0", netip.MustParseAddr("10.0.0.1")); err != nil {
		t.Fatal(err)
	}
	dp.mu.Lock()
	defer dp.mu.Unlock()
	isolated := 0
	for _, r := range dp.state {
		if r.Ingress.Isolated {
			isolated++
		}
	}
	if len(dp.state) != 500 || isolated != 500 {
		t.Fatalf("first sync: %d pods, %d isolated; want 500, 500", len(dp.state), isolated)
	}
}

// TestAnnotationAddressVerified is issue 25's hijack class in
// NetworkPolicy: a local pod whose address is known only from its
// annotation, which its editors can write, gets that address only once
// Config.VerifyAddr (the agent's record of the pod's port) confirms it.
// A pod of namespace b that names the address of a pod of namespace a
// and isolates itself would otherwise isolate a's pod (every packet to it
// dropped) under b's policy.
func TestAnnotationAddressVerified(t *testing.T) {
	annotated := func(ns, name, uid, ip string) *corev1.Pod {
		v, err := podnet.Encode(podnet.Networks{podnet.DefaultNetwork: podnet.Network{PortID: podnet.PortID(uid),
			ProjectID: "k8s", SubnetID: "s", MAC: "02:00:00:00:00:09", IPs: []string{ip + "/24"}, PodUID: uid, HostID: node}})
		if err != nil {
			t.Fatal(err)
		}
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(uid),
			Labels: map[string]string{"app": "b"}, Annotations: map[string]string{podnet.Annotation: v}},
			Spec: corev1.PodSpec{NodeName: node}}
	}
	remote := func(ns, name, uid, ip string) *corev1.Pod {
		p := annotated(ns, name, uid, ip)
		p.Spec.NodeName = "n2"
		return p
	}
	var mu sync.Mutex
	// uid -> its port's address, as the agent has it
	ports := map[string]string{"good": "10.0.0.7", "peer": "10.0.1.5"}
	kc := fake.NewClientset(
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "a"}}, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "b"}},
		kpod("a", "victim", node, "10.0.0.1", map[string]string{"app": "web"}),
		annotated("b", "forged", "evil", "10.0.0.1"),
		annotated("b", "good", "good", "10.0.0.7"),
		annotated("b", "late", "late", "10.0.0.8"),
		// Peers on another node: one whose port has its address, one
		// that names an address its port does not have.
		remote("b", "peer", "peer", "10.0.1.5"),
		remote("b", "forged-peer", "evil2", "10.0.1.99"),
		remote("b", "late-peer", "latepeer", "10.0.1.6"),
		kpod("a", "db", node, "10.0.0.2", map[string]string{"app": "db"}),
		pol("a", "db", sel("app", "db"), networkingv1.NetworkPolicySpec{Ingress: []networkingv1.NetworkPolicyIngressRule{{
			From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{}, PodSelector: sel("app", "b")}}}}}),
		// b isolates its own pods for ingress, allowing nothing.
		pol("b", "deny", sel("app", "b"), networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}),
	)
	dp := &fakeDP{state: map[string]*Rules{}}
	c, err := New(Config{Kube: kc, NodeName: node, Datapath: dp, VerifyAddr: func(uid string, ip netip.Addr) bool {
		mu.Lock()
		defer mu.Unlock()
		return ports[uid] == ip.String()
	}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := runController(t, c)
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	defer wcancel()
	for _, p := range []struct{ key, ip string }{{"a/victim", "10.0.0.1"}, {"b/good", "10.0.0.7"}} {
		ns, name, _ := strings.Cut(p.key, "/")
		if err := c.WaitPod(wctx, ns, name, netip.MustParseAddr(p.ip)); err != nil {
			t.Fatal(err)
		}
	}
	if r := dp.get("b/good"); r == nil || r.IP != netip.MustParseAddr("10.0.0.7") || !r.Ingress.Isolated {
		t.Fatalf("b/good (address confirmed): %+v", r)
	}
	dp.mu.Lock()
	for k, r := range dp.state {
		if r.IP == netip.MustParseAddr("10.0.0.1") && k != "a/victim" {
			t.Errorf("%s programmed with a/victim's address: %+v", k, r)
		}
	}
	dp.mu.Unlock()
	if r := dp.get("a/victim"); r == nil || r.Ingress.Isolated {
		t.Fatalf("a/victim: %+v, want not isolated", r)
	}
	// a/db allows b's pods: the peer whose address is confirmed (and the
	// local ones), never the address the forged peer names.
	waitFor(t, "a/db's peers", func() bool {
		r := dp.get("a/db")
		return r != nil && r.Ingress.Isolated && strings.Contains(allows(r.Ingress), "10.0.1.5")
	})
	if got := allows(dp.get("a/db").Ingress); strings.Contains(got, "10.0.1.99") || strings.Contains(got, "10.0.0.1") {
		t.Fatalf("a/db allows %q: a forged address among them", got)
	}
	sctx, scancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer scancel()
	if err := c.WaitPod(sctx, "b", "forged", netip.MustParseAddr("10.0.0.1")); err == nil {
		t.Fatal("WaitPod of the forged address succeeded")
	}
	// The agent learns of a pod's port after the pod's ADD began waiting:
	// the wait asks again and ends once the address is confirmed.
	waited := make(chan error, 1)
	go func() { waited <- c.WaitPod(wctx, "b", "late", netip.MustParseAddr("10.0.0.8")) }()
	mu.Lock()
	ports["late"] = "10.0.0.8"
	mu.Unlock()
	if err := <-waited; err != nil {
		t.Fatal(err)
	}
	if r := dp.get("b/late"); r == nil || r.IP != netip.MustParseAddr("10.0.0.8") {
		t.Fatalf("b/late after its port arrived: %+v", r)
	}
	// The same for a peer, without a waiting ADD: Run asks again.
	mu.Lock()
	ports["latepeer"] = "10.0.1.6"
	mu.Unlock()
	waitFor(t, "the late peer among a/db's", func() bool {
		r := dp.get("a/db")
		return r != nil && strings.Contains(allows(r.Ingress), "10.0.1.6")
	})
}

// runController runs c until the test ends and returns the context it
// runs under.
func runController(t *testing.T, c *Controller) context.Context {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return ctx
}
