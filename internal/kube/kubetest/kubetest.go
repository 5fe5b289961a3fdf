// Package kubetest runs the Kurma side of a Kubernetes test bed on top of a
// real cluster (internal/testutil/kubecluster): a kurma-controller process
// inside the cluster's network namespace, a controller client that dials
// through that namespace, and the watcher and agent binaries as processes
// of the cluster. Only tests and bench/ mains import it.
//
// Locking: none; an Env is used by one test goroutine.
//
// Must not import: `kurma.dev/kurma/internal/controller/...`,
// `kurma.dev/kurma/internal/agent/...`.
package kubetest

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kurma.dev/kurma/internal/kube/cniwire"
	"kurma.dev/kurma/internal/kube/podnet"
	"kurma.dev/kurma/internal/testutil/kubecluster"
	"kurma.dev/kurma/pkg/controllerapi"
)

// ControllerAddr is where the controller listens inside the cluster's
// namespace.
const ControllerAddr = "127.0.0.1:19696"

// Env is a cluster with a Kurma controller.
type Env struct {
	T      testing.TB
	C      *kubecluster.Cluster
	Ctl    *controllerapi.Client
	CtlURL string
	Token  string
	// Watchers are the watcher processes started so far.
	Watchers []*kubecluster.Process
	ctlProc  *kubecluster.Process
	n        int
}

// Bin returns a build output of the cluster's bin dir.
func (e *Env) Bin(name string) string { return filepath.Join(e.C.BinDir, name) }

// Start starts a cluster with opts and a controller in it. Clusters run one
// at a time on a host (the harness's lock), so it waits up to 20 minutes
// for its turn.
func Start(t testing.TB, opts kubecluster.Options) *Env {
	t.Helper()
	return StartWithin(t, 20*time.Minute, opts)
}

// StartWithin is Start with a limit of its own for the wait and the
// start (long suites queue behind other clusters longer).
func StartWithin(t testing.TB, limit time.Duration, opts kubecluster.Options) *Env {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (make test runs as root)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	c, err := kubecluster.Start(ctx, opts)
	if err != nil {
		t.Fatalf("start cluster: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, p := range c.Processes() {
				t.Logf("--- %s (tail) ---\n%s", p.Name, c.Logs(p.Name, 3000))
			}
		}
		if err := c.Close(); err != nil {
			t.Errorf("close cluster: %v", err)
		}
	})
	e := &Env{T: t, C: c, CtlURL: "http://" + ControllerAddr, Token: "kubetest-token"}
	tokFile := filepath.Join(c.Dir, "ctl-token")
	if err := os.WriteFile(tokFile, []byte(e.Token), 0o600); err != nil {
		t.Fatal(err)
	}
	e.ctlProc = e.StartProc("kurma-controller", e.Bin("kurma-controller"), "--listen", ControllerAddr,
		"--store", "bolt:"+filepath.Join(c.Dir, "controller.db"), "--token-file", tokFile)
	tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		return c.DialContext(ctx, network, addr)
	}, MaxIdleConnsPerHost: 64}
	ctl, err := controllerapi.New(e.CtlURL, controllerapi.WithToken(e.Token), controllerapi.WithHTTPClient(&http.Client{Transport: tr}))
	if err != nil {
		t.Fatal(err)
	}
	e.Ctl = ctl
	e.Eventually(20*time.Second, "controller up", func() error {
		_, err := ctl.ListProjects(context.Background())
		return err
	})
	return e
}

// TokenFile is the controller token's file.
func (e *Env) TokenFile() string { return filepath.Join(e.C.Dir, "ctl-token") }

// StartProc starts a binary inside the cluster's namespace.
func (e *Env) StartProc(name, bin string, args ...string) *kubecluster.Process {
	e.T.Helper()
	e.n++
	p, err := e.C.StartProcess(name+"-"+strconv.Itoa(e.n), exec.Command(bin, args...))
	if err != nil {
		e.T.Fatal(err)
	}
	e.T.Cleanup(func() { p.Stop(5 * time.Second) })
	return p
}

// StartWatcher runs kurma-k8s-watcher against the cluster and controller.
func (e *Env) StartWatcher(extra ...string) *kubecluster.Process {
	e.T.Helper()
	args := append([]string{"--kubeconfig", e.C.Kubeconfig, "--controller", e.CtlURL,
		"--token-file", e.TokenFile(), "-v"}, extra...)
	p := e.StartProc("watcher", e.Bin("kurma-k8s-watcher"), args...)
	e.Watchers = append(e.Watchers, p)
	return p
}

// Eventually retries f until it returns nil or the limit passes.
func (e *Env) Eventually(limit time.Duration, what string, f func() error) {
	e.T.Helper()
	deadline := time.Now().Add(limit)
	var err error
	for {
		if err = f(); err == nil {
			return
		}
		if time.Now().After(deadline) {
			e.T.Fatalf("%s: not within %s: %v", what, limit, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Namespace creates a namespace.
func (e *Env) Namespace(name string) *corev1.Namespace {
	e.T.Helper()
	ns, err := e.C.Client.CoreV1().Namespaces().Create(context.Background(),
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil {
		e.T.Fatal(err)
	}
	return ns
}

// Pod returns a pod on node (image kubecluster.EchoImage, never pulled).
func Pod(ns, name, node string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"app": "kubetest"}},
		Spec: corev1.PodSpec{NodeName: node, TerminationGracePeriodSeconds: new(int64),
			Containers: []corev1.Container{{Name: "echo", Image: kubecluster.EchoImage, ImagePullPolicy: corev1.PullNever}}},
	}
}

// Annotation returns the pod's default network once annotated for its UID.
func Annotation(p *corev1.Pod) (podnet.Network, error) {
	v, ok := p.Annotations[podnet.Annotation]
	if !ok {
		return podnet.Network{}, fmt.Errorf("pod %s/%s not annotated", p.Namespace, p.Name)
	}
	nets, err := podnet.Decode(v)
	if err != nil {
		return podnet.Network{}, err
	}
	n, _ := nets.Default()
	if n.PodUID != string(p.UID) {
		return n, fmt.Errorf("pod %s/%s annotated for uid %s, has %s", p.Namespace, p.Name, n.PodUID, p.UID)
	}
	return n, nil
}

// WaitAnnotated waits until the pod carries an annotation for its UID.
func (e *Env) WaitAnnotated(ns, name string, limit time.Duration) (*corev1.Pod, podnet.Network) {
	e.T.Helper()
	var pod *corev1.Pod
	var n podnet.Network
	e.Eventually(limit, "annotation of "+ns+"/"+name, func() error {
		p, err := e.C.Client.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		n, err = Annotation(p)
		pod = p
		return err
	})
	return pod, n
}

// PortsByDevice lists the project's ports grouped by device id (pod UID).
func (e *Env) PortsByDevice(project string) (map[string][]controllerapi.Port, error) {
	ps, err := e.Ctl.ListPorts(context.Background(), project, controllerapi.PortFilter{})
	if err != nil {
		return nil, err
	}
	out := map[string][]controllerapi.Port{}
	for _, p := range ps {
		out[p.DeviceID] = append(out[p.DeviceID], p)
	}
	return out, nil
}

// Short shortens a UID for names.
func Short(s string) string { return strings.SplitN(s, "-", 2)[0] }

// Agent is a kurma-agent in Kubernetes mode started by StartAgent.
type Agent struct {
	Proc              *kubecluster.Process
	Socket, StateDir  string
	Prefix, NFT, Node string
	args              []string
	on                *kubecluster.Node // nil: the cluster's namespace
}

// StartAgent runs kurma-agent for node (host id = node name) inside the
// cluster's namespace, with a link prefix and nft table of its own, its
// CNI socket and state under the cluster's folder.
func (e *Env) StartAgent(node, underlayIP string, extra ...string) *Agent {
	e.T.Helper()
	return e.StartAgentAt(node, underlayIP, filepath.Join(e.C.Dir, "agent-"+node, "sock", "cni.sock"), extra...)
}

// StartAgentAt is StartAgent with the CNI socket at socket (a node's
// conflist must name it before the cluster starts).
func (e *Env) StartAgentAt(node, underlayIP, socket string, extra ...string) *Agent {
	e.T.Helper()
	e.n++
	dir := filepath.Join(e.C.Dir, "agent-"+node)
	a := &Agent{Socket: socket, StateDir: filepath.Join(dir, "state"),
		Prefix: "kt" + strconv.Itoa(e.n%100), NFT: "kurma-kubetest-" + strconv.Itoa(e.n), Node: node}
	a.args = append([]string{"--controller", e.CtlURL, "--token-file", e.TokenFile(), "--host-id", node,
		"--underlay-ip", underlayIP, "--state-dir", a.StateDir, "--link-prefix", a.Prefix, "--nft-table", a.NFT,
		"--k8s-node-name", node, "--k8s-kubeconfig", e.C.Kubeconfig, "--k8s-cni-socket", a.Socket, "-v",
		// Agents in the test's own namespace share its ports: kube-proxy's
		// well-known ones only when extra asks.
		"--proxy-healthz-listen", "none", "--proxy-status-listen", "none"}, extra...)
	a.Proc = e.StartProc("agent-"+node, e.Bin("kurma-agent"), a.args...)
	e.Eventually(30*time.Second, "agent socket", func() error {
		_, err := os.Stat(a.Socket)
		return err
	})
	return a
}

// Restart starts the agent again with the same flags (after it exited).
func (e *Env) RestartAgent(a *Agent) {
	e.T.Helper()
	<-a.Proc.Done()
	if a.on != nil {
		_ = os.Remove(a.on.HostPath(a.Socket))
		a.Proc = e.startOn(a.on, "agent-"+a.Node, e.Bin("kurma-agent"), a.args...)
	} else {
		_ = os.Remove(a.Socket)
		a.Proc = e.StartProc("agent-"+a.Node, e.Bin("kurma-agent"), a.args...)
	}
	e.Eventually(20*time.Second, "agent socket", func() error {
		_, err := os.Stat(a.hostSocket())
		return err
	})
}

// hostSocket is the agent's CNI socket in the test's view.
func (a *Agent) hostSocket() string {
	if a.on != nil {
		return a.on.HostPath(a.Socket)
	}
	return a.Socket
}

// StartAgentOn runs kurma-agent for a node after the first of a cluster
// of several (Options.Nodes), inside that node's network and mount
// namespaces, as on a machine of its own: its underlay address is the
// node's, it reaches the API server over the underlay (the node's
// kubeconfig) and the controller through a forwarder on the node's
// loopback. socket is the CNI socket in the node's view (the path in its
// conflist, StartWithDriver); the agent's state lives in the node's folder.
func (e *Env) StartAgentOn(n *kubecluster.Node, socket string, extra ...string) *Agent {
	e.T.Helper()
	e.Forward(e.T, n.NetNS, ControllerAddr)
	e.n++
	dir := filepath.Join(n.Dir, "agent")
	a := &Agent{Socket: socket, StateDir: filepath.Join(dir, "state"),
		Prefix: "kt" + strconv.Itoa(e.n%100), NFT: "kurma-kubetest-" + strconv.Itoa(e.n), Node: n.Name, on: n}
	a.args = append([]string{"--controller", e.CtlURL, "--token-file", e.TokenFile(), "--host-id", n.Name,
		"--underlay-ip", n.IP, "--state-dir", a.StateDir, "--link-prefix", a.Prefix, "--nft-table", a.NFT,
		"--k8s-node-name", n.Name, "--k8s-kubeconfig", n.Kubeconfig(), "--k8s-cni-socket", a.Socket, "-v"}, extra...)
	a.Proc = e.startOn(n, "agent-"+n.Name, e.Bin("kurma-agent"), a.args...)
	e.Eventually(30*time.Second, n.Name+" agent socket", func() error {
		_, err := os.Stat(a.hostSocket())
		return err
	})
	return a
}

// startOn starts a binary inside node n's namespaces.
func (e *Env) startOn(n *kubecluster.Node, name, bin string, args ...string) *kubecluster.Process {
	e.T.Helper()
	e.n++
	p, err := n.StartProcess(name+"-"+strconv.Itoa(e.n), exec.Command(bin, args...))
	if err != nil {
		e.T.Fatal(err)
	}
	e.T.Cleanup(func() { p.Stop(5 * time.Second) })
	return p
}

// ConfList is the node conflist for the kurma-k8s driver on socket.
func ConfList(socket string) []byte { return cniwire.ConfList(socket, false) }
