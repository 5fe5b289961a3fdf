package kubecluster_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kurma.dev/kurma/internal/testutil/kubecluster"
)

// TestTwoNodes runs a cluster of two real nodes: both kubelets register
// and go Ready, each runs a pod of its own, the second node's kubelet is
// reached over the underlay at its own address, and Close leaves nothing
// of either node (nor of the underlay's switch) on the host.
func TestTwoNodes(t *testing.T) {
	hostHad := existing("/run/containerd", "/var/log/containers", "/var/lib/cni", "/var/lib/kubelet")
	leases := t.TempDir()
	c := kubecluster.StartT(t, kubecluster.Options{
		Nodes:       2,
		KubeletAPI:  true,
		CNIConfList: kubecluster.BridgeConfList("kkcbr0", "10.244.8.0/24", leases),
	})
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	if len(c.Nodes) != 2 {
		t.Fatalf("%d nodes", len(c.Nodes))
	}
	n1 := c.Nodes[1]
	if n1.IP == kubecluster.NodeIP || n1.NetNS == c.NetNS || n1.CgroupRoot == c.CgroupRoot ||
		n1.ContainerdSocket == c.ContainerdSocket || n1.CNIConfDir == c.CNIConfDir {
		t.Fatalf("the second node shares state with the first: %+v", n1)
	}
	for _, n := range c.Nodes {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "echo-" + n.Name, Labels: map[string]string{"app": "two"}},
			Spec: corev1.PodSpec{NodeName: n.Name, TerminationGracePeriodSeconds: new(int64),
				Containers: []corev1.Container{{Name: "echo", Image: kubecluster.EchoImage, ImagePullPolicy: corev1.PullNever}}}}
		if _, err := c.Client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	pods, err := c.WaitPodsRunning(ctx, "default", "app=two", 2)
	if err != nil {
		t.Fatal(err)
	}
	on := map[string]bool{}
	for _, p := range pods {
		on[p.Spec.NodeName] = true
	}
	if len(on) != 2 {
		t.Fatalf("pods run on %v", on)
	}
	// Each node's kubelet API answers at its own underlay address, from
	// the other node.
	for i, n := range c.Nodes {
		from := c.Nodes[1-i]
		conn, err := from.DialContext(ctx, "tcp", n.IP+":10250")
		if err != nil {
			t.Fatalf("kubelet of %s at %s from %s: %v", n.Name, n.IP, from.Name, err)
		}
		_ = conn.Close()
	}
	if out, err := n1.Command(ctx, filepath.Join(c.BinDir, "k8s", "kubectl"), "get", "nodes").CombinedOutput(); err != nil {
		t.Fatalf("kubectl from the second node: %v: %s", err, out)
	}
	if c.SwitchNetNS == "" || c.SwitchNetNS == c.NetNS {
		t.Fatalf("no underlay switch of its own: %q", c.SwitchNetNS)
	}
	sw := c.SwitchNetNS
	dir, cg := c.Dir, []string{c.CgroupRoot, n1.CgroupRoot}
	nss := []string{c.NetNS, n1.NetNS}
	socks := []string{c.ContainerdSocket, n1.ContainerdSocket}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	for i := range nss {
		assertGone(t, dir, nss[i], cg[i], socks[i], hostHad)
	}
	if _, err := os.Stat(sw); err == nil {
		t.Errorf("the underlay switch's namespace %s left behind", sw)
	}
}
