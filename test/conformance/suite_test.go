package conformance

import (
	"context"
	"encoding/xml"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kurma.dev/kurma/internal/kube/cniwire"
	"kurma.dev/kurma/internal/kube/kubetest"
	"kurma.dev/kurma/internal/testutil"
	"kurma.dev/kurma/internal/testutil/kubecluster"
)

// Peers of a run.
const (
	Kurma     = "kurma"
	KubeProxy = "kube-proxy"
	// KNP is kube-network-policies (sig-network's reference
	// NetworkPolicy implementation, nfqueue based) on top of the
	// kube-proxy peer: the peer of the netpol set.
	KNP = "kube-network-policies"
)

// CoreDNSImage is the name hack/conformance-images.sh gives CoreDNS.
const CoreDNSImage = "kurma.dev/conformance-coredns:v1.15.0"

// podCIDR is the bridge peer's pod range (host-local) and kube-proxy's
// --cluster-cidr.
const podCIDR = "10.244.0.0/16"

// Set is a selection of upstream specs.
type Set struct {
	Name        string
	Focus, Skip string
	// Procs is the number of parallel ginkgo processes.
	Procs int
	// Wait bounds the wait for the host's cluster lock and the start
	// (default 20 minutes; TestUpstream, a long run of its own, 2 hours).
	Wait time.Duration
	// Peers run when KURMA_CONFORMANCE_PEERS is empty (default: Kurma,
	// then kube-proxy).
	Peers []string
	// Nodes is the number of nodes of each peer's cluster (default 1;
	// KURMA_CONFORMANCE_NODES). With 2, the specs that need two nodes run:
	// Kurma's agent runs on each node (VXLAN between them), and the peer's
	// kube-proxy and bridge (a pod range per node, routed over the
	// underlay).
	Nodes int
}

// Sets by name (KURMA_CONFORMANCE_SET).
var Sets = map[string]Set{
	// The 47 sig-network Conformance specs of v1.37.1.
	"conformance": {Name: "conformance", Focus: `\[sig-network\].*\[Conformance\]`, Procs: 4},
	// All of sig-network but feature-gated, disruptive, flaky and
	// cloud-only specs (a provider, a cloud load balancer, SSH to nodes).
	"network": {Name: "network", Focus: `\[sig-network\]`,
		Skip:  `\[Feature:|\[Disruptive\]|\[Flaky\]|\[Serial\]\s*\[Slow\]|\[Provider:|LoadBalancers|ESIPP|\[Alpha\]|\[Beta\]`,
		Procs: 4},
	// The upstream NetworkPolicy suite (test/e2e/network/netpol). The
	// three cases that send SCTP ([Feature:SCTPConnectivity]) are skipped:
	// this kernel has no SCTP sockets (socket(AF_INET, SOCK_STREAM,
	// IPPROTO_SCTP) fails with EPROTONOSUPPORT), so their servers cannot
	// listen. The two TCP cases about SCTP policies run.
	"netpol": {Name: "netpol", Focus: `\[Feature:NetworkPolicy\]`, Skip: `\[Feature:SCTPConnectivity\]`,
		Procs: 4, Peers: []string{Kurma, KNP}},
}

// Result is the outcome of one spec.
type Result struct {
	Name    string
	State   string // passed, failed, skipped
	Message string // first line of the failure or skip reason
	Time    time.Duration
}

// Run is one peer's run of a set.
type Run struct {
	Peer    string
	Set     Set
	Results []Result
	Wall    time.Duration
	Dir     string
}

// Count returns how many results are in state.
func (r Run) Count(state string) int {
	n := 0
	for _, x := range r.Results {
		if x.State == state {
			n++
		}
	}
	return n
}

// clusterOptions is what the suite assumes of a cluster of nodes nodes.
func clusterOptions(nodes int) kubecluster.Options {
	bin := kubecluster.BinDir()
	return kubecluster.Options{Nodes: nodes, ControllerManager: true, Scheduler: true, PublicAPIServer: true, KubeletAPI: true,
		ClusterDNS: kubecluster.ClusterDNSIP,
		Images: []string{filepath.Join(bin, "images", "conformance-agnhost.tar"),
			filepath.Join(bin, "images", "conformance-coredns.tar"), filepath.Join(bin, "images", "conformance-r74839.tar")}}
}

// requireBuild skips unless `make e2e conformance-images` ran.
func requireBuild(t *testing.T) {
	t.Helper()
	testutil.RequireRoot(t)
	bin := kubecluster.BinDir()
	for _, f := range []string{"e2e/e2e.test", "e2e/ginkgo", "images/conformance-agnhost.tar", "images/conformance-coredns.tar", "images/conformance-r74839.tar"} {
		if _, err := os.Stat(filepath.Join(bin, f)); err != nil {
			t.Skipf("%s missing: make e2e conformance-images", f)
		}
	}
}

// startKurma starts a cluster of nodes nodes whose CNI is the kurma-k8s
// driver with portmap chained, the controller, the watcher and each node's
// agent (the Service proxy: no kube-proxy), and CoreDNS.
func startKurma(t *testing.T, ctx context.Context, wait time.Duration, nodes int) *kubecluster.Cluster {
	sockDir, err := os.MkdirTemp("", "kurma-cf-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(sockDir) })
	sock := filepath.Join(sockDir, "cni.sock")
	cniBin := t.TempDir()
	bin := kubecluster.BinDir()
	for _, l := range [][2]string{{"kurma-k8s", "kurma-k8s"}, {"cni/portmap", "portmap"}, {"cni/loopback", "loopback"}} {
		if err := os.Symlink(filepath.Join(bin, l[0]), filepath.Join(cniBin, l[1])); err != nil {
			t.Fatal(err)
		}
	}
	opts := clusterOptions(nodes)
	opts.CNIConfList, opts.CNIBinDir = cniwire.ConfList(sock, true), cniBin
	if nodes > 1 {
		// The conflist names one socket path; each node sees its own
		// folder there, where its agent listens.
		opts.NodeDirs = []string{sockDir}
	}
	if wait <= 0 {
		wait = 20 * time.Minute
	}
	e := kubetest.StartWithin(t, wait, opts)
	e.StartWatcher("--service-cidr", kubecluster.ServiceCIDR)
	e.StartAgentAt(e.C.NodeName, kubecluster.NodeIP, sock, "--service-cidr", kubecluster.ServiceCIDR,
		"--node-ip", kubecluster.NodeIP, "--proxy-healthz-listen", "0.0.0.0:10256", "--proxy-status-listen", "127.0.0.1:10249")
	for _, n := range e.C.Nodes[1:] {
		e.StartAgentOn(n, sock, "--service-cidr", kubecluster.ServiceCIDR, "--node-ip", n.IP)
	}
	// Runs before the agent stops (cleanups run last-in first-out): the
	// sandboxes go while their CNI DEL can still reach the agent.
	t.Cleanup(func() { removePods(t, e.C) })
	deployDNS(t, ctx, e.C)
	return e.C
}

// removePods deletes CoreDNS and every pod left and waits until the nodes
// hold no container.
func removePods(t *testing.T, c *kubecluster.Cluster) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	kc := c.Client
	// Owners first, so that nothing recreates the pods: the specs'
	// namespaces (a run cut short leaves them), then CoreDNS.
	if nss, err := kc.CoreV1().Namespaces().List(ctx, metav1.ListOptions{}); err == nil {
		for _, n := range nss.Items {
			if n.Name != "default" && !strings.HasPrefix(n.Name, "kube-") {
				_ = kc.CoreV1().Namespaces().Delete(ctx, n.Name, metav1.DeleteOptions{})
			}
		}
	}
	_ = kc.AppsV1().Deployments("kube-system").Delete(ctx, "coredns", metav1.DeleteOptions{})
	zero := int64(0)
	if pods, err := kc.CoreV1().Pods("").List(ctx, metav1.ListOptions{}); err == nil {
		for _, p := range pods.Items {
			_ = kc.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
		}
	}
	if err := c.WaitNoPods(ctx, "", ""); err != nil {
		t.Logf("pods left: %v", err)
	}
	for _, n := range c.Nodes {
		for ctx.Err() == nil {
			out, err := exec.CommandContext(ctx, "ctr", "-a", n.ContainerdSocket, "-n", "k8s.io", "containers", "ls", "-q").Output()
			if err == nil && strings.TrimSpace(string(out)) == "" {
				break
			}
			time.Sleep(300 * time.Millisecond)
		}
		if ctx.Err() != nil {
			t.Logf("containers left on node %s after the pods were deleted", n.Name)
			return
		}
	}
}

// startKubeProxy starts the peer on nodes nodes: bridge + host-local +
// portmap, with pod range 10.244.i.0/24 on node i, each node routing the
// others' ranges to their underlay address; kube-proxy in nftables mode on
// every node; and CoreDNS.
func startKubeProxy(t *testing.T, ctx context.Context, nodes int) *kubecluster.Cluster {
	opts := clusterOptions(nodes)
	for i := range max(nodes, 1) {
		opts.CNIConfLists = append(opts.CNIConfLists, kubecluster.BridgeConfList("cfbr0", podRange(i), t.TempDir()))
	}
	opts.CNIConfList = opts.CNIConfLists[0]
	opts.ChainPortmap = true
	c, err := kubecluster.Start(ctx, opts)
	if err != nil {
		t.Fatalf("start cluster: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("close cluster: %v", err)
		}
	})
	for i, n := range c.Nodes {
		for j, to := range c.Nodes {
			if i == j {
				continue
			}
			if out, err := n.Command(ctx, "ip", "route", "add", podRange(j), "via", to.IP).CombinedOutput(); err != nil {
				t.Fatalf("route %s on %s: %v: %s", podRange(j), n.Name, err, out)
			}
		}
	}
	for _, n := range c.Nodes {
		if _, err := n.StartKubeProxy(ctx, "--cluster-cidr="+podCIDR); err != nil {
			t.Fatal(err)
		}
	}
	deployDNS(t, ctx, c)
	return c
}

// podRange is the bridge peer's pod range on node i, within podCIDR.
func podRange(i int) string { return fmt.Sprintf("10.244.%d.0/24", i) }

func deployDNS(t *testing.T, ctx context.Context, c *kubecluster.Cluster) {
	t.Helper()
	if err := c.DeployCoreDNS(ctx, CoreDNSImage, 1); err != nil {
		for _, n := range []string{"kube-controller-manager", "kubelet"} {
			t.Logf("--- %s ---\n%s", n, c.Logs(n, 3000))
		}
		t.Fatal(err)
	}
}

// runSuite starts peer's cluster, runs set's specs with the ginkgo CLI
// inside the cluster's namespace, and returns the results read from the
// JUnit report under bin/conformance/<set>/<label>.
func runSuite(t *testing.T, peer string, set Set, label string) Run {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Hour)
	defer cancel()
	var c *kubecluster.Cluster
	switch peer {
	case Kurma:
		c = startKurma(t, ctx, set.Wait, set.Nodes)
	case KubeProxy:
		c = startKubeProxy(t, ctx, set.Nodes)
	case KNP:
		c = startKNP(t, ctx)
	default:
		t.Fatalf("unknown peer %q", peer)
	}
	bin := kubecluster.BinDir()
	dir := filepath.Join(bin, "conformance", set.Name, label)
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	args := []string{"--procs=" + strconv.Itoa(set.Procs), "--timeout=3h", "--no-color", "--silence-skips",
		"--junit-report=junit.xml", "--output-dir=" + dir, "--focus=" + set.Focus}
	if set.Skip != "" {
		args = append(args, "--skip="+set.Skip)
	}
	args = append(args, filepath.Join(bin, "e2e", "e2e.test"), "--",
		"--kubeconfig="+c.Kubeconfig, "--provider=local", "--kubectl-path="+filepath.Join(bin, "k8s", "kubectl"),
		"--report-dir="+dir, "--disable-log-dump=true", "--dns-domain=cluster.local",
		// The suite counts the nodes only in its first process; the specs
		// that the other processes run would see -1 and skip themselves
		// ("Requires at least 2 nodes (not -1)"), differently per run.
		"--num-nodes="+strconv.Itoa(len(c.Nodes)))
	log, err := os.Create(filepath.Join(dir, "ginkgo.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	cmd := c.Command(ctx, filepath.Join(bin, "e2e", "ginkgo"), args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.Env = append(cmd.Env, "HOME="+dir)
	start := time.Now()
	runErr := cmd.Run()
	run := Run{Peer: peer, Set: set, Wall: time.Since(start), Dir: dir}
	if run.Results, err = readJUnit(filepath.Join(dir, "junit.xml")); err != nil {
		t.Fatalf("%s: no report (%v): %v; see %s", peer, runErr, err, log.Name())
	}
	t.Logf("%s: %d passed, %d failed, %d skipped in %s (ginkgo: %v; log %s)", peer, run.Count("passed"),
		run.Count("failed"), run.Count("skipped"), run.Wall.Round(time.Second), runErr, log.Name())
	if run.Count("failed") > 0 {
		// The cluster's folder goes with it: keep its components' logs
		// (agents, watcher, controller, kubelets, kube-proxy) beside the
		// report, to read a failure after the run.
		if err := copyLogs(filepath.Join(c.Dir, "logs"), filepath.Join(dir, "cluster-logs")); err != nil {
			t.Logf("%s: keep the cluster's logs: %v", peer, err)
		}
	}
	return run
}

// copyLogs copies the regular files of folder from into folder to.
func copyLogs(from, to string) error {
	ents, err := os.ReadDir(from)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(to, 0o755); err != nil {
		return err
	}
	for _, e := range ents {
		if !e.Type().IsRegular() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(from, e.Name()))
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(to, e.Name()), b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

type junitSuites struct {
	Suites []struct {
		Cases []struct {
			Name    string  `xml:"name,attr"`
			Time    float64 `xml:"time,attr"`
			Status  string  `xml:"status,attr"`
			Skipped *struct {
				Message string `xml:"message,attr"`
			} `xml:"skipped"`
			Failure *struct {
				Message string `xml:"message,attr"`
				Text    string `xml:",chardata"`
			} `xml:"failure"`
			Error *struct {
				Message string `xml:"message,attr"`
			} `xml:"error"`
		} `xml:"testcase"`
	} `xml:"testsuite"`
}

// readJUnit reads ginkgo's JUnit report, keeping the specs (not the
// suite's set-up nodes) that ran or were skipped by the suite itself.
func readJUnit(path string) ([]Result, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var s junitSuites
	if err := xml.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var out []Result
	for _, su := range s.Suites {
		for _, tc := range su.Cases {
			if !strings.HasPrefix(tc.Name, "[It]") {
				if tc.Failure != nil || tc.Error != nil { // a failed BeforeSuite and the like
					out = append(out, Result{Name: tc.Name, State: "failed", Message: firstLine(failureText(tc.Failure, tc.Error))})
				}
				continue
			}
			r := Result{Name: strings.TrimSpace(strings.TrimPrefix(tc.Name, "[It]")), Time: time.Duration(tc.Time * float64(time.Second))}
			switch {
			case tc.Failure != nil || tc.Error != nil:
				r.State, r.Message = "failed", firstLine(failureText(tc.Failure, tc.Error))
			case tc.Skipped != nil || tc.Status == "skipped" || tc.Status == "pending":
				r.State = "skipped"
				if tc.Skipped != nil {
					r.Message = firstLine(tc.Skipped.Message)
				}
				if r.Message == "" || r.Message == "skipped" {
					continue // not selected by the focus (ginkgo lists them too)
				}
			default:
				r.State = "passed"
			}
			out = append(out, r)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

func failureText(f *struct {
	Message string `xml:"message,attr"`
	Text    string `xml:",chardata"`
}, e *struct {
	Message string `xml:"message,attr"`
}) string {
	if f != nil {
		if f.Message != "" {
			return f.Message
		}
		return f.Text
	}
	return e.Message
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	return s
}

// table renders the runs side by side, one line per spec, and a closing
// line per peer.
func table(runs []Run) string {
	byName := map[string]map[string]Result{}
	var names []string
	for _, r := range runs {
		for _, x := range r.Results {
			if byName[x.Name] == nil {
				byName[x.Name] = map[string]Result{}
				names = append(names, x.Name)
			}
			byName[x.Name][r.Peer] = x
		}
	}
	sort.Strings(names)
	var b strings.Builder
	b.WriteString("| spec |")
	for _, r := range runs {
		b.WriteString(" " + r.Peer + " |")
	}
	b.WriteString("\n|---|")
	for range runs {
		b.WriteString("---|")
	}
	b.WriteString("\n")
	for _, n := range names {
		b.WriteString("| " + strings.ReplaceAll(n, "|", `\|`) + " |")
		for _, r := range runs {
			x, ok := byName[n][r.Peer]
			st := x.State
			if !ok {
				st = "-"
			}
			b.WriteString(" " + st + " |")
		}
		b.WriteString("\n")
	}
	for _, r := range runs {
		fmt.Fprintf(&b, "%s (%s): %d passed, %d failed, %d skipped, suite wall time %s\n", r.Peer, r.Set.Name,
			r.Count("passed"), r.Count("failed"), r.Count("skipped"), r.Wall.Round(time.Second))
	}
	for _, r := range runs {
		for _, x := range r.Results {
			if x.State == "failed" {
				fmt.Fprintf(&b, "FAIL %s: %s: %s\n", r.Peer, x.Name, x.Message)
			}
		}
	}
	return b.String()
}

// TestUpstream runs KURMA_CONFORMANCE_SET (make conformance) for each peer
// of KURMA_CONFORMANCE_PEERS, one cluster after the other, prints the table
// and fails when Kurma fails a spec that the other peer passes (or any
// spec, when the peer did not run).
func TestUpstream(t *testing.T) {
	name := os.Getenv("KURMA_CONFORMANCE_SET")
	if name == "" {
		t.Skip("make conformance runs it (KURMA_CONFORMANCE_SET)")
	}
	set, ok := Sets[name]
	if !ok {
		t.Fatalf("KURMA_CONFORMANCE_SET=%q: want one of conformance, network, netpol", name)
	}
	if p := os.Getenv("KURMA_CONFORMANCE_PROCS"); p != "" {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 {
			t.Fatalf("KURMA_CONFORMANCE_PROCS=%q", p)
		}
		set.Procs = n
	}
	if v := os.Getenv("KURMA_CONFORMANCE_NODES"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 8 {
			t.Fatalf("KURMA_CONFORMANCE_NODES=%q: want 1 to 8", v)
		}
		if set.Nodes = n; n > 1 {
			// Reports of their own, beside the one-node run's.
			set.Name += "-" + v + "nodes"
		}
	}
	if f := os.Getenv("KURMA_CONFORMANCE_FOCUS"); f != "" {
		// A rerun of some specs of the set (make conformance
		// CONFORMANCE_FOCUS=...): its reports go to a folder of their own.
		set.Focus, set.Name = f, set.Name+"-focus"
	}
	requireBuild(t)
	set.Wait = 2 * time.Hour // queued behind other clusters
	peers := strings.Split(os.Getenv("KURMA_CONFORMANCE_PEERS"), ",")
	if peers[0] == "" {
		peers = set.Peers
	}
	if len(peers) == 0 {
		peers = []string{Kurma, KubeProxy}
	}
	var runs []Run
	for _, p := range peers {
		t.Run(p, func(t *testing.T) { runs = append(runs, runSuite(t, p, set, p)) })
	}
	out := table(runs)
	fmt.Print(out)
	if err := os.MkdirAll(filepath.Join(kubecluster.BinDir(), "conformance", set.Name), 0o755); err != nil {
		t.Error(err)
	}
	if err := os.WriteFile(filepath.Join(kubecluster.BinDir(), "conformance", set.Name, "table.md"), []byte(out), 0o644); err != nil {
		t.Error(err)
	}
	peerPassed := map[string]bool{}
	for _, r := range runs {
		if r.Peer != Kurma {
			for _, x := range r.Results {
				peerPassed[x.Name] = x.State == "passed"
			}
		}
	}
	for _, r := range runs {
		if r.Peer != Kurma {
			continue
		}
		for _, x := range r.Results {
			if x.State == "failed" && (len(peerPassed) == 0 || peerPassed[x.Name]) {
				t.Errorf("kurma fails %s: %s", x.Name, x.Message)
			}
		}
	}
}

// fast is the subset of `make test`: one upstream spec per data-plane
// feature (DNS through the kube-dns Service, whose CoreDNS reaches the API
// server through the `kubernetes` Service; NodePort; hostPort; session
// affinity; members per Service port across EndpointSlices; multi-port
// Services; node-to-pod UDP).
var fast = Set{Name: "fast", Procs: 4, Focus: `\[sig-network\] (` + strings.Join([]string{
	`DNS should provide DNS for services `,
	`Services should be able to create a functioning NodePort service `,
	`HostPort validates that there is no conflict between pods with same hostPort but different hostIP and protocol`,
	`Services should have session affinity work for service with type clusterIP `,
	`EndpointSlice should support a Service with multiple endpoint IPs specified in multiple EndpointSlices`,
	`Services should serve multiport endpoints from pods `,
	`Networking Granular Checks: Pods should function for node-pod communication: udp `,
}, "|") + `)`}

// TestFast runs the fast subset on Kurma (make test): every spec must pass.
func TestFast(t *testing.T) {
	requireBuild(t)
	run := runSuite(t, Kurma, fast, Kurma)
	fmt.Print(table([]Run{run}))
	if n := len(run.Results); n != 7 {
		t.Errorf("%d specs ran, want 7 (names changed upstream?)", n)
	}
	for _, x := range run.Results {
		if x.State != "passed" {
			t.Errorf("%s: %s: %s", x.Name, x.State, x.Message)
		}
	}
}
