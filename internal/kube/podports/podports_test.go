package podports_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"kurma.dev/kurma/internal/kube/kubetest"
	"kurma.dev/kurma/internal/kube/podnet"
	"kurma.dev/kurma/internal/kube/podports"
	"kurma.dev/kurma/internal/testutil/kubecluster"
	"kurma.dev/kurma/pkg/controllerapi"
)

const project = "k8s"

func node(t *testing.T, e *kubetest.Env, name, hostID string) {
	t.Helper()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if hostID != "" {
		n.Annotations = map[string]string{podnet.HostIDAnnotation: hostID}
	}
	if _, err := e.C.Client.CoreV1().Nodes().Create(context.Background(), n, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func createPod(t *testing.T, e *kubetest.Env, p *corev1.Pod) *corev1.Pod {
	t.Helper()
	out, err := e.C.Client.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func deletePod(t *testing.T, e *kubetest.Env, ns, name string) {
	t.Helper()
	err := e.C.Client.CoreV1().Pods(ns).Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
}

func subnetOf(t *testing.T, e *kubetest.Env, ns *corev1.Namespace) *controllerapi.Subnet {
	t.Helper()
	var sn *controllerapi.Subnet
	e.Eventually(10*time.Second, "subnet of "+ns.Name, func() error {
		var err error
		sn, err = e.Ctl.GetSubnet(context.Background(), project, podports.SubnetID(ns.UID))
		return err
	})
	return sn
}

// TestPodsNamespacesNodes runs the watcher against a real API server (no
// node: pods are bound to Node objects by hand) and a real controller.
func TestPodsNamespacesNodes(t *testing.T) {
	e := kubetest.Start(t, kubecluster.Options{NoNode: true})
	node(t, e, "n1", "")
	node(t, e, "n2", "host-two")
	e.StartWatcher("--pool", "10.48.0.0/12", "--resync", "2s")
	ctx := context.Background()

	nsA, nsB := e.Namespace("wt-a"), e.Namespace("wt-b")
	snA, snB := subnetOf(t, e, nsA), subnetOf(t, e, nsB)
	pa, pb := netip.MustParsePrefix(snA.CIDR), netip.MustParsePrefix(snB.CIDR)
	pool := netip.MustParsePrefix("10.48.0.0/12")
	if pa.Bits() != 16 || pb.Bits() != 16 || pa.Overlaps(pb) || !pool.Contains(pa.Addr()) || !pool.Contains(pb.Addr()) {
		t.Fatalf("namespace subnets %s and %s: want distinct /16s of %s", pa, pb, pool)
	}

	a1 := createPod(t, e, kubetest.Pod("wt-a", "a1", "n1"))
	b1 := createPod(t, e, kubetest.Pod("wt-b", "b1", "n2"))
	hostNet := kubetest.Pod("wt-a", "hostnet", "n1")
	hostNet.Spec.HostNetwork = true
	createPod(t, e, hostNet)
	createPod(t, e, kubetest.Pod("wt-a", "unscheduled", ""))

	_, na := e.WaitAnnotated("wt-a", "a1", 10*time.Second)
	_, nb := e.WaitAnnotated("wt-b", "b1", 10*time.Second)
	for _, c := range []struct {
		n      podnet.Network
		pfx    netip.Prefix
		host   string
		uid    string
		subnet string
	}{{na, pa, "n1", string(a1.UID), snA.ID}, {nb, pb, "host-two", string(b1.UID), snB.ID}} {
		ip := c.n.Prefixes()[0]
		if !c.pfx.Contains(ip.Addr()) || ip.Bits() != c.pfx.Bits() || c.n.HostID != c.host || c.n.SubnetID != c.subnet ||
			c.n.PortID != podports.PortID(metav1UID(c.uid)) || len(c.n.Gateways) != 1 {
			t.Fatalf("annotation %+v: want an address in %s, host %s, subnet %s", c.n, c.pfx, c.host, c.subnet)
		}
		p, err := e.Ctl.GetPort(ctx, project, c.n.PortID)
		if err != nil || p.MACAddress != c.n.MAC || p.BindingHostID != c.host || p.DeviceID != c.uid {
			t.Fatalf("port %s: %+v, %v", c.n.PortID, p, err)
		}
	}
	// Its /metrics counts the pod syncs; /healthz answers.
	for path, want := range map[string]string{
		"/metrics": `kurma_k8s_watcher_sync_duration_seconds_count{kind="pod",result="ok"}`,
		"/healthz": "ok",
	} {
		body := get(t, e, "http://127.0.0.1:9698"+path)
		if !strings.Contains(body, want) {
			t.Fatalf("GET %s lacks %q:\n%s", path, want, body)
		}
	}
	// Neither the hostNetwork pod nor the unscheduled one gets a port.
	byDev, err := e.PortsByDevice(project)
	if err != nil || len(byDev) != 2 {
		t.Fatalf("ports by pod: %v, want exactly a1's and b1's", byDev)
	}

	// A pod recreated under the same name (StatefulSet style) gets a new
	// port; the old UID's port goes.
	deletePod(t, e, "wt-a", "a1")
	e.Eventually(10*time.Second, "old port of a1 deleted", func() error {
		if _, err := e.Ctl.GetPort(ctx, project, na.PortID); err == nil {
			return fmt.Errorf("port %s still there", na.PortID)
		}
		return nil
	})
	a1b := createPod(t, e, kubetest.Pod("wt-a", "a1", "n1"))
	_, na2 := e.WaitAnnotated("wt-a", "a1", 10*time.Second)
	if na2.PortID == na.PortID || na2.PodUID != string(a1b.UID) {
		t.Fatalf("recreated a1 got %+v, old %+v", na2, na)
	}

	// A port deleted behind the watcher's back comes back at the resync,
	// and a stray port of a UID that has no pod goes.
	stray, err := e.Ctl.CreatePort(ctx, project, controllerapi.Port{ID: "pod-0000-stray", NetworkID: snA.ID,
		DeviceID: "0000-stray", DeviceOwner: podports.Owner, BindingHostID: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	e.Eventually(10*time.Second, "stray port collected", func() error {
		if _, err := e.Ctl.GetPort(ctx, project, stray.ID); err == nil {
			return fmt.Errorf("stray port %s still there", stray.ID)
		}
		return nil
	})

	// The host id of b1's node changes (its agent restarted with
	// another): b1's port is rebound in place, keeping the address and MAC
	// its sandbox was plugged with, and its annotation names the new host.
	// (The port used to be recreated with a new address.)
	n2, err := e.C.Client.CoreV1().Nodes().Get(ctx, "n2", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n2.Annotations[podnet.HostIDAnnotation] = "host-three"
	if _, err := e.C.Client.CoreV1().Nodes().Update(ctx, n2, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.Eventually(10*time.Second, "b1's port and annotation on host-three", func() error {
		p, err := e.Ctl.GetPort(ctx, project, nb.PortID)
		if err != nil {
			return err
		}
		if p.BindingHostID != "host-three" {
			return fmt.Errorf("port bound to %s", p.BindingHostID)
		}
		pod, err := e.C.Client.CoreV1().Pods("wt-b").Get(ctx, "b1", metav1.GetOptions{})
		if err != nil {
			return err
		}
		nets, err := podnet.Decode(pod.Annotations[podnet.Annotation])
		if err != nil {
			return err
		}
		if n, _ := nets.Default(); n.HostID != "host-three" {
			return fmt.Errorf("annotation names host %s", n.HostID)
		}
		return nil
	})
	if p, err := e.Ctl.GetPort(ctx, project, nb.PortID); err != nil || p.MACAddress != nb.MAC ||
		len(p.FixedIPs) != 1 || p.FixedIPs[0].IPAddress != nb.Prefixes()[0].Addr().String() {
		t.Fatalf("rebound port %+v (%v): want MAC %s and address %s kept", p, err, nb.MAC, nb.Prefixes()[0].Addr())
	}

	// A finished pod gives its port back.
	p, err := e.C.Client.CoreV1().Pods("wt-b").Get(ctx, "b1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Status.Phase = corev1.PodSucceeded
	if _, err := e.C.Client.CoreV1().Pods("wt-b").UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.Eventually(10*time.Second, "finished pod's port deleted", func() error {
		if _, err := e.Ctl.GetPort(ctx, project, nb.PortID); err == nil {
			return fmt.Errorf("port %s still there", nb.PortID)
		}
		return nil
	})

	// Deleting a namespace removes its subnet once its pods are gone.
	if err := e.C.Client.CoreV1().Namespaces().Delete(ctx, "wt-b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	deletePod(t, e, "wt-b", "b1")
	e.Eventually(15*time.Second, "subnet of wt-b deleted", func() error {
		if _, err := e.Ctl.GetSubnet(ctx, project, snB.ID); err == nil {
			return fmt.Errorf("subnet %s still there", snB.ID)
		}
		return nil
	})
	if _, err := e.Ctl.GetSubnet(ctx, project, snA.ID); err != nil {
		t.Fatalf("subnet of wt-a: %v", err)
	}
}

func metav1UID(s string) types.UID { return types.UID(s) }

// get fetches url from inside the cluster's namespace (where the watcher
// runs) and returns the body of a 200.
func get(t *testing.T, e *kubetest.Env, url string) string {
	t.Helper()
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: e.C.DialContext}}
	resp, err := hc.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s, %v: %s", url, resp.Status, err, b)
	}
	return string(b)
}

// TestKill9Converges kills the watcher with SIGKILL while it works through
// 30 pods, some of which are deleted meanwhile; a restarted watcher leaves
// exactly one port per live pod and none for the deleted ones.
func TestKill9Converges(t *testing.T) {
	e := kubetest.Start(t, kubecluster.Options{NoNode: true})
	node(t, e, "n1", "")
	e.Namespace("wt-k")
	w := e.StartWatcher("--resync", "3s")
	ctx := context.Background()
	for i := range 30 {
		createPod(t, e, kubetest.Pod("wt-k", fmt.Sprintf("p%02d", i), "n1"))
		if i == 12 {
			if err := syscall.Kill(w.PID(), syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
		}
	}
	<-w.Done()
	for i := range 5 { // deleted while no watcher runs
		deletePod(t, e, "wt-k", fmt.Sprintf("p%02d", i))
	}
	e.StartWatcher("--resync", "3s")
	e.Eventually(30*time.Second, "one port per live pod", func() error {
		pods, err := e.C.Client.CoreV1().Pods("wt-k").List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		byDev, err := e.PortsByDevice(project)
		if err != nil {
			return err
		}
		if len(byDev) != len(pods.Items) {
			return fmt.Errorf("%d pods, ports for %d uids", len(pods.Items), len(byDev))
		}
		for _, p := range pods.Items {
			if len(byDev[string(p.UID)]) != 1 {
				return fmt.Errorf("pod %s has %d ports", p.Name, len(byDev[string(p.UID)]))
			}
			if _, err := kubetest.Annotation(&p); err != nil {
				return err
			}
		}
		return nil
	})
}

// TestLeaderElection runs two replicas; only the leader writes, and when
// it is killed the other takes over within the default lease limits.
func TestLeaderElection(t *testing.T) {
	e := kubetest.Start(t, kubecluster.Options{NoNode: true})
	node(t, e, "n1", "")
	e.Namespace("wt-le")
	ctx := context.Background()
	args := func(id string) []string {
		return []string{"--leader-elect", "--identity", id, "--lease-namespace", "kube-system"}
	}
	w1 := e.StartWatcher(args("w1")...)
	var lease *coordv1.Lease
	e.Eventually(20*time.Second, "w1 leads", func() error {
		var err error
		lease, err = e.C.Client.CoordinationV1().Leases("kube-system").Get(ctx, "kurma-k8s-watcher", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity != "w1" {
			return fmt.Errorf("holder %v", lease.Spec.HolderIdentity)
		}
		return nil
	})
	e.StartWatcher(args("w2")...)
	createPod(t, e, kubetest.Pod("wt-le", "before", "n1"))
	e.WaitAnnotated("wt-le", "before", 10*time.Second)

	if err := syscall.Kill(w1.PID(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	createPod(t, e, kubetest.Pod("wt-le", "after", "n1"))
	e.WaitAnnotated("wt-le", "after", 40*time.Second)
	t.Logf("takeover: pod created at the kill annotated after %s", time.Since(killed))
	lease, err := e.C.Client.CoordinationV1().Leases("kube-system").Get(ctx, "kurma-k8s-watcher", metav1.GetOptions{})
	if err != nil || lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity != "w2" || lease.Spec.AcquireTime == nil {
		t.Fatalf("lease after takeover: %+v, %v", lease, err)
	}
	// The lease limits bound the takeover itself; what the new leader
	// then does for the pod (informer sync, setup, the sync) is bounded by
	// the wait above, not by them. client-go retries every RetryPeriod R
	// plus up to 1.2 R of jitter, so w2 may observe w1's last renewal up
	// to 2.2 R after it was made, and acquires at its first retry a lease
	// duration L after that observation: at most L + 4.4 R = 20.8 s.
	took := lease.Spec.AcquireTime.Sub(killed)
	t.Logf("takeover: w2 acquired the lease %s after the kill", took)
	if took > 21*time.Second {
		t.Fatalf("w2 acquired the lease %s after the kill, want ≤ 21s (lease 12s + 2 retries of 2s with 1.2 jitter)", took)
	}
}
