package k8snetpol_test

import (
	"context"
	"net"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"kurma.dev/kurma/internal/kube/kubetest"
	"kurma.dev/kurma/internal/testutil"
	"kurma.dev/kurma/internal/testutil/kubecluster"
)

// TestNetworkPolicyTwoNodes proves that policy holds for traffic that
// crossed the overlay: two real nodes (each its own kubelet, containerd,
// network namespace and agent, VXLAN between them), clients on the first,
// servers on the second. An ingress policy enforced by the second node's
// agent allows one client of the first node and denies the other, both
// to the pod's address and through a clusterIP (translated on the
// client's node, so the policy meets the backend's address); an egress
// policy enforced by the first node's agent allows one pod of the second
// node and denies another, again directly and through the clusterIP.
func TestNetworkPolicyTwoNodes(t *testing.T) {
	testutil.RequireRoot(t)
	e, sock := kubetest.StartWithDriver(t, kubecluster.Options{ControllerManager: true, Nodes: 2})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	kc := e.C.Client
	n1, n2 := e.C.Nodes[0], e.C.Nodes[1]
	e.StartWatcher("--resync", "10s", "--service-cidr", kubecluster.ServiceCIDR)
	e.StartAgentAt(n1.Name, n1.IP, sock, "--service-cidr", kubecluster.ServiceCIDR)
	e.StartAgentOn(n2, sock, "--service-cidr", kubecluster.ServiceCIDR)
	const nsName = "np2n"
	t.Cleanup(func() {
		cctx, ccancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer ccancel()
		zero := int64(0)
		_ = kc.CoreV1().Pods(nsName).DeleteCollection(cctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{})
		if err := e.C.WaitNoPods(cctx, nsName, ""); err != nil {
			t.Errorf("pods of %s not gone: %v", nsName, err)
		}
	})
	if _, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: nsName}},
		metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pods := []*corev1.Pod{
		server(nsName, "server", n2.Name, map[string]string{"app": "server"}),
		server(nsName, "other", n2.Name, map[string]string{"app": "other"}),
		server(nsName, "ok", n1.Name, map[string]string{"app": "ok"}),
		server(nsName, "no", n1.Name, map[string]string{"app": "no"}),
	}
	for _, p := range pods {
		if _, err := kc.CoreV1().Pods(nsName).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	svc, err := kc.CoreV1().Services(nsName).Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "server"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "server"}, Ports: []corev1.ServicePort{
			{Name: "tcp", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	running, err := e.C.WaitPodsRunning(ctx, nsName, "", len(pods))
	if err != nil {
		t.Fatal(err)
	}
	nsOf, ipOf := map[string]string{}, map[string]string{}
	for _, p := range running {
		if p.Name == "server" || p.Name == "other" {
			if p.Spec.NodeName != n2.Name {
				t.Fatalf("pod %s runs on %s", p.Name, p.Spec.NodeName)
			}
		}
		if nsOf[p.Name], err = e.C.PodNetNS(&p); err != nil {
			t.Fatal(err)
		}
		ipOf[p.Name] = p.Status.PodIP
	}
	srv := net.JoinHostPort(ipOf["server"], "8080")
	oth := net.JoinHostPort(ipOf["other"], "8080")
	vip := net.JoinHostPort(svc.Spec.ClusterIP, "80")
	tcp := func(from, addr, name string, ok bool) probe { return probe{from, "tcp", addr, name, ok} }
	expect(t, "no policy, across the overlay", nsOf, tcp("ok", srv, "server", true), tcp("no", srv, "server", true),
		tcp("ok", vip, "server", true), tcp("no", vip, "server", true), tcp("ok", oth, "other", true))

	np := kc.NetworkingV1().NetworkPolicies(nsName)
	// Ingress of the second node's server: only app=ok, on the named port.
	if _, err := np.Create(ctx, &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "server-in"},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "server"),
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{PodSelector: sel("app", "ok")}},
				Ports: []networkingv1.NetworkPolicyPort{{Port: ptr(intstr.FromString("echo"))}}}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	expect(t, "ingress on node 2 from node 1", nsOf, tcp("ok", srv, "server", true), tcp("no", srv, "server", false),
		tcp("ok", vip, "server", true), tcp("no", vip, "server", false), tcp("no", oth, "other", true),
		probe{"ok", "udp", srv, "server", false})

	// Egress of the first node's app=no: only to app=other of node 2.
	if _, err := np.Create(ctx, &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "no-out"},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "no"),
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
			Egress: []networkingv1.NetworkPolicyEgressRule{{
				To:    []networkingv1.NetworkPolicyPeer{{PodSelector: sel("app", "other")}},
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: ptr(corev1.ProtocolTCP), Port: ptr(intstr.FromInt32(8080))}}}}}},
		metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Let the server admit app=no again: only the egress policy of node 1
	// can now stop it.
	if err := np.Delete(ctx, "server-in", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	expect(t, "egress on node 1 to node 2", nsOf, tcp("no", oth, "other", true), tcp("no", srv, "server", false),
		tcp("no", vip, "server", false), tcp("ok", srv, "server", true), tcp("ok", vip, "server", true),
		probe{"no", "udp", oth, "other", false})
	if err := np.Delete(ctx, "no-out", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	expect(t, "no policy again", nsOf, tcp("no", srv, "server", true), tcp("no", vip, "server", true))
}
