package k8se2e_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kurma.dev/kurma/internal/agent/nettest"
	"kurma.dev/kurma/internal/kube/kubetest"
	"kurma.dev/kurma/internal/kube/podports"
	"kurma.dev/kurma/internal/testutil"
	"kurma.dev/kurma/internal/testutil/kubecluster"
	"kurma.dev/kurma/pkg/controllerapi"
)

const project = "k8s"

// underlay addresses of the VXLAN between the kubelet's node (the
// cluster's namespace) and the second node.
const (
	ul1 = "10.254.7.1"
	ul2 = "10.254.7.2"
)

// askHostname connects from inside netns to addr (an echo server) and
// returns its answer to "hostname".
func askHostname(netnsPath, addr string) (string, error) {
	var out string
	err := ns.WithNetNSPath(netnsPath, func(ns.NetNS) error {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := io.WriteString(c, "hostname\n"); err != nil {
			return err
		}
		out, err = bufio.NewReader(c).ReadString('\n')
		return err
	})
	return strings.TrimSpace(out), err
}

func reachPod(t *testing.T, fromNetNS string, to corev1.Pod) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		got, err := askHostname(fromNetNS, net.JoinHostPort(to.Status.PodIP, "8080"))
		if err == nil && got == to.Name {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s cannot reach pod %s/%s at %s: %q, %v", fromNetNS, to.Namespace, to.Name, to.Status.PodIP, got, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestKubernetesPodNetworking is the end-to-end proof.
func TestKubernetesPodNetworking(t *testing.T) {
	testutil.RequireRoot(t)
	e, sock := kubetest.StartWithDriver(t, kubecluster.Options{ControllerManager: true, Scheduler: true})
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	kc := e.C.Client

	// The second node's namespace, joined to the cluster's by a veth.
	n2 := nettest.NewNS(t, testutil.UniqueName("ke2e"))
	veth1, veth2 := testutil.UniqueName("ke"), testutil.UniqueName("ke")
	testutil.Run(t, "ip", "link", "add", veth1, "netns", filepath.Base(e.C.NetNS), "type", "veth", "peer", "name", veth2, "netns", nettest.Name(n2))
	testutil.Run(t, "ip", "-n", filepath.Base(e.C.NetNS), "addr", "add", ul1+"/24", "dev", veth1)
	testutil.Run(t, "ip", "-n", filepath.Base(e.C.NetNS), "link", "set", veth1, "up")
	nettest.IP(t, n2, "addr", "add", ul2+"/24", "dev", veth2)
	nettest.IP(t, n2, "link", "set", veth2, "up")

	e.StartWatcher("--resync", "10s")
	a1 := e.StartAgentAt(e.C.NodeName, ul1, sock)
	// Before the agent stops (cleanups run last-registered first), the
	// kubelet tears every sandbox down through it.
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		_ = kc.CoreV1().Namespaces().Delete(cctx, "e2e-a", metav1.DeleteOptions{})
		for cctx.Err() == nil {
			ps, err := kc.CoreV1().Pods("").List(cctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + e.C.NodeName})
			// Pods leave the API before the kubelet stops their sandboxes;
			// each sandbox's DEL removes its attachment record.
			recs, _ := os.ReadDir(filepath.Join(a1.StateDir, "k8s"))
			if err == nil && len(ps.Items) == 0 && len(recs) == 0 {
				return
			}
			time.Sleep(200 * time.Millisecond)
		}
		t.Errorf("pods of the node not gone before the agent stops")
	})

	nsA, nsB := e.Namespace("e2e-a"), e.Namespace("e2e-b")
	if _, err := kc.AppsV1().Deployments("e2e-a").Create(ctx, kubetest.Deployment("e2e-a", "web", 3), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	client := kubetest.Pod("e2e-b", "client", "")
	if _, err := kc.CoreV1().Pods("e2e-b").Create(ctx, client, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	webs, err := e.C.WaitPodsRunning(ctx, "e2e-a", "app=web", 3)
	if err != nil {
		t.Fatal(err)
	}
	bs, err := e.C.WaitPodsRunning(ctx, "e2e-b", "app=kubetest", 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("3+1 pods Running after %s", time.Since(start))

	// Pod IPs: in their namespace's subnet, shown by the API, equal to
	// the annotation.
	snA, err := e.Ctl.GetSubnet(ctx, project, podports.SubnetID(nsA.UID))
	if err != nil {
		t.Fatal(err)
	}
	snB, err := e.Ctl.GetSubnet(ctx, project, podports.SubnetID(nsB.UID))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		pods []corev1.Pod
		sn   *controllerapi.Subnet
	}{{webs, snA}, {bs, snB}} {
		pfx := netip.MustParsePrefix(c.sn.CIDR)
		for _, p := range c.pods {
			n, err := kubetest.Annotation(&p)
			if err != nil {
				t.Fatal(err)
			}
			ip := netip.MustParseAddr(p.Status.PodIP)
			if !pfx.Contains(ip) || n.Prefixes()[0].Addr() != ip {
				t.Fatalf("pod %s/%s IP %s: want the annotation's %v inside %s", p.Namespace, p.Name, ip, n.IPs, pfx)
			}
		}
	}
	out, err := e.C.Kubectl(ctx, "get", "pod", "-A", "-o", "wide")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range append(append([]corev1.Pod(nil), webs...), bs...) {
		if !strings.Contains(out, p.Status.PodIP) {
			t.Fatalf("kubectl get pod -o wide does not show %s:\n%s", p.Status.PodIP, out)
		}
	}

	// TCP between namespaces, both ways.
	clientNS := a1.PodNetNS(t, bs[0])
	for _, w := range webs {
		reachPod(t, clientNS, w)
		reachPod(t, a1.PodNetNS(t, w), bs[0])
	}

	// The second node: an agent in its own namespace, a pod created on it
	// through cnitool with CNI_ARGS, reaching the kubelet's pods over VXLAN.
	secondNode(t, e, ctx, n2, webs)

	// Deleting the Deployment leaves no port in namespace A.
	if err := kc.AppsV1().Deployments("e2e-a").Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := e.C.WaitNoPods(ctx, "e2e-a", "app=web"); err != nil {
		t.Fatal(err)
	}
	e.Eventually(30*time.Second, "no ports in e2e-a", func() error {
		ps, err := e.Ctl.ListPorts(ctx, project, controllerapi.PortFilter{NetworkID: snA.ID})
		if err != nil {
			return err
		}
		if len(ps) != 0 {
			return fmt.Errorf("%d ports left", len(ps))
		}
		return nil
	})

	// Deleting namespace B removes its subnet.
	if err := kc.CoreV1().Namespaces().Delete(ctx, "e2e-b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.Eventually(90*time.Second, "subnet of e2e-b deleted", func() error {
		if _, err := e.Ctl.GetSubnet(ctx, project, snB.ID); err == nil {
			return fmt.Errorf("subnet %s still there", snB.ID)
		}
		return nil
	})

	// kill -9 of the watcher during a rollout of 30 pods.
	rollout(t, e, ctx)
}

// rollout creates a Deployment of 30, kills every running watcher with
// SIGKILL once some pods exist, starts a new one, and checks every pod ends
// Running with exactly one port.
func rollout(t *testing.T, e *kubetest.Env, ctx context.Context) {
	kc := e.C.Client
	if _, err := kc.AppsV1().Deployments("e2e-a").Create(ctx, kubetest.Deployment("e2e-a", "roll", 30), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.Eventually(60*time.Second, "rollout under way", func() error {
		ps, err := kc.CoreV1().Pods("e2e-a").List(ctx, metav1.ListOptions{LabelSelector: "app=roll"})
		if err != nil {
			return err
		}
		if len(ps.Items) < 10 {
			return fmt.Errorf("%d pods so far", len(ps.Items))
		}
		return nil
	})
	for _, p := range e.Watchers {
		select {
		case <-p.Done():
		default:
			if err := syscall.Kill(p.PID(), syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			<-p.Done()
		}
	}
	t.Log("watcher killed with SIGKILL during the rollout")
	e.StartWatcher("--resync", "10s")
	start := time.Now()
	pods, err := e.C.WaitPodsRunning(ctx, "e2e-a", "app=roll", 30)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("30 pods Running %s after the restart", time.Since(start))
	e.Eventually(30*time.Second, "exactly one port per pod", func() error {
		byDev, err := e.PortsByDevice(project)
		if err != nil {
			return err
		}
		for _, p := range pods {
			if len(byDev[string(p.UID)]) != 1 {
				return fmt.Errorf("pod %s has %d ports", p.Name, len(byDev[string(p.UID)]))
			}
		}
		return nil
	})
}

// secondNode runs a second agent in its own namespace n2 and a pod on it
// made through cnitool, and checks it reaches the kubelet's pods.
func secondNode(t *testing.T, e *kubetest.Env, ctx context.Context, n2 string, webs []corev1.Pod) {
	kc := e.C.Client
	if _, err := kc.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node2"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	sock := e.StartRemoteAgent(t, n2, "node2", ul2, "kn2", "kurma-e2e-node2")

	p, err := kc.CoreV1().Pods("e2e-a").Create(ctx, kubetest.Pod("e2e-a", "on-node2", "node2"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	podNS := nettest.NewNS(t, testutil.UniqueName("ke2p"))
	cnitool := kubetest.Cnitool(t, ctx, sock, podNS, "e2e-a", "on-node2", "n2c", string(p.UID))
	out, err := cnitool("add")
	if err != nil {
		t.Fatalf("cnitool add: %v: %s", err, out)
	}
	n, err := kubetest.Annotation(mustGet(t, e, "e2e-a", "on-node2"))
	if err != nil || n.HostID != "node2" || !strings.Contains(out, strings.Split(n.IPs[0], "/")[0]) {
		t.Fatalf("cnitool add result %s, annotation %+v, %v", out, n, err)
	}
	for _, w := range webs {
		reachPod(t, podNS, w)
	}
	if out, err := cnitool("del"); err != nil {
		t.Fatalf("cnitool del: %v: %s", err, out)
	}
	if got := nettest.Links(t, podNS); len(got) != 1 {
		t.Fatalf("after DEL the node2 pod has links %v", got)
	}
	if err := kc.CoreV1().Pods("e2e-a").Delete(ctx, "on-node2", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
}

func mustGet(t *testing.T, e *kubetest.Env, ns, name string) *corev1.Pod {
	t.Helper()
	p, err := e.C.Client.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}
