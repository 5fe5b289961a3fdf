package kubetest

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
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kurma.dev/kurma/internal/kube/cnid"
	"kurma.dev/kurma/internal/testutil"
	"kurma.dev/kurma/internal/testutil/kubecluster"
)

// Deployment is a Deployment of replicas echo pods labelled app=name.
func Deployment(namespace, name string, replicas int32) *appsv1.Deployment {
	labels := map[string]string{"app": name}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{TerminationGracePeriodSeconds: new(int64),
					Containers: []corev1.Container{{Name: "echo", Image: kubecluster.EchoImage, ImagePullPolicy: corev1.PullNever}}},
			},
		},
	}
}

// PodNetNS finds a pod's network namespace in the agent's attachment
// records.
func (a *Agent) PodNetNS(t testing.TB, p corev1.Pod) string {
	t.Helper()
	path, err := cnid.PodNetNS(filepath.Join(a.StateDir, "k8s"), string(p.UID))
	if err != nil {
		t.Fatalf("pod %s/%s: %v", p.Namespace, p.Name, err)
	}
	return path
}

// Forward listens on addr inside the namespace nsPath and relays every
// connection to addr inside the cluster's namespace, until the test ends.
func (e *Env) Forward(t testing.TB, nsPath, addr string) {
	t.Helper()
	var ln net.Listener
	if err := ns.WithNetNSPath(nsPath, func(ns.NetNS) error {
		var err error
		ln, err = net.Listen("tcp", addr)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	testutil.ServeConns(t, ln, func(c net.Conn) {
		u, err := e.C.DialContext(context.Background(), "tcp", addr)
		if err != nil {
			return
		}
		defer u.Close()
		go func() { _, _ = io.Copy(u, c) }()
		_, _ = io.Copy(c, u)
	})
}

// StartRemoteAgent runs a kurma-agent for node in its own network
// namespace nsPath (a second node outside the cluster's namespace, reached
// over underlayIP), with forwarders there to the API server and the
// controller, and returns its CNI socket once it listens. The agent is
// stopped when the test ends; its log is printed if the test failed.
func (e *Env) StartRemoteAgent(t testing.TB, nsPath, node, underlayIP, linkPrefix, nftTable string) string {
	t.Helper()
	e.Forward(t, nsPath, strings.TrimPrefix(e.C.Config.Host, "https://"))
	e.Forward(t, nsPath, ControllerAddr)
	dir := t.TempDir()
	sock := filepath.Join(dir, "sock", "cni.sock")
	agent := exec.Command("nsenter", "--net="+nsPath, "--", e.Bin("kurma-agent"), "--controller", e.CtlURL,
		"--token-file", e.TokenFile(), "--host-id", node, "--underlay-ip", underlayIP, "--state-dir", filepath.Join(dir, "state"),
		"--link-prefix", linkPrefix, "--nft-table", nftTable, "--k8s-node-name", node,
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
		_ = logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("--- %s agent ---\n%s", node, b)
		}
	})
	e.Eventually(30*time.Second, node+" agent socket", func() error { _, err := os.Stat(sock); return err })
	return sock
}
