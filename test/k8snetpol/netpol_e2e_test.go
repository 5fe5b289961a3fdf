package k8snetpol_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"kurma.dev/kurma/internal/agent/policypath"
	"kurma.dev/kurma/internal/kube/kubetest"
	"kurma.dev/kurma/internal/kube/netpol"
	"kurma.dev/kurma/internal/testutil"
	"kurma.dev/kurma/internal/testutil/kubecluster"
)

// ask sends "hostname" to addr over network from inside netnsPath and
// returns the answer.
func ask(netnsPath, network, addr string) (string, error) {
	var out string
	err := ns.WithNetNSPath(netnsPath, func(ns.NetNS) error {
		c, err := net.DialTimeout(network, addr, 700*time.Millisecond)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(700 * time.Millisecond))
		if _, err := io.WriteString(c, "hostname\n"); err != nil {
			return err
		}
		if network == "udp" {
			b := make([]byte, 256)
			n, err := c.Read(b)
			out = string(b[:n])
			return err
		}
		out, err = bufio.NewReader(c).ReadString('\n')
		return err
	})
	return strings.TrimSpace(out), err
}

// probe is one expected reachability: from a pod's namespace to addr.
type probe struct {
	from, network, addr, name string // name: the server's hostname
	ok                        bool
}

func (p probe) String() string {
	return fmt.Sprintf("%s -> %s %s (%s)", p.from, p.network, p.addr, map[bool]string{true: "allowed", false: "denied"}[p.ok])
}

// expect waits until every probe gives its expected result at once.
func expect(t *testing.T, step string, nsOf map[string]string, probes ...probe) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var bad []string
		for _, p := range probes {
			got, err := ask(nsOf[p.from], p.network, p.addr)
			if ok := err == nil && got == p.name; ok != p.ok {
				bad = append(bad, fmt.Sprintf("%v: got %q %v", p, got, err))
			}
		}
		if len(bad) == 0 {
			t.Logf("%s: %d probes as expected", step, len(probes))
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s:\n%s", step, strings.Join(bad, "\n"))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func ptr[T any](v T) *T { return &v }

func sel(kv ...string) *metav1.LabelSelector {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return &metav1.LabelSelector{MatchLabels: m}
}

func server(ns, name, node string, labels map[string]string) *corev1.Pod {
	p := kubetest.Pod(ns, name, node)
	p.Labels = labels
	p.Spec.Containers[0].Ports = []corev1.ContainerPort{
		{Name: "echo", ContainerPort: 8080, Protocol: corev1.ProtocolTCP},
		{Name: "echo-udp", ContainerPort: 8080, Protocol: corev1.ProtocolUDP}}
	return p
}

// TestNetworkPolicy is the proof on a real cluster: allow and
// deny for ingress and egress, namespaceSelector with podSelector,
// ipBlock with except, a named port, endPort, through a clusterIP; a new
// pod is protected from its first packet; after kill -9 of the agent
// while policies change, the kernel's sets equal what the API asks.
func TestNetworkPolicy(t *testing.T) {
	testutil.RequireRoot(t)
	e, sock := kubetest.StartWithDriver(t, kubecluster.Options{ControllerManager: true})
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	kc := e.C.Client
	node := e.C.NodeName
	e.StartWatcher("--resync", "10s", "--service-cidr", kubecluster.ServiceCIDR)
	// The agent's underlay (and node) address must exist in the node's
	// namespace: the service range's route uses it as source.
	testutil.Run(t, "ip", "-n", filepath.Base(e.C.NetNS), "addr", "add", "10.254.9.1/32", "dev", "lo")
	a := e.StartAgentAt(node, "10.254.9.1", sock, "--service-cidr", kubecluster.ServiceCIDR)
	nsA, nsB := "npa", "npb"
	t.Cleanup(func() {
		cctx, ccancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer ccancel()
		zero := int64(0)
		for _, n := range []string{nsA, nsB} {
			_ = kc.CoreV1().Pods(n).DeleteCollection(cctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{})
			if err := e.C.WaitNoPods(cctx, n, ""); err != nil {
				t.Errorf("pods of %s not gone: %v", n, err)
			}
		}
	})
	for n, team := range map[string]string{nsA: "a", nsB: "b"} {
		if _, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n,
			Labels: map[string]string{"team": team}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	pods := []*corev1.Pod{
		server(nsA, "server", node, map[string]string{"app": "server"}),
		server(nsA, "client", node, map[string]string{"app": "client"}),
		server(nsB, "client", node, map[string]string{"app": "client"}),
		server(nsB, "other", node, map[string]string{"app": "other"}),
	}
	for _, p := range pods {
		if _, err := kc.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	svc, err := kc.CoreV1().Services(nsA).Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "server"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "server"}, Ports: []corev1.ServicePort{
			{Name: "tcp", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	nsOf := map[string]string{}
	ipOf := map[string]string{}
	for _, n := range []string{nsA, nsB} {
		running, err := e.C.WaitPodsRunning(ctx, n, "", 2)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range running {
			nsOf[n+"/"+p.Name] = a.PodNetNS(t, p)
			ipOf[n+"/"+p.Name] = p.Status.PodIP
		}
	}
	srv := net.JoinHostPort(ipOf["npa/server"], "8080")
	vip := net.JoinHostPort(svc.Spec.ClusterIP, "80")
	to := func(from string, ok bool) probe { return probe{from, "tcp", srv, "server", ok} }
	expect(t, "no policy", nsOf, to("npa/client", true), to("npb/client", true), to("npb/other", true),
		probe{"npb/other", "tcp", vip, "server", true})

	np := kc.NetworkingV1().NetworkPolicies(nsA)
	// Ingress: clients of its own namespace and of team b, on the named
	// port.
	in := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "server-in"},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "server"),
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From: []networkingv1.NetworkPolicyPeer{{PodSelector: sel("app", "client")},
					{NamespaceSelector: sel("team", "b"), PodSelector: sel("app", "client")}},
				Ports: []networkingv1.NetworkPolicyPort{{Port: ptr(intstr.FromString("echo"))}}}}}}
	if _, err := np.Create(ctx, in, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	expect(t, "ingress by selectors and named port", nsOf, to("npa/client", true), to("npb/client", true), to("npb/other", false),
		probe{"npb/client", "tcp", vip, "server", true}, probe{"npb/other", "tcp", vip, "server", false},
		probe{"npb/client", "udp", srv, "server", false})

	// ipBlock with except and an endPort range.
	in.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{
		From: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "0.0.0.0/0",
			Except: []string{ipOf["npb/client"] + "/32"}}}},
		Ports: []networkingv1.NetworkPolicyPort{{Port: ptr(intstr.FromInt32(8000)), EndPort: ptr(int32(8100))}}}}
	cur, err := np.Get(ctx, "server-in", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cur.Spec = in.Spec
	if _, err := np.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	expect(t, "ipBlock except, endPort", nsOf, to("npa/client", true), to("npb/client", false), to("npb/other", true),
		probe{"npb/other", "tcp", vip, "server", true})
	if err := np.Delete(ctx, "server-in", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	// Egress of npb/other: only UDP to the server.
	eg := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "other-out"},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "other"),
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
			Egress: []networkingv1.NetworkPolicyEgressRule{{
				To:    []networkingv1.NetworkPolicyPeer{{NamespaceSelector: sel("team", "a"), PodSelector: sel("app", "server")}},
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: ptr(corev1.ProtocolUDP), Port: ptr(intstr.FromString("echo-udp"))}}}}}}
	if _, err := kc.NetworkingV1().NetworkPolicies(nsB).Create(ctx, eg, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	expect(t, "egress", nsOf, to("npb/other", false), probe{"npb/other", "udp", srv, "server", true},
		probe{"npb/other", "tcp", vip, "server", false}, to("npb/client", true),
		probe{"npb/other", "tcp", net.JoinHostPort(ipOf["npa/client"], "8080"), "client", false})
	if err := kc.NetworkingV1().NetworkPolicies(nsB).Delete(ctx, "other-out", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	// No window at pod start: a deny-all for app=late exists before the
	// pod; its very first probe once Running is denied.
	if _, err := np.Create(ctx, &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "late-deny"},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "late")}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := kc.CoreV1().Pods(nsA).Create(ctx, server(nsA, "late", node, map[string]string{"app": "late"}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	late := waitRunning(ctx, t, kc, nsA, "late")
	if got, err := ask(nsOf["npa/client"], "tcp", net.JoinHostPort(late.Status.PodIP, "8080")); err == nil {
		t.Fatalf("a new pod under a deny-all answered its first probe: %q", got)
	}
	t.Log("a new pod under a deny-all policy refused its first probe")

	// kill -9 of the agent while policies change: after restart the
	// kernel's sets equal what the API asks.
	a.Proc.Kill()
	<-a.Proc.Done()
	for i := range 5 {
		p := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("churn-%d", i)},
			Spec: networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "client"),
				Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{
					{NamespaceSelector: sel(), PodSelector: sel("app", "server")}},
					Ports: []networkingv1.NetworkPolicyPort{{Port: ptr(intstr.FromInt32(int32(9000 + i)))}}}}}}
		if _, err := np.Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := np.Delete(ctx, "late-deny", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.RestartAgent(a)
	for i := range 3 { // and while it starts
		if err := np.Delete(ctx, fmt.Sprintf("churn-%d", i), metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	pp, err := policypath.New(ctx, policypath.Config{HostNS: e.C.NetNS, Table: a.NFT})
	if err != nil {
		t.Fatal(err)
	}
	defer pp.Close()
	var want, got []string
	e.Eventually(30*time.Second, "kernel equals the API", func() error {
		want, err = fromAPI(ctx, kc, node)
		if err != nil {
			return err
		}
		if got, err = pp.Kernel(); err != nil {
			return err
		}
		if !slices.Equal(got, want) {
			return fmt.Errorf("kernel %d elements, API %d", len(got), len(want))
		}
		return nil
	})
	if len(want) == 0 {
		t.Fatal("the API asks for no element: the check proves nothing")
	}
	t.Logf("after kill -9 the kernel holds exactly the %d elements the API asks for", len(want))
	expect(t, "after restart", nsOf, to("npb/other", true),
		probe{"npb/other", "tcp", net.JoinHostPort(ipOf["npa/client"], "8080"), "client", false},
		probe{"npa/server", "tcp", net.JoinHostPort(late.Status.PodIP, "8080"), "late", true})
}

func waitRunning(ctx context.Context, t *testing.T, kc kubernetes.Interface, ns, name string) *corev1.Pod {
	t.Helper()
	for {
		p, err := kc.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err == nil && p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" {
			return p
		}
		select {
		case <-ctx.Done():
			t.Fatalf("pod %s/%s not running: %v", ns, name, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// fromAPI computes, from the API's objects, the elements node's agent
// must program.
func fromAPI(ctx context.Context, kc kubernetes.Interface, node string) ([]string, error) {
	eng := netpol.NewEngine(node)
	nss, err := kc.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	for _, n := range nss.Items {
		eng.SetNamespace(n.Name, n.Labels)
	}
	pods, err := kc.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	for i := range pods.Items {
		eng.SetPod(netpol.PodFrom(&pods.Items[i]))
	}
	nps, err := kc.NetworkingV1().NetworkPolicies("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	for i := range nps.Items {
		_ = eng.SetPolicy(&nps.Items[i])
	}
	eng.Compute()
	return policypath.Want(netpol.PathRules(eng.All())), nil
}
