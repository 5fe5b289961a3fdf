package conformance

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"kurma.dev/kurma/internal/testutil/kubecluster"
)

// knpArgs are the flags of kube-network-policies' install.yaml (v0.8.0);
// the metrics listener is kept on loopback.
func knpArgs(node string) []string {
	return []string{"--hostname-override=" + node, "--v=2", "--nfqueue-id=98", "--metrics-bind-address=127.0.0.1:9080"}
}

// startKNP starts the peer of the netpol set: the kube-proxy peer's cluster
// (bridge + host-local + portmap, kube-proxy in nftables mode, CoreDNS) and
// kube-network-policies v0.8.0 (bin/knp, `make knp`) on the node, as its
// install.yaml runs it: a host-network process with the flags above, its
// API access through the `kubernetes` Service with a token and the API
// server's CA where rest.InClusterConfig reads them (v0.8.0 has no
// --kubeconfig flag; a private mount namespace holds the files). Bridge
// netfilter is on, so that pod-to-pod traffic over the bridge meets its
// hooks, as it does Kurma's.
//
// It skips, with the kernel's own error, when the kernel cannot hold the
// nftables queue rule that kube-network-policies depends on.
func startKNP(t *testing.T, ctx context.Context) *kubecluster.Cluster {
	bin := filepath.Join(kubecluster.BinDir(), "knp", "kube-network-policies")
	if _, err := os.Stat(bin); err != nil {
		t.Skipf("%s missing: make knp", bin)
	}
	if err := kubecluster.NFTQueue(ctx); err != nil {
		t.Skipf("kube-network-policies cannot run on this kernel: it sends each new connection of a selected pod to "+
			"userspace through the nftables queue expression, and this kernel rejects it (CONFIG_NFT_QUEUE is not set; "+
			"nfnetlink_queue itself is present, modules cannot be loaded): %v", err)
	}
	c := startKubeProxy(t, ctx, 1)
	if err := c.Do(func() error {
		return os.WriteFile("/proc/sys/net/bridge/bridge-nf-call-iptables", []byte("1"), 0o644)
	}); err != nil {
		t.Fatalf("bridge netfilter: %v", err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "token"), []byte(c.Token), 0o600); err != nil {
		t.Fatal(err)
	}
	ca, err := os.ReadFile(filepath.Join(c.Dir, "apiserver-certs", "apiserver.crt"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "ca.crt"), ca, 0o600); err != nil {
		t.Fatal(err)
	}
	// A tmpfs on /run in a private mount namespace holds
	// /run/secrets/kubernetes.io/serviceaccount; the host's /run is
	// untouched.
	script := `set -e
mount -t tmpfs tmpfs /run
sa=/run/secrets/kubernetes.io/serviceaccount
mkdir -p $sa
cp "$1/token" "$1/ca.crt" $sa/
shift
exec "$@"`
	args := append([]string{"--mount", "--propagation", "private", "--", "sh", "-c", script, "sh", dir, bin}, knpArgs(c.NodeName)...)
	cmd := exec.Command("unshare", args...)
	cmd.Env = append(os.Environ(), "KUBERNETES_SERVICE_HOST=10.96.0.1", "KUBERNETES_SERVICE_PORT=443")
	p, err := c.StartProcess("kube-network-policies", cmd)
	if err != nil {
		t.Fatal(err)
	}
	// Ready: its table is in the kernel (the first sync is done).
	deadline := time.Now().Add(time.Minute)
	for c.Command(ctx, "nft", "list", "table", "inet", "kube-network-policies").Run() != nil {
		select {
		case <-p.Done():
			t.Fatalf("kube-network-policies exited (%v):\n%s", p.Err(), c.Logs("kube-network-policies", 4000))
		case <-time.After(500 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("kube-network-policies wrote no table in 1m:\n%s", c.Logs("kube-network-policies", 4000))
		}
	}
	return c
}
