package k8sinstall

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kurma.dev/kurma/internal/testutil/kubecluster"
)

// installed is a cluster with Kurma installed as documented, for the
// phases that run between the install and the uninstall.
type installed struct {
	c       *kubecluster.Cluster
	token   string          // the controller's bearer token
	pods    []*corev1.Pod   // an echo pod on each node
	svc     *corev1.Service // ClusterIP in front of pods
	kubectl func(args ...string) string
}

// clientStats is what a Service client saw during a disruption.
type clientStats struct {
	established error         // the first failure of the long-lived connection
	maxGap      time.Duration // the longest outage of new connections (see serviceClient)
	gapEnd      time.Time     // when it ended
	ok, failed  int           // new connections
	maxLate     time.Duration // the longest the client looked late at an attempt (not scheduled)
	events      []connEvent   // every new connection's outcome
}

// connEvent is one new connection: the pod that answered, or the error.
type connEvent struct {
	start, at time.Time // at: when the handshake completed (the kernel's word), or when the attempt failed
	answer    string
	err       error
}

// Timing of serviceClient's new connections: each gets newConnTimeout for
// its handshake (a lost SYN is retried by a new connection, not by TCP's
// 1 s retransmission) and answerTimeout for the echo app's answer (the
// app runs in a BestEffort pod, which gets next to no CPU while a
// Burstable agent of its node starts: up to a second seen, the app's
// scheduling, not the path's), then the next starts newConnPause later.
const (
	newConnTimeout = 250 * time.Millisecond
	answerTimeout  = 2 * time.Second
	newConnPause   = 20 * time.Millisecond
)

// failureKinds counts the new connections that failed, by kind.
func failureKinds(events []connEvent) string {
	n := map[string]int{}
	for _, e := range events {
		switch {
		case e.err == nil && e.answer != "":
			continue
		case e.err == nil:
			n["empty answer"]++
		case errors.Is(e.err, syscall.ECONNREFUSED):
			n["refused"]++
		case errors.Is(e.err, os.ErrDeadlineExceeded) || errors.Is(e.err, context.DeadlineExceeded) || os.IsTimeout(e.err):
			n["timeout"]++
		case errors.Is(e.err, syscall.ECONNRESET) || errors.Is(e.err, io.EOF):
			n["reset"]++
		default:
			n["other"]++
		}
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(n)) {
		parts = append(parts, fmt.Sprintf("%s %d", k, n[k]))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// serviceClient keeps one connection to addr (a line echoed every 50 ms)
// and opens new ones back to back from the namespace do enters, until
// stop is closed. Each new one is judged by the kernel (probeOnce), so
// that a client the scheduler left waiting is not taken for a path that
// lost its packets: it counts as answered when the kernel completed its
// handshake within newConnTimeout of the connect (TCP_INFO: the SYN's
// RTT, nothing retransmitted) and the answer arrived within
// answerTimeout of the request (TCP_INFO: time since the last data),
// however late the client got to look. An outage is what lies between
// two answered connections with at least one failed between them: from
// the first's answer (the last the path was seen to carry) to the
// second's handshake (the first it was seen to carry again), an upper
// bound of the time the path carried no new connection. Answered connections with none failed
// between them make no outage, however far apart the client's
// scheduling put them.
func serviceClient(ctx context.Context, dial dialer, do inNS, addr string, stop <-chan struct{}) (func() clientStats, error) {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return nil, err
	}
	conn, err := dial(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	var (
		mu sync.Mutex
		st clientStats
		wg sync.WaitGroup
	)
	wg.Add(2)
	go func() {
		defer wg.Done()
		defer conn.Close()
		r := bufio.NewReader(conn)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			msg := "established-" + strconv.Itoa(i)
			_ = conn.SetDeadline(time.Now().Add(3 * time.Second))
			_, err := conn.Write([]byte(msg + "\n"))
			var line string
			if err == nil {
				line, err = r.ReadString('\n')
			}
			if err == nil && strings.TrimSpace(line) != msg {
				err = fmt.Errorf("answered %q to %q", line, msg)
			}
			if err != nil {
				mu.Lock()
				st.established = fmt.Errorf("message %d: %w", i, err)
				mu.Unlock()
				return
			}
		}
	}()
	go func() {
		defer wg.Done()
		last, failed := time.Now(), false
		for {
			select {
			case <-stop:
				mu.Lock()
				if failed {
					st.maxGap = max(st.maxGap, time.Since(last))
				}
				mu.Unlock()
				return
			default:
			}
			a := probeOnce(do, ap, "hostname", newConnTimeout, answerTimeout)
			mu.Lock()
			e := connEvent{start: a.start, at: a.connected, answer: a.answer, err: a.err}
			if a.err != nil {
				e.at = time.Now()
			}
			st.events = append(st.events, e)
			st.maxLate = max(st.maxLate, a.late)
			if a.err == nil && a.answer != "" {
				st.ok++
				if failed && a.connected.Sub(last) > st.maxGap {
					st.maxGap, st.gapEnd = a.connected.Sub(last), a.connected
				}
				last, failed = a.answered, false
			} else {
				st.failed++
				failed = true
			}
			mu.Unlock()
			select {
			case <-stop:
			case <-time.After(newConnPause):
			}
		}
	}()
	return func() clientStats {
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		return st
	}, nil
}

// podAddrs returns the IPv4 addresses on pod p's interfaces (lo aside).
func podAddrs(t *testing.T, c *kubecluster.Cluster, p *corev1.Pod) []string {
	t.Helper()
	path, err := c.PodNetNS(p)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	if err := ns.WithNetNSPath(path, func(ns.NetNS) error {
		addrs, err := netlink.AddrList(nil, netlink.FAMILY_V4)
		if err != nil {
			return err
		}
		for _, a := range addrs {
			if !a.IP.IsLoopback() {
				out = append(out, a.IP.String())
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// upgrade rolls the agent DaemonSet to a new tag of the same image (a
// changed template) while a client pod keeps a connection to the Service
// and opens new ones: the connection must survive, new ones must not stop
// answering for more than a second, and no pod may lose its address.
func (in *installed) upgrade(t *testing.T, ctx context.Context) {
	c := in.c
	const tag = "kurma.dev/kurma:k8sinstall-upgrade"
	for _, n := range c.Nodes {
		out, err := n.Command(ctx, "ctr", "--address", n.ContainerdSocket, "-n", "k8s.io", "images", "tag",
			"--force", "kurma.dev/kurma:latest", tag).CombinedOutput()
		if err != nil {
			t.Fatalf("ctr images tag on %s: %v: %s", n.Name, err, out)
		}
	}
	addrsBefore := map[string][]string{}
	for _, p := range in.pods {
		addrsBefore[p.Name] = podAddrs(t, c, p)
	}
	client := in.pods[len(in.pods)-1] // on the last node
	// What changes in each node's kernel meanwhile: an agent restart must
	// leave the datapath as it is (nothing removed and added back).
	var mons []*monitor
	for _, n := range c.Nodes {
		mons = append(mons, startMonitor(t, ctx, n, "nft", "monitor"),
			startMonitor(t, ctx, n, "ip", "monitor", "link", "address", "route", "neigh"))
	}
	stop := make(chan struct{})
	wait, err := serviceClient(ctx, podDialer(t, c, client), podNS(t, c, client), in.svc.Spec.ClusterIP+":80", stop)
	if err != nil {
		t.Fatal(err)
	}
	// The same from the client straight to each pod (no Service): when
	// the Service stops answering, these say which path did.
	var direct []func() clientStats
	for _, p := range in.pods {
		w, err := serviceClient(ctx, podDialer(t, c, client), podNS(t, c, client), p.Status.PodIP+":8080", stop)
		if err != nil {
			t.Fatal(err)
		}
		direct = append(direct, w)
	}
	countersBefore := in.counters(t, ctx, client)
	start := time.Now()
	in.kubectl("-n", "kube-system", "set", "image", "daemonset/kurma-agent", "agent="+tag)
	in.kubectl("-n", "kube-system", "rollout", "status", "daemonset/kurma-agent", "--timeout=4m")
	rolled := time.Since(start)
	// Every new agent Ready (synced), then a second more of traffic.
	waitFor(t, ctx, "upgraded agents Ready", func() (bool, string) {
		pods, err := c.Client.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=kurma-agent"})
		if err != nil {
			return false, err.Error()
		}
		if len(pods.Items) != len(c.Nodes) {
			return false, fmt.Sprintf("%d agents", len(pods.Items))
		}
		for _, p := range pods.Items {
			if p.Spec.Containers[0].Image != tag || !podReady(&p) {
				return false, p.Name + " not upgraded or not Ready"
			}
		}
		return true, ""
	}, c)
	settle := time.NewTimer(time.Second)
	<-settle.C
	close(stop)
	st := wait()
	var directSt []clientStats
	for _, w := range direct {
		directSt = append(directSt, w())
	}
	countersAfter := in.counters(t, ctx, client)
	t.Logf("FIGURES upgrade: rollout %v; new connections %d answered, %d failed (%s), longest gap %v (client late by up to %v); established: %v",
		rolled.Round(10*time.Millisecond), st.ok, st.failed, failureKinds(st.events), st.maxGap.Round(time.Millisecond),
		st.maxLate.Round(time.Millisecond), st.established)
	for i, ds := range directSt {
		t.Logf("upgrade: straight to pod %s: longest gap %v, %d answered, %d failed (%s)", in.pods[i].Name,
			ds.maxGap.Round(time.Millisecond), ds.ok, ds.failed, failureKinds(ds.events))
	}
	if st.established != nil {
		t.Errorf("the established connection broke during the upgrade: %v", st.established)
	}
	for _, m := range mons {
		for _, l := range m.lines() {
			// Dynamic neighbour entries come and go with traffic (and
			// are garbage-collected); nothing of Kurma's may be removed:
			// no rule, set, element, link, address, route or permanent
			// neighbour or FDB entry.
			neigh := strings.Contains(l.text, " lladdr ") || strings.HasSuffix(strings.TrimSpace(l.text), "FAILED") ||
				strings.HasSuffix(strings.TrimSpace(l.text), "INCOMPLETE") ||
				strings.Contains(l.text, " master ") && !strings.Contains(l.text, "permanent") && !strings.Contains(l.text, "static") // learned FDB
			if strings.Contains(l.text, "delete ") || strings.HasPrefix(l.text, "Deleted ") &&
				(!neigh || strings.Contains(l.text, "PERMANENT") || strings.Contains(l.text, "NOARP")) {
				t.Errorf("node %s: removed during the upgrade (+%v): %s", m.node, l.at.Sub(start).Round(time.Millisecond), l.text)
			}
		}
	}
	// At most 1 s without a new connection (issue 22). An agent restart
	// leaves the kernel as it is (the monitors above), so what remains is
	// a packet lost here and there on a loaded machine: one failed
	// attempt makes an outage of about newConnTimeout + 2 × newConnPause
	// (0.29 s) plus the client's own lateness (its figure above).
	if st.maxGap > time.Second {
		// The timeline says where the gap fell, against the agents'
		// restarts.
		var b strings.Builder
		from := st.gapEnd.Add(-st.maxGap - 500*time.Millisecond)
		for _, e := range st.events {
			if e.at.After(from) && e.at.Before(st.gapEnd.Add(500*time.Millisecond)) {
				fmt.Fprintf(&b, "  +%v %q %v\n", e.at.Sub(start).Round(time.Millisecond), e.answer, e.err)
			}
		}
		agents, _ := c.Client.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=kurma-agent"})
		for _, p := range agents.Items {
			for _, cs := range p.Status.ContainerStatuses {
				if r := cs.State.Running; r != nil {
					fmt.Fprintf(&b, "  agent on %s started +%v\n", p.Spec.NodeName, r.StartedAt.Sub(start).Round(time.Second))
				}
			}
			for _, cond := range p.Status.Conditions {
				if cond.Type == corev1.PodReady {
					fmt.Fprintf(&b, "  agent on %s Ready +%v\n", p.Spec.NodeName, cond.LastTransitionTime.Sub(start).Round(time.Second))
				}
			}
		}
		for i, ds := range directSt {
			fmt.Fprintf(&b, "  straight to pod %s (%s): longest gap %v, %d failed\n", in.pods[i].Name, in.pods[i].Status.PodIP,
				ds.maxGap.Round(time.Millisecond), ds.failed)
			for _, e := range ds.events {
				if e.err != nil && e.at.After(from) && e.at.Before(st.gapEnd.Add(500*time.Millisecond)) {
					fmt.Fprintf(&b, "    +%v %v\n", e.at.Sub(start).Round(time.Millisecond), e.err)
				}
			}
		}
		for k, v := range countersAfter {
			if d := v - countersBefore[k]; d != 0 {
				fmt.Fprintf(&b, "  counter %s +%d\n", k, d)
			}
		}
		for _, m := range mons {
			for _, l := range m.lines() {
				if l.at.After(from) && l.at.Before(st.gapEnd.Add(500*time.Millisecond)) {
					fmt.Fprintf(&b, "  +%v %s: %s\n", l.at.Sub(start).Round(time.Millisecond), m.node, l.text)
				}
			}
		}
		t.Errorf("new connections failed for %v during the upgrade (at most 1 s allowed); around the gap (from the roll's start):\n%s",
			st.maxGap.Round(time.Millisecond), b.String())
	}
	for _, p := range in.pods {
		got, err := c.Client.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got.Status.PodIP != p.Status.PodIP {
			t.Errorf("pod %s: IP %s → %s", p.Name, p.Status.PodIP, got.Status.PodIP)
		}
		if a := podAddrs(t, c, p); strings.Join(a, ",") != strings.Join(addrsBefore[p.Name], ",") {
			t.Errorf("pod %s: addresses %v → %v", p.Name, addrsBefore[p.Name], a)
		}
	}
}

// counters reads the kernel's network counters (nstat) of the client
// pod's namespace and of each node's, named "<where>/<counter>": drops
// and resets there say where connections were lost.
func (in *installed) counters(t *testing.T, ctx context.Context, client *corev1.Pod) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	read := func(where string, cmd *exec.Cmd) {
		b, err := cmd.Output()
		if err != nil {
			t.Logf("nstat in %s: %v", where, err)
			return
		}
		for _, l := range strings.Split(string(b), "\n") {
			f := strings.Fields(l)
			if len(f) < 2 || strings.HasPrefix(f[0], "#") {
				continue
			}
			if v, err := strconv.ParseInt(f[1], 10, 64); err == nil {
				out[where+"/"+f[0]] = v
			}
		}
	}
	path, err := in.c.PodNetNS(client)
	if err == nil {
		read("client", exec.CommandContext(ctx, "nsenter", "--net="+path, "--", "nstat", "-a", "-z", "-s"))
	}
	for _, n := range in.c.Nodes {
		read(n.Name, n.Command(ctx, "nstat", "-a", "-z", "-s"))
	}
	return out
}

// monitor collects the lines a command (nft monitor, ip monitor) prints
// in a node's network namespace, with the time each arrived.
type monitor struct {
	node string
	mu   sync.Mutex
	got  []monitorLine
}

type monitorLine struct {
	at   time.Time
	text string
}

// startMonitor runs name args in node n's namespace until the test ends.
func startMonitor(t *testing.T, ctx context.Context, n *kubecluster.Node, name string, args ...string) *monitor {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	cmd := n.Command(ctx, name, args...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("%s on %s: %v", name, n.Name, err)
	}
	m := &monitor{node: n.Name}
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			m.mu.Lock()
			m.got = append(m.got, monitorLine{time.Now(), sc.Text()})
			m.mu.Unlock()
		}
	}()
	t.Cleanup(func() { cancel(); <-done; _ = cmd.Wait() })
	return m
}

func (m *monitor) lines() []monitorLine {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.got)
}

// ports lists the controller's ports of the k8s project whose device_id
// is uid ("" for all).
func (in *installed) ports(ctx context.Context, uid string) ([]json.RawMessage, error) {
	u := "http://" + kubecluster.NodeIP + ":9696/project/k8s/ports"
	if uid != "" {
		u += "?device_id=" + uid
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+in.token)
	hc := &http.Client{Transport: &http.Transport{DialContext: in.c.DialContext}, Timeout: 10 * time.Second}
	res, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", u, res.Status)
	}
	var body struct {
		Ports []json.RawMessage `json:"ports"`
	}
	if err := json.NewDecoder(res.Body).Decode(&body); err != nil {
		return nil, err
	}
	return body.Ports, nil
}

// chaosRollout creates a Deployment of 30 pods and, while they start,
// deletes the controller's pod and the watcher leader's pod: every pod
// must end Running with exactly one port.
func (in *installed) chaosRollout(t *testing.T, ctx context.Context) {
	c := in.c
	const n = 30
	labels := map[string]string{"app": "k8sinstall-burst"}
	replicas := int32(n)
	dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "k8sinstall-burst", Namespace: "default"},
		Spec: appsv1.DeploymentSpec{Replicas: &replicas, Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{TerminationGracePeriodSeconds: new(int64),
					Containers: []corev1.Container{{Name: "echo", Image: kubecluster.EchoImage,
						ImagePullPolicy: corev1.PullNever}}}}}}
	if _, err := c.Client.AppsV1().Deployments("default").Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.Client.AppsV1().Deployments("default").Delete(context.Background(), dep.Name, metav1.DeleteOptions{})
	})
	// Once some pods exist, the controller's pod and the leader's go.
	waitFor(t, ctx, "first burst pods", func() (bool, string) {
		pods, err := c.Client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=k8sinstall-burst"})
		return err == nil && len(pods.Items) >= 5, fmt.Sprint(err)
	}, c)
	lease, err := c.Client.CoordinationV1().Leases("kube-system").Get(ctx, "kurma-k8s-watcher", metav1.GetOptions{})
	if err != nil || lease.Spec.HolderIdentity == nil {
		t.Fatalf("watcher lease: %v", err)
	}
	leader := *lease.Spec.HolderIdentity
	in.kubectl("-n", "kube-system", "delete", "pod", "-l", "app.kubernetes.io/name=kurma-controller", "--wait=false")
	in.kubectl("-n", "kube-system", "delete", "pod", leader, "--wait=false")
	t.Logf("deleted the controller's pod and the watcher leader %s", leader)
	var running []corev1.Pod
	waitFor(t, ctx, "30 burst pods Running", func() (bool, string) {
		running, err = c.WaitPodsRunning(ctx, "default", "app=k8sinstall-burst", 0)
		if err != nil {
			return false, err.Error()
		}
		return len(running) == n, fmt.Sprintf("%d Running", len(running))
	}, c)
	onNode := map[string]int{}
	waitFor(t, ctx, "one port per pod", func() (bool, string) {
		for _, p := range running {
			ps, err := in.ports(ctx, string(p.UID))
			if err != nil {
				return false, err.Error()
			}
			if len(ps) != 1 {
				return false, fmt.Sprintf("pod %s has %d ports", p.Name, len(ps))
			}
		}
		return true, ""
	}, c)
	for _, p := range running {
		onNode[p.Spec.NodeName]++
	}
	// No port of a pod that never was: the burst, the echo pods.
	all, err := in.ports(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != n+len(in.pods) {
		t.Errorf("%d ports in the project, want %d (30 burst pods and %d echo pods)", len(all), n+len(in.pods), len(in.pods))
	}
	t.Logf("30 pods Running with one port each, per node %v; new leader and controller in place", onNode)
	if err := c.Client.AppsV1().Deployments("default").Delete(ctx, dep.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitNoPods(ctx, "default", "app=k8sinstall-burst"); err != nil {
		t.Fatal(err)
	}
}

// agentAtRest reports each node's agent RSS and CPU use over 10 s of rest.
func (in *installed) agentAtRest(t *testing.T) {
	c := in.c
	type sample struct {
		pid   int
		ticks uint64
	}
	find := func(n *kubecluster.Node) (sample, error) {
		var nsIno uint64
		fi, err := os.Stat(n.NetNS)
		if err != nil {
			return sample{}, err
		}
		nsIno = statIno(fi)
		procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
		for _, f := range procs {
			b, err := os.ReadFile(f)
			if err != nil || !strings.HasPrefix(string(b), "/usr/local/bin/kurma-agent\x00") || strings.Contains(string(b), "--uninstall") {
				continue
			}
			dir := filepath.Dir(f)
			link, err := os.Readlink(filepath.Join(dir, "ns", "net"))
			if err != nil || link != fmt.Sprintf("net:[%d]", nsIno) {
				continue
			}
			pid, _ := strconv.Atoi(filepath.Base(dir))
			ticks, err := cpuTicks(pid)
			if err != nil {
				continue
			}
			return sample{pid, ticks}, nil
		}
		return sample{}, fmt.Errorf("no kurma-agent in %s's namespace", n.Name)
	}
	var first []sample
	for _, n := range c.Nodes {
		s, err := find(n)
		if err != nil {
			t.Fatal(err)
		}
		first = append(first, s)
	}
	const window = 10 * time.Second
	timer := time.NewTimer(window)
	<-timer.C
	for i, n := range c.Nodes {
		ticks, err := cpuTicks(first[i].pid)
		if err != nil {
			t.Fatal(err)
		}
		rss, err := rssKiB(first[i].pid)
		if err != nil {
			t.Fatal(err)
		}
		// USER_HZ is 100 on Linux.
		cpu := float64(ticks-first[i].ticks) / 100 / window.Seconds() * 100
		t.Logf("FIGURES agent at rest on %s: RSS %.1f MiB, CPU %.2f%% of a core over %v", n.Name, float64(rss)/1024, cpu, window)
	}
}

// cpuTicks is utime+stime of pid, in clock ticks.
func cpuTicks(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: short", pid)
	}
	u, err := strconv.ParseUint(f[11], 10, 64)
	if err != nil {
		return 0, err
	}
	k, err := strconv.ParseUint(f[12], 10, 64)
	return u + k, err
}

// rssKiB is pid's VmRSS.
func rssKiB(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			return strconv.ParseUint(f[1], 10, 64)
		}
	}
	return 0, fmt.Errorf("/proc/%d/status: no VmRSS", pid)
}

// statIno is the inode number of fi.
func statIno(fi os.FileInfo) uint64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Ino
	}
	return 0
}
