package k8sservices_test

import (
	"context"
	"io"
	"net"
	"os"
	"os/exec"
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
	"kurma.dev/kurma/internal/testutil"
	"kurma.dev/kurma/internal/testutil/kubecluster"
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
	forward(t, e, n2, strings.TrimPrefix(e.C.Config.Host, "https://"))
	forward(t, e, n2, kubetest.ControllerAddr)
	dir := t.TempDir()
	sock := filepath.Join(dir, "sock", "cni.sock")
	agent := exec.Command("nsenter", "--net="+n2, "--", e.Bin("kurma-agent"), "--controller", e.CtlURL,
		"--token-file", e.TokenFile(), "--host-id", "node2", "--underlay-ip", ul2, "--state-dir", filepath.Join(dir, "state"),
		"--link-prefix", "ks2", "--nft-table", "kurma-svc-node2", "--k8s-node-name", "node2",
		"--k8s-kubeconfig", e.C.Kubeconfig, "--k8s-cni-socket", sock)
	logf, err := os.Create(filepath.Join(dir, "agent.log"))
	if err != nil {
		t.Fatal(err)
	}
	agent.Stdout, agent.Stderr = logf, logf
	agent.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := agent.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = agent.Process.Signal(syscall.SIGTERM)
		_ = agent.Wait()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("--- node2 agent ---\n%s", b)
		}
	})
	e.Eventually(30*time.Second, "node2 agent socket", func() error { _, err := os.Stat(sock); return err })

	p, err := kc.CoreV1().Pods(podNSName).Create(ctx, kubetest.Pod(podNSName, "on-node2", "node2"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	podNS := nettest.NewNS(t, testutil.UniqueName("ksv2p"))
	confDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(confDir, "10-kurma.conflist"), kubetest.ConfList(sock), 0o644); err != nil {
		t.Fatal(err)
	}
	cnitool := func(verb string) (string, error) {
		cmd := exec.CommandContext(ctx, filepath.Join(kubecluster.BinDir(), "tools", "cnitool"), verb, "kurma", podNS)
		cmd.Env = append(os.Environ(), "NETCONFPATH="+confDir, "CNI_PATH="+kubecluster.BinDir(),
			"CNI_ARGS=IgnoreUnknown=1;K8S_POD_NAMESPACE="+podNSName+";K8S_POD_NAME=on-node2;K8S_POD_INFRA_CONTAINER_ID=ks2c;K8S_POD_UID="+string(p.UID))
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
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

// forward listens on addr inside nsPath and relays each connection to
// addr inside the cluster's namespace.
func forward(t *testing.T, e *kubetest.Env, nsPath, addr string) {
	t.Helper()
	var ln net.Listener
	if err := ns.WithNetNSPath(nsPath, func(ns.NetNS) error {
		var err error
		ln, err = net.Listen("tcp", addr)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				u, err := e.C.DialContext(context.Background(), "tcp", addr)
				if err != nil {
					return
				}
				defer u.Close()
				go func() { _, _ = io.Copy(u, c) }()
				_, _ = io.Copy(c, u)
			}()
		}
	}()
}
