package kubecluster_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kurma.dev/kurma/internal/testutil/kubecluster"
)

// TestDeploymentOverBridge is the harness's smoke test: on a real
// control plane and kubelet with the upstream bridge + host-local plugins, a
// Deployment of 2 becomes Running with pod IPs in the bridge's subnet, each
// pod answers over TCP and UDP from the node's namespace, deleting it frees
// every address and veth, and closing the cluster leaves nothing on the host.
func TestDeploymentOverBridge(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (make test runs as root)")
	}
	// What the host had is read under the host-wide cluster lock: before
	// it, another test's cluster may still hold its kubelet's settings.
	lock, err := kubecluster.LockHost(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lock.Release() })
	hostHad := existing("/run/containerd", "/var/log/containers", "/var/lib/cni", "/var/lib/kubelet")
	sysctlsBefore := readSysctls(t)
	leases := t.TempDir()
	const subnet = "10.244.7.0/24"
	c := kubecluster.StartT(t, kubecluster.Options{
		ControllerManager: true,
		Scheduler:         true,
		CNIConfList:       kubecluster.BridgeConfList("kkcbr0", subnet, leases),
		HeldLock:          lock,
	})
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()

	if out, err := c.Kubectl(ctx, "get", "nodes", "-o", "wide"); err != nil || !strings.Contains(out, c.NodeName) {
		t.Fatalf("kubectl get nodes: %v\n%s", err, out)
	}
	replicas := int32(2)
	labels := map[string]string{"app": "echo"}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "echo"},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					TerminationGracePeriodSeconds: new(int64),
					Containers: []corev1.Container{{
						Name: "echo", Image: kubecluster.EchoImage, ImagePullPolicy: corev1.PullNever,
						Ports: []corev1.ContainerPort{
							{ContainerPort: 8080, Protocol: corev1.ProtocolTCP},
							{ContainerPort: 8080, Protocol: corev1.ProtocolUDP},
						},
					}},
				},
			},
		},
	}
	if _, err := c.Client.AppsV1().Deployments("default").Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pods, err := c.WaitPodsRunning(ctx, "default", "app=echo", 2)
	if err != nil {
		t.Fatal(err)
	}
	_, pnet, _ := net.ParseCIDR(subnet)
	for _, p := range pods {
		ip := net.ParseIP(p.Status.PodIP)
		if !pnet.Contains(ip) {
			t.Errorf("pod %s: IP %s outside %s", p.Name, ip, subnet)
		}
		for _, proto := range []string{"tcp", "udp"} {
			got, err := ask(ctx, c, proto, net.JoinHostPort(p.Status.PodIP, "8080"), "hostname")
			if err != nil {
				t.Errorf("pod %s over %s: %v", p.Name, proto, err)
			} else if got != p.Name {
				t.Errorf("pod %s over %s answered %q", p.Name, proto, got)
			}
		}
	}
	if out, err := c.Kubectl(ctx, "get", "pods", "-o", "wide"); err != nil || !strings.Contains(out, pods[0].Status.PodIP) {
		t.Errorf("kubectl get pods -o wide lacks %s: %v\n%s", pods[0].Status.PodIP, err, out)
	}

	fg := metav1.DeletePropagationForeground
	if err := c.Client.AppsV1().Deployments("default").Delete(ctx, "echo", metav1.DeleteOptions{PropagationPolicy: &fg}); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitNoPods(ctx, "default", "app=echo"); err != nil {
		t.Fatal(err)
	}
	// The kubelet tears a pod's sandbox down (CNI DEL) before the API
	// object goes, but allow it a moment to finish.
	waitFor(ctx, t, "addresses and veths released", func() (bool, string) {
		ips := leasedIPs(t, filepath.Join(leases, "kurma-test-bridge"))
		veths := 0
		_ = c.Do(func() error {
			links, err := netlink.LinkList()
			for _, l := range links {
				if l.Type() == "veth" {
					veths++
				}
			}
			return err
		})
		return len(ips) == 0 && veths == 0, fmt.Sprintf("leased %v, %d veths", ips, veths)
	})

	dir, nsPath, cg := c.Dir, c.NetNS, c.CgroupRoot
	sock := c.ContainerdSocket
	if err := c.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	assertGone(t, dir, nsPath, cg, sock, hostHad)
	if after := readSysctls(t); after != sysctlsBefore {
		t.Errorf("kernel settings the kubelet changed not restored: %q, was %q", after, sysctlsBefore)
	}
}

// readSysctls reads the kernel settings the kubelet rewrites.
func readSysctls(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	for _, k := range []string{"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops"} {
		v, err := os.ReadFile(filepath.Join("/proc/sys", k))
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "%s=%s ", k, strings.TrimSpace(string(v)))
	}
	return b.String()
}

// TestAPIServerOnly starts a control plane without a node and lists
// namespaces through the namespace-bound client and through kubectl.
func TestAPIServerOnly(t *testing.T) {
	c := kubecluster.StartT(t, kubecluster.Options{NoNode: true})
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	ns, err := c.Client.CoreV1().Namespaces().Get(ctx, "default", metav1.GetOptions{})
	if err != nil || ns.Name != "default" {
		t.Fatalf("get namespace default: %v", err)
	}
	if out, err := c.Kubectl(ctx, "version"); err != nil || !strings.Contains(out, "Server Version: v1.37.1") {
		t.Fatalf("kubectl version: %v\n%s", err, out)
	}
	dir, nsPath := c.Dir, c.NetNS
	if err := c.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	assertGone(t, dir, nsPath, "", "", nil)
}

// ask sends one request line (TCP) or datagram (UDP) from the node's
// namespace and returns the answer without its newline.
func ask(ctx context.Context, c *kubecluster.Cluster, proto, addr, req string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := c.DialContext(ctx, proto, addr)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	dl, _ := ctx.Deadline()
	_ = conn.SetDeadline(dl)
	if _, err := conn.Write([]byte(req + "\n")); err != nil {
		return "", err
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(line), nil
}

// leasedIPs lists host-local's lease files (named by address) in dir.
func leasedIPs(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var ips []string
	for _, e := range ents {
		if net.ParseIP(e.Name()) != nil {
			ips = append(ips, e.Name())
		}
	}
	return ips
}

func waitFor(ctx context.Context, t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	for {
		ok, state := cond()
		if ok {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: %v (last: %s)", what, ctx.Err(), state)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// existing says which of paths exist.
func existing(paths ...string) map[string]bool {
	m := map[string]bool{}
	for _, p := range paths {
		_, err := os.Stat(p)
		m[p] = err == nil
	}
	return m
}

// assertGone checks that a closed cluster left nothing on the host: no
// folder, namespace, mount, cgroup, container log link or runc shim, and
// none of the host folders a node may create that hostHad says were absent.
func assertGone(t *testing.T, dir, nsPath, cgroupRoot, sock string, hostHad map[string]bool) {
	t.Helper()
	for _, p := range []string{dir, nsPath} {
		if _, err := os.Stat(p); err == nil {
			t.Errorf("%s left behind", p)
		}
	}
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(mi), "\n") {
		if strings.Contains(l, dir) || strings.Contains(l, nsPath) {
			t.Errorf("mount left behind: %s", l)
		}
	}
	if cgroupRoot != "" {
		hs, _ := filepath.Glob("/sys/fs/cgroup/*" + cgroupRoot)
		if len(hs) > 0 {
			t.Errorf("cgroups left behind: %v", hs)
		}
	}
	links, _ := filepath.Glob("/var/log/containers/*")
	for _, l := range links {
		if tgt, _ := os.Readlink(l); strings.HasPrefix(tgt, dir) {
			t.Errorf("container log link left behind: %s", l)
		}
	}
	for d, had := range hostHad {
		if _, err := os.Stat(d); err == nil && !had {
			t.Errorf("%s left behind", d)
		}
	}
	if cgroupRoot != "" {
		if _, err := os.Stat("/var/lib/kubelet/device-plugins/kubelet.sock"); err == nil {
			t.Errorf("the kubelet's device-plugin socket left behind")
		}
	}
	if sock != "" {
		procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
		for _, p := range procs {
			if b, err := os.ReadFile(p); err == nil && strings.Contains(string(b), sock) {
				t.Errorf("process left behind: %s %q", p, b)
			}
		}
	}
}
