package k8sinstall

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"kurma.dev/kurma/internal/testutil"
	"kurma.dev/kurma/internal/testutil/kubecluster"
)

// settings are the documented edits of docs/install-kubernetes.md for this
// cluster: the ConfigMap's REQUIRED keys and the host folders (the
// harness's nodes keep their CNI folders, and this test its state folders,
// under folders of their own).
type settings struct {
	apiHost, apiPort, controllerURL, serviceCIDR string
	netnsDir                                     string            // where the runtime mounts pod namespaces
	hostPaths                                    map[string]string // manifest hostPath → this node's
}

var hostPathLine = regexp.MustCompile(`(?m)^(\s+hostPath:\n\s+path: )(/\S*)$`)

// edit applies s to one manifest's text, failing on a documented key that
// is not found (the manifests changed: the document must too).
func (s settings) edit(t *testing.T, name, text string) string {
	t.Helper()
	sub := func(old, new string) {
		if !strings.Contains(text, old) {
			t.Fatalf("%s: %q not found", name, old)
		}
		text = strings.ReplaceAll(text, old, new)
	}
	switch name {
	case "00-config.yaml":
		sub(`k8s-service-host: ""`, fmt.Sprintf("k8s-service-host: %q", s.apiHost))
		sub(`k8s-service-port: "6443"`, fmt.Sprintf("k8s-service-port: %q", s.apiPort))
		sub(`controller-url: ""`, fmt.Sprintf("controller-url: %q", s.controllerURL))
		sub(`service-cidr: "10.96.0.0/12"`, fmt.Sprintf("service-cidr: %q", s.serviceCIDR))
	case "30-agent.yaml":
		sub("mountPath: /var/run/netns", "mountPath: "+s.netnsDir)
	}
	return hostPathLine.ReplaceAllStringFunc(text, func(line string) string {
		m := hostPathLine.FindStringSubmatch(line)
		p, ok := s.hostPaths[m[2]]
		if !ok {
			t.Fatalf("%s: hostPath %s has no documented setting here", name, m[2])
		}
		return m[1] + p
	})
}

// writeManifests copies dir's manifests (and uninstall/) into out, edited.
func (s settings) writeManifests(t *testing.T, dir, out string) {
	t.Helper()
	for _, sub := range []string{"", "uninstall"} {
		files, err := filepath.Glob(filepath.Join(dir, sub, "*.yaml"))
		if err != nil || len(files) == 0 {
			t.Fatalf("manifests in %s: %v", filepath.Join(dir, sub), err)
		}
		if err := os.MkdirAll(filepath.Join(out, sub), 0o755); err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			text := s.edit(t, filepath.Base(f), string(b))
			if err := os.WriteFile(filepath.Join(out, sub, filepath.Base(f)), []byte(text), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// nodeState is what must be the same before install and after uninstall.
type nodeState struct {
	Links, Tables, Routes, Files []string
}

// snapshot records node n's links, routes, nft tables and the files under
// dirs (paths as the node sees them).
func snapshot(t *testing.T, ctx context.Context, n *kubecluster.Node, dirs ...string) nodeState {
	t.Helper()
	var s nodeState
	if err := n.Do(func() error {
		links, err := netlink.LinkList()
		if err != nil {
			return err
		}
		for _, l := range links {
			s.Links = append(s.Links, l.Attrs().Name+" "+l.Attrs().Alias)
		}
		routes, err := netlink.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: 0}, netlink.RT_FILTER_TABLE)
		if err != nil {
			return err
		}
		for _, r := range routes {
			// IPv6 subnet-router anycast routes come with forwarding,
			// which the uninstall leaves on (documented).
			if r.Type == unix.RTN_ANYCAST {
				continue
			}
			s.Routes = append(s.Routes, r.String())
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	out, err := n.Command(ctx, "nft", "list", "tables").CombinedOutput()
	if err != nil {
		t.Fatalf("nft list tables: %v: %s", err, out)
	}
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" {
			s.Tables = append(s.Tables, l)
		}
	}
	for _, d := range dirs {
		d = n.HostPath(d)
		_ = filepath.WalkDir(d, func(p string, _ os.DirEntry, err error) error {
			if err == nil {
				s.Files = append(s.Files, p)
			}
			return nil
		})
	}
	for _, l := range [][]string{s.Links, s.Tables, s.Routes, s.Files} {
		sort.Strings(l)
	}
	return s
}

func TestInstallAsDocumented(t *testing.T) {
	testutil.RequireRoot(t)
	bin := kubecluster.BinDir()
	image := filepath.Join(bin, "images", "kurma.tar")
	if _, err := os.Stat(image); err != nil {
		t.Fatalf("%s not built (make image): %v", image, err)
	}
	// State folders of the nodes (the defaults are /var/lib/... and
	// /run/kurma): the first node's here and /run/kurma, the second's in
	// its own copies of them (Options.NodeDirs).
	root := t.TempDir()
	if _, err := os.Stat("/run/kurma"); err == nil {
		t.Skip("/run/kurma exists on this host: another Kurma install? (this test removes it)")
	}
	t.Cleanup(func() { _ = os.RemoveAll("/run/kurma") }) // when the test fails before the uninstall
	if err := os.MkdirAll(filepath.Join(root, "var/lib"), 0o755); err != nil {
		t.Fatal(err)
	}
	c := kubecluster.StartT(t, kubecluster.Options{ServiceAccounts: true, ControllerManager: true, Scheduler: true,
		SharedNetNS: true, Nodes: 2, NodeDirs: []string{"/run", root}})
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Minute)
	defer cancel()
	kubectl := func(args ...string) string {
		t.Helper()
		out, err := c.Kubectl(ctx, args...)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}

	s := settings{
		// The API server's real address, reached from every node.
		apiHost: kubecluster.NodeIP, apiPort: "6443", controllerURL: "http://" + kubecluster.NodeIP + ":9696",
		serviceCIDR: kubecluster.ServiceCIDR, netnsDir: c.NetNSDir,
		hostPaths: map[string]string{
			"/opt/cni/bin": c.CNIBinDir,
			"/etc/cni":     filepath.Dir(c.CNIConfDir),
			// The shim, run by containerd on the host, dials the
			// socket by its path in the conflist: the same on both sides.
			"/run/kurma":                "/run/kurma",
			"/run":                      "/run",
			"/var/lib/kurma-agent":      filepath.Join(root, "var/lib/kurma-agent"),
			"/var/lib/kurma-controller": filepath.Join(root, "var/lib/kurma-controller"),
			"/var/lib":                  filepath.Join(root, "var/lib"),
			"/var/run/netns":            c.NetNSDir,
		},
	}
	if filepath.Base(c.CNIConfDir) != "net.d" {
		t.Fatalf("the harness's conf dir %s is not <etc>/net.d", c.CNIConfDir)
	}
	manifests := filepath.Join(t.TempDir(), "kubernetes")
	s.writeManifests(t, filepath.Join(testutil.RepoRoot(t), "deploy", "kubernetes"), manifests)

	// Each node has the parent of the state folders, as a machine has
	// /var/lib (the second node's view of root starts empty).
	for _, n := range c.Nodes {
		if err := os.MkdirAll(n.HostPath(filepath.Join(root, "var/lib")), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	stateDirs := []string{filepath.Dir(c.CNIConfDir), c.CNIBinDir, root, "/run/kurma"}
	var before []nodeState
	for _, n := range c.Nodes {
		before = append(before, snapshot(t, ctx, n, stateDirs...))
	}

	// The install, as docs/install-kubernetes.md lists it.
	if err := c.ImportImage(ctx, image); err != nil {
		t.Fatal(err)
	}
	token := randHex(t)
	kubectl("-n", "kube-system", "create", "secret", "generic", "kurma-controller-token",
		"--from-literal=token="+token)
	kubectl("label", "node", c.NodeName, "kurma.dev/controller=true")
	applied := time.Now()
	kubectl("apply", "-f", manifests)

	ready := waitFor(t, ctx, "nodes Ready", func() (bool, string) {
		for _, node := range c.Nodes {
			n, err := c.Client.CoreV1().Nodes().Get(ctx, node.Name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			if !nodeReady(n) {
				return false, node.Name + " not Ready"
			}
		}
		return true, ""
	}, c)
	// Every Kurma pod Ready (probes: synced with the API server and the controller).
	waitFor(t, ctx, "kurma pods Ready", func() (bool, string) {
		pods, err := c.Client.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/part-of=kurma"})
		if err != nil {
			return false, err.Error()
		}
		// The controller, and a watcher and an agent on each node.
		if len(pods.Items) != 1+2*len(c.Nodes) {
			return false, fmt.Sprintf("%d pods", len(pods.Items))
		}
		for _, p := range pods.Items {
			if !podReady(&p) {
				return false, p.Name + " " + string(p.Status.Phase) + " not ready: " + podWhy(&p)
			}
		}
		return true, ""
	}, c)

	// A pod on each node and a ClusterIP Service in front of them.
	labels := map[string]string{"app": "k8sinstall-echo"}
	var pods []*corev1.Pod
	for _, n := range c.Nodes {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "k8sinstall-echo-" + n.Name, Namespace: "default", Labels: labels},
			Spec: corev1.PodSpec{NodeName: n.Name, TerminationGracePeriodSeconds: new(int64),
				Containers: []corev1.Container{{Name: "echo", Image: kubecluster.EchoImage,
					ImagePullPolicy: corev1.PullNever, Ports: []corev1.ContainerPort{{ContainerPort: 8080}}}}}}
		if _, err := c.Client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		pods = append(pods, pod)
	}
	var running time.Time
	for i, pod := range pods {
		at := waitFor(t, ctx, "pod Running", func() (bool, string) {
			p, err := c.Client.CoreV1().Pods("default").Get(ctx, pod.Name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			pods[i] = p
			return p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "", string(p.Status.Phase) + " " + podWhy(p)
		}, c)
		if running.IsZero() || at.Before(running) {
			running = at
		}
	}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "k8sinstall-echo", Namespace: "default"},
		Spec: corev1.ServiceSpec{Selector: labels, Ports: []corev1.ServicePort{{Name: "echo", Port: 80, TargetPort: intstr.FromInt32(8080)}}}}
	svc, err := c.Client.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "ClusterIP answers on the node", func() (bool, string) {
		got, err := echo(ctx, c.DialContext, svc.Spec.ClusterIP+":80")
		return err == nil && got == "hello", fmt.Sprint(got, err)
	}, c)
	// Pod to pod across the nodes (Kurma's overlay) and pod to the
	// ClusterIP, from a pod on each node.
	for _, from := range pods {
		dial := podDialer(t, c, from)
		for _, to := range pods {
			if got, err := echo(ctx, dial, to.Status.PodIP+":8080"); err != nil || got != "hello" {
				t.Errorf("pod %s (%s) → pod %s (%s): %q %v", from.Name, from.Spec.NodeName, to.Name, to.Spec.NodeName, got, err)
			}
		}
		waitFor(t, ctx, "ClusterIP answers from pod "+from.Name, func() (bool, string) {
			got, err := echo(ctx, dial, svc.Spec.ClusterIP+":80")
			return err == nil && got == "hello", fmt.Sprint(got, err)
		}, c)
	}
	if t.Failed() {
		t.FailNow()
	}
	fi, _ := os.Stat(image)
	t.Logf("FIGURES %d nodes; image tarball %.1f MiB; apply → all nodes Ready %v; apply → first pod Running %v", len(c.Nodes),
		float64(fi.Size())/(1<<20), ready.Sub(applied).Round(10*time.Millisecond), running.Sub(applied).Round(10*time.Millisecond))

	in := &installed{c: c, token: token, pods: pods, svc: svc, kubectl: kubectl}
	in.upgrade(t, ctx)
	in.chaosRollout(t, ctx)
	in.agentAtRest(t)

	// The uninstall, as documented: workloads first, then Kurma's
	// DaemonSet and Deployments, then the uninstall DaemonSet, then the rest.
	if err := c.Client.CoreV1().Services("default").Delete(ctx, svc.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, pod := range pods {
		kubectl("delete", "pod", pod.Name, "--wait=true", "--timeout=2m")
	}
	kubectl("-n", "kube-system", "delete", "daemonset/kurma-agent", "deployment/kurma-k8s-watcher",
		"deployment/kurma-controller", "--wait=true", "--timeout=2m")
	waitFor(t, ctx, "kurma pods gone", func() (bool, string) {
		pods, err := c.Client.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/part-of=kurma"})
		return err == nil && len(pods.Items) == 0, fmt.Sprint(err)
	}, c)
	kubectl("apply", "-f", filepath.Join(manifests, "uninstall"))
	kubectl("-n", "kube-system", "rollout", "status", "daemonset/kurma-uninstall", "--timeout=3m")
	kubectl("delete", "-f", filepath.Join(manifests, "uninstall"), "--wait=true", "--timeout=2m")
	kubectl("delete", "-f", manifests, "--ignore-not-found", "--wait=true", "--timeout=2m")
	kubectl("-n", "kube-system", "delete", "secret", "kurma-controller-token")
	kubectl("label", "node", c.NodeName, "kurma.dev/controller-")
	waitFor(t, ctx, "uninstall pods gone", func() (bool, string) {
		pods, err := c.Client.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/part-of=kurma"})
		return err == nil && len(pods.Items) == 0, fmt.Sprint(err)
	}, c)

	for i, n := range c.Nodes {
		after := snapshot(t, ctx, n, stateDirs...)
		for _, d := range []struct {
			what          string
			before, after []string
		}{{"links", before[i].Links, after.Links}, {"nft tables", before[i].Tables, after.Tables},
			{"routes", before[i].Routes, after.Routes}, {"files", before[i].Files, after.Files}} {
			if !slices.Equal(d.before, d.after) {
				t.Errorf("node %s: %s differ after uninstall:\nbefore %q\nafter  %q", n.Name, d.what, d.before, d.after)
			}
		}
	}
}

func nodeReady(n *corev1.Node) bool {
	for _, cond := range n.Status.Conditions {
		if cond.Type == corev1.NodeReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}

// dialer dials addr from some network namespace.
type dialer func(ctx context.Context, network, addr string) (net.Conn, error)

// podDialer returns a dialer from inside pod p's network namespace.
func podDialer(t *testing.T, c *kubecluster.Cluster, p *corev1.Pod) dialer {
	t.Helper()
	do := podNS(t, c, p)
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		var conn net.Conn
		err := do(func() error {
			var d net.Dialer
			var err error
			conn, err = d.DialContext(ctx, network, addr)
			return err
		})
		return conn, err
	}
}

// podNS returns a function that runs f inside pod p's network namespace.
func podNS(t *testing.T, c *kubecluster.Cluster, p *corev1.Pod) inNS {
	t.Helper()
	path, err := c.PodNetNS(p)
	if err != nil {
		t.Fatal(err)
	}
	pns, err := ns.GetNS(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pns.Close() })
	return func(f func() error) error { return pns.Do(func(ns.NetNS) error { return f() }) }
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func podWhy(p *corev1.Pod) string {
	var b strings.Builder
	for _, cs := range append(p.Status.InitContainerStatuses, p.Status.ContainerStatuses...) {
		if w := cs.State.Waiting; w != nil {
			fmt.Fprintf(&b, "%s waiting %s %s; ", cs.Name, w.Reason, w.Message)
		}
		if x := cs.LastTerminationState.Terminated; x != nil {
			fmt.Fprintf(&b, "%s last exit %d %s; ", cs.Name, x.ExitCode, x.Message)
		}
	}
	for _, c := range p.Status.Conditions {
		if c.Status != corev1.ConditionTrue && c.Message != "" {
			fmt.Fprintf(&b, "%s: %s; ", c.Type, c.Message)
		}
	}
	return b.String()
}

// echo sends "hello" to the echo app at addr through dial and returns
// the line it answers.
func echo(ctx context.Context, dial dialer, addr string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	conn, err := dial(ctx, "tcp", addr)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := conn.Write([]byte("hello\n")); err != nil {
		return "", err
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	return strings.TrimSpace(line), err
}

// waitFor polls cond until it holds and returns when it first did; on the
// test's deadline it fails with cond's last word and the Kurma pods' logs.
func waitFor(t *testing.T, ctx context.Context, what string, cond func() (bool, string), c *kubecluster.Cluster) time.Time {
	t.Helper()
	last := ""
	for {
		ok, why := cond()
		if ok {
			return time.Now()
		}
		last = why
		select {
		case <-ctx.Done():
			logs := podLogs(c)
			pods, _ := c.Kubectl(context.Background(), "get", "pods", "-A", "-o", "wide")
			t.Fatalf("%s: not reached (%s)\npods:\n%s\nkurma logs:\n%s", what, last, pods, logs)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func randHex(t *testing.T) string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// podLogs returns the tails of the Kurma pods' container logs, read from
// the kubelet's log folder (kubectl logs needs a kubelet the API server
// can reach; this one listens on loopback).
func podLogs(c *kubecluster.Cluster) string {
	var b strings.Builder
	var files []string
	for _, n := range c.Nodes {
		f, _ := filepath.Glob(filepath.Join(n.Dir, "kubelet", "pod-logs", "kube-system_kurma*", "*", "*.log"))
		files = append(files, f...)
	}
	for _, f := range files {
		data, _ := os.ReadFile(f)
		if len(data) > 3000 {
			data = data[len(data)-3000:]
		}
		fmt.Fprintf(&b, "--- %s\n%s\n", f, data)
	}
	return b.String()
}
