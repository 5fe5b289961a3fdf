package k8sservices_test

import (
	"context"
	"net"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kurma.dev/kurma/internal/agent/nettest"
	"kurma.dev/kurma/internal/kube/kubetest"
	"kurma.dev/kurma/internal/testutil"
)

// Underlay addresses of the VXLAN between the kubelet's node (the
// cluster's namespace) and the second node.
const (
	ul1 = "10.254.8.1"
	ul2 = "10.254.8.2"
)

// secondNodeNS makes the second node's namespace, joined to the cluster's
// by a veth carrying the underlay.
func secondNodeNS(t *testing.T, e *kubetest.Env) string {
	n2 := nettest.NewNS(t, testutil.UniqueName("ksv2"))
	v1, v2 := testutil.UniqueName("ksu"), testutil.UniqueName("ksu")
	testutil.Run(t, "ip", "link", "add", v1, "netns", filepath.Base(e.C.NetNS), "type", "veth", "peer", "name", v2, "netns", nettest.Name(n2))
	testutil.Run(t, "ip", "-n", filepath.Base(e.C.NetNS), "addr", "add", ul1+"/24", "dev", v1)
	testutil.Run(t, "ip", "-n", filepath.Base(e.C.NetNS), "link", "set", v1, "up")
	nettest.IP(t, n2, "addr", "add", ul2+"/24", "dev", v2)
	nettest.IP(t, n2, "link", "set", v2, "up")
	nettest.IP(t, n2, "link", "set", "lo", "up")
	return n2
}

// fromSecondNode runs a second agent (node2) in n2, plugs a pod of
// namespace podNS into it through cnitool as the runtime would, and checks
// that the pod reaches addr (a Service) and gets answers from every name in
// want.
func fromSecondNode(t *testing.T, e *kubetest.Env, ctx context.Context, n2, podNSName, addr string, want map[string]bool, direct *corev1.Pod) {
	kc := e.C.Client
	if _, err := kc.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node2"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	sock := e.StartRemoteAgent(t, n2, "node2", ul2, "ks2", "kurma-svc-node2")

	p, err := kc.CoreV1().Pods(podNSName).Create(ctx, kubetest.Pod(podNSName, "on-node2", "node2"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	podNS := nettest.NewNS(t, testutil.UniqueName("ksv2p"))
	cnitool := kubetest.Cnitool(t, ctx, sock, podNS, podNSName, "on-node2", "ks2c", string(p.UID))
	if out, err := cnitool("add"); err != nil {
		t.Fatalf("cnitool add: %v: %s", err, out)
	}
	if direct != nil {
		answers(t, podNS, "tcp", net.JoinHostPort(direct.Status.PodIP, "8080"), map[string]bool{direct.Name: true}, false)
		t.Logf("a pod on the second node reaches pod %s directly", direct.Name)
	}
	answers(t, podNS, "tcp", addr, want, false)
	t.Logf("a pod on the second node reaches %s, answered by all of %v", addr, want)
	if out, err := cnitool("del"); err != nil {
		t.Fatalf("cnitool del: %v: %s", err, out)
	}
	if err := kc.CoreV1().Pods(podNSName).Delete(ctx, "on-node2", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
}
