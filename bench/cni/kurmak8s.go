package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"kurma.dev/kurma/internal/kube/podnet"
	"kurma.dev/kurma/internal/testutil/kubecluster"
)

// The Kubernetes driver (kurma-k8s, the thin shim) measured the same way
// as the others: a real API server (no node), the controller, the watcher
// and an agent in Kubernetes mode run as processes in the cluster's
// namespace; one pod bound to the agent's node is annotated before the
// first ADD, so every ADD finds its annotation there (the goal's case) and
// each ADD/DEL cycle re-attaches that pod's port in a fresh namespace.

const (
	k8sNode  = "kcni-node"
	k8sGhost = "kcni-ghost" // a node without agent: pods only get annotated
	k8sNS    = "kcni-bench"
	ctlAddr  = "127.0.0.1:19697"
)

// k8sEnv is the running cluster with Kurma on it.
type k8sEnv struct {
	c *kubecluster.Cluster
}

// setupKurmaK8s starts the cluster and Kurma and returns the cnitool
// driver of the kurma-k8s network.
func setupKurmaK8s(ctx context.Context, bin, cnitool, tmp string) (*tool, *k8sEnv, func(), error) {
	noop := func() {}
	for _, b := range []string{"kurma-controller", "kurma-agent", "kurma-k8s-watcher", "kurma-k8s", "k8s/kube-apiserver"} {
		if _, err := os.Stat(filepath.Join(bin, b)); err != nil {
			return nil, nil, noop, fmt.Errorf("%s not built (make build): %w", b, err)
		}
	}
	sctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	c, err := kubecluster.Start(sctx, kubecluster.Options{BinDir: bin, NoNode: true})
	if err != nil {
		return nil, nil, noop, err
	}
	cleanup := func() { _ = c.Close() }
	fail := func(err error) (*tool, *k8sEnv, func(), error) {
		for _, p := range c.Processes() {
			fmt.Fprintf(os.Stderr, "--- %s ---\n%s\n", p.Name, c.Logs(p.Name, 2000))
		}
		return nil, nil, cleanup, err
	}
	tok := filepath.Join(c.Dir, "ctl-token")
	if err := os.WriteFile(tok, []byte("kcni-bench"), 0o600); err != nil {
		return fail(err)
	}
	sock := filepath.Join(tmp, "k8s-sock", "cni.sock")
	procs := [][]string{
		{"kurma-controller", filepath.Join(bin, "kurma-controller"), "--listen", ctlAddr, "--store", "bolt:" + filepath.Join(c.Dir, "ctl.db"), "--token-file", tok},
		{"watcher", filepath.Join(bin, "kurma-k8s-watcher"), "--kubeconfig", c.Kubeconfig, "--controller", "http://" + ctlAddr, "--token-file", tok},
		{"agent", filepath.Join(bin, "kurma-agent"), "--controller", "http://" + ctlAddr, "--token-file", tok, "--host-id", k8sNode,
			"--underlay-ip", kubecluster.NodeIP, "--state-dir", filepath.Join(c.Dir, "agent"), "--link-prefix", "kcbk", "--nft-table", "kcnibenchk8s",
			"--k8s-node-name", k8sNode, "--k8s-kubeconfig", c.Kubeconfig, "--k8s-cni-socket", sock},
	}
	for _, p := range procs {
		if _, err := c.StartProcess(p[0], exec.Command(p[1], p[2:]...)); err != nil {
			return fail(err)
		}
	}
	for _, n := range []string{k8sNode, k8sGhost} {
		if _, err := c.Client.CoreV1().Nodes().Create(sctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{}); err != nil {
			return fail(err)
		}
	}
	if _, err := c.Client.CoreV1().Namespaces().Create(sctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: k8sNS}}, metav1.CreateOptions{}); err != nil {
		return fail(err)
	}
	pod, err := c.Client.CoreV1().Pods(k8sNS).Create(sctx, benchPod("attached", k8sNode), metav1.CreateOptions{})
	if err != nil {
		return fail(err)
	}
	for {
		p, err := c.Client.CoreV1().Pods(k8sNS).Get(sctx, "attached", metav1.GetOptions{})
		if err == nil && annotated(p) {
			break
		}
		if sctx.Err() != nil {
			return fail(fmt.Errorf("pod not annotated: %v", err))
		}
		time.Sleep(50 * time.Millisecond)
	}
	for {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		if sctx.Err() != nil {
			return fail(fmt.Errorf("agent socket %s: %w", sock, sctx.Err()))
		}
		time.Sleep(50 * time.Millisecond)
	}
	conf := filepath.Join(tmp, "k8s-conf")
	if err := os.MkdirAll(conf, 0o755); err != nil {
		return fail(err)
	}
	list := `{"cniVersion":"1.1.0","name":"kcnik8s","plugins":[{"type":"kurma-k8s","socket":"` + sock + `"}]}`
	if err := os.WriteFile(filepath.Join(conf, "kcnik8s.conflist"), []byte(list), 0o644); err != nil {
		return fail(err)
	}
	t := &tool{name: "kcnik8s", cnitool: cnitool, path: bin, confDir: conf,
		env: []string{"CNI_ARGS=IgnoreUnknown=1;K8S_POD_NAMESPACE=" + k8sNS + ";K8S_POD_NAME=attached;K8S_POD_INFRA_CONTAINER_ID=x;K8S_POD_UID=" + string(pod.UID)}}
	return t, &k8sEnv{c: c}, cleanup, nil
}

func benchPod(name, node string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: k8sNS, Name: name, Labels: map[string]string{"kcni": "bench"}},
		Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: kubecluster.EchoImage}}},
	}
}

func annotated(p *corev1.Pod) bool {
	v, ok := p.Annotations[podnet.Annotation]
	if !ok {
		return false
	}
	nets, err := podnet.Decode(v)
	if err != nil {
		return false
	}
	n, _ := nets.Default()
	return n.PodUID == string(p.UID)
}

// annotationLatency creates n pods one after the other on the ghost node
// and times, for each, from its create returning to the watch event that
// shows its annotation: the watcher's pod→annotation latency (informer
// delivery, port create in the controller, pod patch).
func (e *k8sEnv) annotationLatency(ctx context.Context, n int) (samples, error) {
	pods := e.c.Client.CoreV1().Pods(k8sNS)
	w, err := pods.Watch(ctx, metav1.ListOptions{LabelSelector: "kcni=lat"})
	if err != nil {
		return nil, err
	}
	defer w.Stop()
	var out samples
	for i := range n {
		p := benchPod(fmt.Sprintf("lat-%03d", i), k8sGhost)
		p.Labels = map[string]string{"kcni": "lat"}
		if _, err := pods.Create(ctx, p, metav1.CreateOptions{}); err != nil {
			return nil, err
		}
		created := time.Now()
		timeout := time.After(10 * time.Second)
	wait:
		for {
			select {
			case ev, ok := <-w.ResultChan():
				if !ok {
					return nil, fmt.Errorf("watch closed")
				}
				if q, isPod := ev.Object.(*corev1.Pod); isPod && ev.Type == watch.Modified && q.Name == p.Name && annotated(q) {
					out = append(out, time.Since(created))
					break wait
				}
			case <-timeout:
				return nil, fmt.Errorf("pod %s not annotated in 10s", p.Name)
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return out, nil
}
