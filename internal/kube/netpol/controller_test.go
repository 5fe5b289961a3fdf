package netpol

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/prometheus/client_golang/prometheus"
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
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
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
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
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
