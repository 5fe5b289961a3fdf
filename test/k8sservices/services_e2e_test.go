package k8sservices_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"kurma.dev/kurma/internal/agent/nettest"
	"kurma.dev/kurma/internal/kube/kubetest"
	"kurma.dev/kurma/internal/kube/services"
	"kurma.dev/kurma/internal/testutil"
	"kurma.dev/kurma/internal/testutil/kubecluster"
	"kurma.dev/kurma/pkg/controllerapi"
)

const (
	project = "k8s"
	// The external network: the cluster's namespace is its gateway (.1),
	// the outside namespace is .2, floating IPs come from .100-.200.
	extCIDR = "198.51.100.0/24"
	extGW   = "198.51.100.1"
	outside = "198.51.100.2"
	lbIP    = "198.51.100.150"
)

// ask sends "hostname" to addr over network (tcp or udp) from inside
// netnsPath and returns the answer.
func ask(netnsPath, network, addr string) (string, error) {
	var out string
	err := ns.WithNetNSPath(netnsPath, func(ns.NetNS) error {
		c, err := net.DialTimeout(network, addr, time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(time.Second))
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

// answers asks addr until every name in want has answered (all) or, with
// only set, until n answers in a row came from want only.
func answers(t *testing.T, netnsPath, network, addr string, want map[string]bool, only bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	seen := map[string]bool{}
	streak := 0
	var last string
	var lastErr error
	for time.Now().Before(deadline) {
		got, err := ask(netnsPath, network, addr)
		last, lastErr = got, err
		switch {
		case err != nil || !want[got]:
			streak = 0
		default:
			seen[got] = true
			streak++
		}
		if (!only && len(seen) == len(want)) || (only && streak >= 20) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s %s from %s: answered by %v (last %q, %v), want %v (only=%v)", network, addr, netnsPath, seen, last, lastErr, want, only)
}

func names(pods []corev1.Pod) map[string]bool {
	m := map[string]bool{}
	for _, p := range pods {
		m[p.Name] = true
	}
	return m
}

// TestServicesWithoutKubeProxy is the proof on a real cluster.
func TestServicesWithoutKubeProxy(t *testing.T) {
	testutil.RequireRoot(t)
	e, sock := kubetest.StartWithDriver(t, kubecluster.Options{ControllerManager: true, Scheduler: true})
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	kc := e.C.Client

	// The outside: a namespace on the cluster's external interface.
	out := nettest.NewNS(t, testutil.UniqueName("ksvo"))
	ext, peer := testutil.UniqueName("ksx"), testutil.UniqueName("ksx")
	testutil.Run(t, "ip", "link", "add", ext, "netns", filepath.Base(e.C.NetNS), "type", "veth", "peer", "name", peer, "netns", nettest.Name(out))
	testutil.Run(t, "ip", "-n", filepath.Base(e.C.NetNS), "addr", "add", extGW+"/24", "dev", ext)
	testutil.Run(t, "ip", "-n", filepath.Base(e.C.NetNS), "link", "set", ext, "up")
	nettest.IP(t, out, "addr", "add", outside+"/24", "dev", peer)
	nettest.IP(t, out, "link", "set", peer, "up")
	nettest.IP(t, out, "link", "set", "lo", "up")
	if _, err := e.Ctl.CreateExternalNetwork(ctx, controllerapi.ExternalNetwork{ID: "public", CIDR: extCIDR, GatewayIP: extGW,
		AllocationPools: []controllerapi.AllocationPool{{Start: "198.51.100.100", End: "198.51.100.200"}}}); err != nil {
		t.Fatal(err)
	}

	e.StartWatcher("--resync", "10s", "--service-cidr", kubecluster.ServiceCIDR)
	// The second node's namespace and underlay exist before the first
	// agent starts: that agent's underlay address must be one node2 can
	// reach, or the VXLAN from node2 has nowhere to go.
	n2 := secondNodeNS(t, e)
	a := e.StartAgentAt(e.C.NodeName, ul1, sock, "--external-interface", ext, "--service-cidr", kubecluster.ServiceCIDR)
	// Runs before the agent stops (cleanups run last-in first-out): the
	// pods' sandboxes go while the CNI DEL can still reach the agent.
	t.Cleanup(func() {
		cctx, ccancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer ccancel()
		zero := int64(0)
		for _, n := range []string{"svc-a", "svc-b"} {
			_ = kc.AppsV1().Deployments(n).DeleteCollection(cctx, metav1.DeleteOptions{}, metav1.ListOptions{})
			_ = kc.CoreV1().Pods(n).DeleteCollection(cctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{})
			if err := e.C.WaitNoPods(cctx, n, ""); err != nil {
				t.Errorf("pods of %s not gone: %v", n, err)
			}
		}
		waitNoSandboxes(cctx, t, e)
	})

	e.Namespace("svc-a")
	e.Namespace("svc-b")
	if _, err := kc.AppsV1().Deployments("svc-a").Create(ctx, kubetest.Deployment("svc-a", "web", 3), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ports := []corev1.ServicePort{
		{Name: "tcp", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)},
		{Name: "udp", Protocol: corev1.ProtocolUDP, Port: 53, TargetPort: intstr.FromInt32(8080)},
	}
	web, err := kc.CoreV1().Services("svc-a").Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "web"}, Ports: ports}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kc.CoreV1().Pods("svc-b").Create(ctx, kubetest.Pod("svc-b", "client", ""), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	webs, err := e.C.WaitPodsRunning(ctx, "svc-a", "app=web", 3)
	if err != nil {
		t.Fatal(err)
	}
	clients, err := e.C.WaitPodsRunning(ctx, "svc-b", "app=kubetest", 1)
	if err != nil {
		t.Fatal(err)
	}
	client := a.PodNetNS(t, clients[0])
	vip := web.Spec.ClusterIP

	// ClusterIP, TCP and UDP: every backend answers over time.
	answers(t, client, "tcp", net.JoinHostPort(vip, "80"), names(webs), false)
	answers(t, client, "udp", net.JoinHostPort(vip, "53"), names(webs), false)
	t.Logf("clusterIP %s answered by all of %v over TCP and UDP", vip, names(webs))

	// A pod on a second node (its own agent, VXLAN to this one) reaches
	// the Service, answered by all 3 backends.
	fromSecondNode(t, e, ctx, n2, "svc-b", net.JoinHostPort(vip, "80"), names(webs), &webs[0])

	// Scale to 1: only the remaining backend answers.
	sc, err := kc.AppsV1().Deployments("svc-a").GetScale(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sc.Spec.Replicas = 1
	if _, err := kc.AppsV1().Deployments("svc-a").UpdateScale(ctx, "web", sc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	var left []corev1.Pod
	e.Eventually(60*time.Second, "one web pod left", func() error {
		l, err := kc.CoreV1().Pods("svc-a").List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
		if err != nil {
			return err
		}
		if len(l.Items) != 1 || l.Items[0].Status.Phase != corev1.PodRunning {
			return fmt.Errorf("%d pods", len(l.Items))
		}
		left = l.Items
		return nil
	})
	answers(t, client, "tcp", net.JoinHostPort(vip, "80"), names(left), true)
	t.Logf("after scaling to 1 only %s answers", left[0].Name)

	// type LoadBalancer with a requested address, reached from outside.
	lb, err := kc.CoreV1().Services("svc-a").Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web-lb"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, LoadBalancerIP: lbIP,
			Selector: map[string]string{"app": "web"}, Ports: ports[:1]}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	e.Eventually(30*time.Second, "ingress of web-lb", func() error {
		s, err := kc.CoreV1().Services("svc-a").Get(ctx, "web-lb", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if in := s.Status.LoadBalancer.Ingress; len(in) != 1 || in[0].IP != lbIP || in[0].IPMode == nil ||
			*in[0].IPMode != corev1.LoadBalancerIPModeVIP {
			return fmt.Errorf("ingress %+v", in)
		}
		return nil
	})
	answers(t, out, "tcp", net.JoinHostPort(lbIP, "80"), names(left), true)
	t.Logf("LoadBalancer ingress %s answers from outside", lbIP)

	// The node itself (the cluster's namespace: kubelet, hostNetwork
	// pods) reaches the clusterIP; it has no default route, only the
	// agent's route for the service range.
	answers(t, e.C.NetNS, "tcp", net.JoinHostPort(vip, "80"), names(left), true)
	// The LoadBalancer Service's node port answers from outside on the
	// node address (the agent's --underlay-ip, its default node address).
	nettest.IP(t, out, "route", "add", ul1+"/32", "via", extGW)
	lbNow, err := kc.CoreV1().Services("svc-a").Get(ctx, "web-lb", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	np := strconv.Itoa(int(lbNow.Spec.Ports[0].NodePort))
	answers(t, out, "tcp", net.JoinHostPort(ul1, np), names(left), true)
	// A pod reaches the outside (masqueraded to the node's address on the
	// external interface: the outside has no route to the pods).
	nettest.Serve(t, out, net.JoinHostPort(outside, "9000"), "outside")
	if got, err := nettest.Dial(client, net.JoinHostPort(outside, "9000"), 5*time.Second); err != nil || got != "outside" {
		t.Fatalf("pod egress to the outside: %q, %v", got, err)
	}
	t.Logf("node -> clusterIP, outside -> node port %s, pod -> outside: all answered", np)

	// Deleting the Service releases the address.
	if err := kc.CoreV1().Services("svc-a").Delete(ctx, "web-lb", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.Eventually(30*time.Second, "floating IP released", func() error {
		if _, err := e.Ctl.GetFloatingIP(ctx, project, services.LBID(lb.UID)); err == nil {
			return fmt.Errorf("still allocated")
		}
		return nil
	})
}

// waitNoSandboxes waits until the node's containerd holds no container:
// the kubelet removes the sandboxes of deleted pods (CNI DEL) a moment
// after the API objects go.
func waitNoSandboxes(ctx context.Context, t *testing.T, e *kubetest.Env) {
	for ctx.Err() == nil {
		out, err := exec.CommandContext(ctx, "ctr", "-a", e.C.ContainerdSocket, "-n", "k8s.io", "containers", "ls", "-q").Output()
		if err == nil && strings.TrimSpace(string(out)) == "" {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Errorf("sandboxes left after the pods were deleted")
}
