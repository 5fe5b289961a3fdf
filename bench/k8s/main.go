// Command k8s measures pod start on a real single-node cluster (etcd,
// kube-apiserver, containerd, kubelet; internal/testutil/kubecluster) for
// each CNI setup named by -cni: one pod alone, then -pods pods with
// spec.nodeName created at once: time from the first create to all Running,
// per-pod create→Running p50/p99 (watched through the API, and the
// kubelet's own podStartSLOduration), and the latency of the network
// plugin's ADD under that load, timed by a wrapper (cnitimer) around the
// plugin; for Kurma, each ADD's timeline joined with the agent's
// "cnid: ADD" log lines (timeline.go). The peer is "bridge": the upstream bridge + host-local plugins;
// "bridge-default" is containerd's default conflist (bridge with
// masquerade, host-local, portmap); "floor" is a no-op plugin (floorcni),
// the least any CNI can cost here.
// Ratios against the peer are printed when more than one setup runs. With
// -rounds N the -cni list is measured N times over, alternating (single
// rounds on this shared machine swing by ±30%), and a summary gives each
// setup's median time to all Running, its ADD percentiles over all rounds,
// and each round's ratio to the peer's round.
//
// Adding a setup (e.g. Kurma's driver): write a func of type setupFunc that
// returns the conflist, the plugin folder, the plugin to time and anything
// to run beside the node, and register it in setups.
//
// Run as root after `make build`: go run ./bench/k8s [-pods 100] [-cni bridge] [-rounds 3].
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"kurma.dev/kurma/internal/kube/podnet"
	"kurma.dev/kurma/internal/testutil/kubecluster"
)

// setup is one node CNI configuration to measure.
type setup struct {
	// ConfList and BinDir are the node's CNI config and plugin folder.
	ConfList []byte
	BinDir   string
	// Timed is the plugin whose calls cnitimer records (it wraps
	// BinDir/Timed).
	Timed string
	// Started, if set, runs once the cluster is up (e.g. to start a
	// watcher and an agent with c.StartProcess) before any pod is made.
	Started func(ctx context.Context, c *kubecluster.Cluster) error
	// Drained, if set, runs after the last pod is deleted and before the
	// cluster closes (e.g. to wait until the kubelet has torn every
	// sandbox down through an agent that Close would stop first).
	Drained func(ctx context.Context, c *kubecluster.Cluster) error
	// Metrics, if set, is a Prometheus /metrics URL whose ADD phase
	// histograms (metrics.go) are printed for the burst.
	Metrics string
	// Traced says the node's CNI daemon logs one "cnid: ADD" line per
	// ADD in the kurma-agent log: the burst's ADD timeline (timeline.go)
	// is printed.
	Traced bool
}

// setupFunc prepares a setup in the scratch folder tmp.
type setupFunc func(ctx context.Context, binDir, tmp string) (setup, error)

// setups are the CNI configurations -cni can name; "bridge" is the peer.
var setups = map[string]setupFunc{
	"bridge":         bridgeSetup,
	"bridge-default": bridgeDefaultSetup,
	"kurma":          kurmaSetup,
	"kurma-base":     kurmaBaseSetup,
	"floor":          floorSetup,
}

// floorSetup is a CNI that costs nothing: floorcni does no network work
// and returns an address made from the container id, so that pods start
// as fast as containerd, runc and the kubelet allow on this machine. Its
// all-Running time is the least any CNI can reach here.
func floorSetup(_ context.Context, binDir, tmp string) (setup, error) {
	dir := filepath.Join(tmp, "floor-bin")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return setup{}, err
	}
	// containerd runs the loopback plugin for lo of every sandbox.
	if err := os.Symlink(filepath.Join(binDir, "cni", "loopback"), filepath.Join(dir, "loopback")); err != nil {
		return setup{}, err
	}
	if err := buildHelper("floorcni", filepath.Join(dir, "floorcni")); err != nil {
		return setup{}, err
	}
	return setup{
		ConfList: []byte(`{"cniVersion":"1.0.0","name":"floor","plugins":[{"type":"floorcni"}]}`),
		BinDir:   dir,
		Timed:    "floorcni",
	}, nil
}

// bridgeDefaultSetup is the conflist containerd ships as its default
// (10-containerd-net.conflist): bridge with masquerade and promiscuous
// mode, host-local, then portmap. "bridge" is the same without masquerade
// and portmap, the cheapest form of the peer.
func bridgeDefaultSetup(_ context.Context, binDir, tmp string) (setup, error) {
	conf := map[string]any{
		"cniVersion": "1.0.0",
		"name":       "containerd-net",
		"plugins": []any{
			map[string]any{
				"type": "bridge", "bridge": "kbench1", "isGateway": true, "ipMasq": true, "promiscMode": true,
				"ipam": map[string]any{
					"type":    "host-local",
					"dataDir": filepath.Join(tmp, "leases"),
					"ranges":  []any{[]any{map[string]any{"subnet": "10.246.0.0/16"}}},
					"routes":  []any{map[string]any{"dst": "0.0.0.0/0"}},
				},
			},
			map[string]any{"type": "portmap", "capabilities": map[string]any{"portMappings": true}},
		},
	}
	b, err := json.Marshal(conf)
	if err != nil {
		return setup{}, err
	}
	return setup{ConfList: b, BinDir: filepath.Join(binDir, "cni"), Timed: "bridge"}, nil
}

func bridgeSetup(_ context.Context, binDir, tmp string) (setup, error) {
	leases := filepath.Join(tmp, "leases")
	return setup{
		ConfList: kubecluster.BridgeConfList("kbench0", "10.245.0.0/16", leases),
		BinDir:   filepath.Join(binDir, "cni"),
		Timed:    "bridge",
	}, nil
}

// figures are one setup's results.
type figures struct {
	single       time.Duration   // one pod alone, create → Running
	all          time.Duration   // first create → last Running
	perPod       []time.Duration // create returned → Running seen
	slo          []time.Duration // kubelet podStartSLOduration
	add          []time.Duration // timed plugin's ADD calls
	addFailed    int
	deleteAll    time.Duration      // delete of all → none left
	sandboxTries int                // ADD calls per pod, on average ×100
	phases       [2]map[string]hist // setup.Metrics before and after the burst
	// cpu is the CPU seconds per 100 pods each of the cluster's processes
	// (and what it ran: containerd's CNI plugins) used from the first
	// create to all Running (cpu.go).
	cpu map[string]float64
	// machine is the whole machine's busy CPU seconds from the first
	// create to all Running, and its share of the CPUs' time: what the
	// rest of the machine took shows as machine - sum(cpu).
	machine      float64
	machineShare float64
	// steps is the burst's ADD timeline (setup.Traced).
	steps []addStep
	// settle is the wait, before this round's cluster started, for the
	// kernel to free the previous round's namespaces (settle.go);
	// netnsBurst the namespaces the kernel held when the burst began.
	settle     settled
	netnsBurst int
	load       string // /proc/loadavg's three averages when the burst began
}

func main() {
	n := flag.Int("pods", 100, "pods created at once")
	names := flag.String("cni", "bridge", "comma-separated CNI setups to measure, peer first ("+strings.Join(keys(), ", ")+")")
	rounds := flag.Int("rounds", 1, "measure the -cni list this many times, alternating (the machine's load drifts between rounds), and print a summary over the rounds")
	flag.Parse()
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "bench/k8s: needs root")
		os.Exit(1)
	}
	ctx := context.Background()
	binDir := kubecluster.BinDir()
	var results []figures
	var list []string
	for range max(1, *rounds) {
		list = append(list, strings.Split(*names, ",")...)
	}
	// One hold of the host's cluster lock for every round: no other
	// cluster runs between them.
	fmt.Println("waiting for the host's cluster lock...")
	lock, err := kubecluster.LockHost(ctx)
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench/k8s: %v\n", err)
		os.Exit(1)
	}
	defer lock.Release()
	base, err := netnsAlive()
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench/k8s: %v\n", err)
		os.Exit(1)
	}
	for i, name := range list {
		f, ok := setups[name]
		if !ok {
			fmt.Fprintf(os.Stderr, "bench/k8s: unknown setup %q (have %v)\n", name, keys())
			os.Exit(2)
		}
		// Every round, the first too, starts once the kernel has freed
		// the namespaces of what ran before it.
		st, err := settle(ctx, base, *settleQuiet, 2*time.Minute)
		if err != nil {
			fmt.Fprintf(os.Stderr, "bench/k8s: settle: %v\n", err)
			os.Exit(1)
		}
		r, err := measure(ctx, name, f, binDir, *n, lock)
		r.settle = st
		if err != nil {
			fmt.Fprintf(os.Stderr, "bench/k8s: %s: %v\n", name, err)
			_ = lock.Release()
			os.Exit(1)
		}
		results = append(results, r)
		fmt.Printf("(%d/%d) ", i+1, len(list))
		report(name, *n, r)
	}
	if *rounds > 1 {
		summarize(list, results)
		return
	}
	for i := 1; i < len(results); i++ {
		p, r := results[0], results[i]
		fmt.Printf("%s vs %s: all Running %.2f×, per-pod p50 %.2f× p99 %.2f×, ADD p50 %.3f× p99 %.3f×\n",
			list[i], list[0], ratio(r.all, p.all), ratio(pct(r.perPod, 50), pct(p.perPod, 50)),
			ratio(pct(r.perPod, 99), pct(p.perPod, 99)), ratio(pct(r.add, 50), pct(p.add, 50)),
			ratio(pct(r.add, 99), pct(p.add, 99)))
	}
}

// summarize prints, per setup, the median over the rounds of the time to
// all Running, the ADD percentiles of all rounds' calls together, and,
// for each later setup, its all-Running ratio to the peer's of the same
// round (the peer is the first name of the list).
func summarize(list []string, results []figures) {
	var order []string
	by := map[string][]figures{}
	for i, name := range list {
		if by[name] == nil {
			order = append(order, name)
		}
		by[name] = append(by[name], results[i])
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	fmt.Printf("== summary over %d rounds (alternating)\n", len(by[order[0]]))
	for _, name := range order {
		var all, add []time.Duration
		var each []string
		for _, r := range by[name] {
			all = append(all, r.all)
			add = append(add, r.add...)
			each = append(each, fmt.Sprintf("%.2f", r.all.Seconds()))
		}
		fmt.Printf("%-8s all Running median %.2f s (rounds: %s s); ADD of all rounds (%d) p50 %.0f ms, p90 %.0f ms, p99 %.0f ms\n",
			name, pct(all, 50).Seconds(), strings.Join(each, " / "), len(add), ms(pct(add, 50)), ms(pct(add, 90)), ms(pct(add, 99)))
		// CPU seconds per 100 pods, median over the rounds per process.
		med := map[string]float64{}
		for proc := range by[name][0].cpu {
			var xs []float64
			for _, r := range by[name] {
				xs = append(xs, r.cpu[proc])
			}
			slices.Sort(xs)
			med[proc] = xs[len(xs)/2]
		}
		fmt.Printf("%-8s CPU s per 100 pods (medians): %s\n", name, formatCPU(med))
		var busy []string
		for _, r := range by[name] {
			busy = append(busy, fmt.Sprintf("%.0f %%", 100*r.machineShare))
		}
		fmt.Printf("%-8s machine busy during the burst, by round: %s\n", name, strings.Join(busy, " / "))
		var steps []addStep
		for _, r := range by[name] {
			steps = append(steps, r.steps...)
		}
		if steps != nil {
			fmt.Printf("%-8s all rounds:\n", name)
			printTimeline(steps)
		}
	}
	peer := by[order[0]]
	for _, name := range order[1:] {
		var ratios []string
		for i, r := range by[name] {
			if i < len(peer) {
				ratios = append(ratios, fmt.Sprintf("%.2f×", ratio(r.all, peer[i].all)))
			}
		}
		fmt.Printf("%s vs %s, all Running by round: %s\n", name, order[0], strings.Join(ratios, " / "))
	}
}

func keys() []string {
	var k []string
	for n := range setups {
		k = append(k, n)
	}
	slices.Sort(k)
	return k
}

// keepLogs is the -keep-logs flag: a folder that receives a copy of each
// round's cluster process logs (kubelet, containerd, the Kurma daemons).
// settleQuiet is how long the kernel's count of network namespaces must
// stop falling before a round starts (settle.go).
var settleQuiet = flag.Duration("settle", 3*time.Second, "before each round, wait until the kernel's count of network namespaces is back to where it was before the first round or has not fallen for this long (the previous round's namespaces freed)")

var keepLogs = flag.String("keep-logs", "", "copy each round's cluster process logs into DIR/<n>-<setup>/ (for a slow or failed ADD)")

// keepClusterLogs copies the cluster's log folder into a new numbered
// folder of dir named after the setup.
func keepClusterLogs(c *kubecluster.Cluster, dir, name string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	old, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	dst := filepath.Join(dir, fmt.Sprintf("%d-%s", len(old)+1, name))
	return os.CopyFS(dst, os.DirFS(filepath.Join(c.Dir, "logs")))
}

// measure runs one setup on a fresh cluster.
func measure(ctx context.Context, name string, f setupFunc, binDir string, n int, lock *kubecluster.HostLock) (r figures, err error) {
	tmp, err := os.MkdirTemp("", "kbench-"+name)
	if err != nil {
		return r, err
	}
	defer os.RemoveAll(tmp)
	s, err := f(ctx, binDir, tmp)
	if err != nil {
		return r, err
	}
	wrapped, err := wrapPlugin(tmp, s.BinDir, s.Timed)
	if err != nil {
		return r, err
	}
	sctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	c, err := kubecluster.Start(sctx, kubecluster.Options{
		BinDir: binDir, CNIConfList: s.ConfList, CNIBinDir: wrapped,
		KubeletArgs: []string{"--v=2"}, HeldLock: lock,
	})
	if err != nil {
		return r, err
	}
	defer func() {
		if *keepLogs != "" {
			if kerr := keepClusterLogs(c, *keepLogs, name); kerr != nil {
				fmt.Fprintf(os.Stderr, "keep logs: %v\n", kerr)
			}
		}
		if cerr := c.Close(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	if s.Started != nil {
		if err := s.Started(ctx, c); err != nil {
			return r, err
		}
	}
	ctx, cancel = context.WithTimeout(ctx, 15*time.Minute)
	defer cancel()
	pods := c.Client.CoreV1().Pods("default")

	// One pod alone (this also warms the image and the kubelet).
	t0 := time.Now()
	if _, err := pods.Create(ctx, benchPod("single", c.NodeName), metav1.CreateOptions{}); err != nil {
		return r, err
	}
	if _, err := c.WaitPodsRunning(ctx, "default", "bench=single", 1); err != nil {
		return r, err
	}
	r.single = time.Since(t0)
	if err := deleteAll(ctx, c, "bench=single"); err != nil {
		return r, err
	}
	timings := filepath.Join(wrapped, ".timings")
	_ = os.Remove(timings)
	sloBefore := len(sloDurations(c))
	if s.Metrics != "" {
		if r.phases[0], err = scrape(ctx, c, s.Metrics); err != nil {
			return r, err
		}
	}

	// n pods at once; a watch started first, and drained while the pods
	// are created (the API server drops watchers that fall behind), sees
	// every Running.
	seen := newRunningSet(n)
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	watchErr := make(chan error, 1)
	go func() { watchErr <- seen.follow(wctx, c) }()
	if err := seen.waitStarted(ctx); err != nil {
		return r, err
	}
	created := make([]time.Time, n)
	cpu0 := sampleCPU(c)
	busy0, total0 := machineCPU()
	r.netnsBurst, _ = netnsAlive()
	r.load = loadAvg()
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			p := benchPod(fmt.Sprintf("many-%03d", i), c.NodeName)
			if _, err := pods.Create(ctx, p, metav1.CreateOptions{}); err != nil {
				errs <- err
				return
			}
			created[i] = time.Now()
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return r, fmt.Errorf("create: %w", err)
	}
	select {
	case <-seen.all:
	case err := <-watchErr:
		return r, fmt.Errorf("watch: %w", err)
	case <-ctx.Done():
		return r, fmt.Errorf("%d/%d Running: %w", seen.count(), n, ctx.Err())
	}
	r.cpu = cpuDelta(cpu0, sampleCPU(c), n)
	if busy1, total1 := machineCPU(); total1 > total0 {
		r.machine = float64(busy1-busy0) / clockTicks
		r.machineShare = float64(busy1-busy0) / float64(total1-total0)
	}
	stopWatch()
	running := seen.snapshot()
	var last time.Time
	for i := range n {
		at := running[fmt.Sprintf("many-%03d", i)]
		r.perPod = append(r.perPod, at.Sub(created[i]))
		if at.After(last) {
			last = at
		}
	}
	r.all = last.Sub(start)
	if s.Metrics != "" {
		if r.phases[1], err = scrape(ctx, c, s.Metrics); err != nil {
			return r, err
		}
	}
	r.add, r.addFailed = readTimings(timings, "ADD")
	if s.Traced {
		byName := map[string]time.Time{}
		for i := range n {
			byName[fmt.Sprintf("many-%03d", i)] = created[i]
		}
		seen.mu.Lock()
		annotated := maps.Clone(seen.annotated)
		seen.mu.Unlock()
		r.steps = timeline(readCalls(timings, "ADD"), readDaemonAdds(agentLog(c.Dir)), byName, annotated)
	}
	r.sandboxTries = 100 * (len(r.add) + r.addFailed) / n
	// The kubelet logs a pod's startup duration once it saw it running.
	deadline := time.Now().Add(10 * time.Second)
	for {
		slo := sloDurations(c)
		if len(slo)-sloBefore >= n || time.Now().After(deadline) {
			r.slo = slo[min(sloBefore, len(slo)):]
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	t1 := time.Now()
	if err := deleteAll(ctx, c, "bench=many"); err != nil {
		return r, err
	}
	r.deleteAll = time.Since(t1)
	if s.Drained != nil {
		if err := s.Drained(ctx, c); err != nil {
			return r, err
		}
	}
	return r, nil
}

// runningSet records when each pod was first seen Running.
type runningSet struct {
	n       int
	started chan struct{} // closed once the first watch is open
	all     chan struct{} // closed once n pods were seen Running

	mu        sync.Mutex // guards at, annotated
	at        map[string]time.Time
	annotated map[string]time.Time // Kurma's pod-networks annotation first seen
}

func newRunningSet(n int) *runningSet {
	return &runningSet{n: n, started: make(chan struct{}), all: make(chan struct{}), at: map[string]time.Time{},
		annotated: map[string]time.Time{}}
}

func (s *runningSet) waitStarted(ctx context.Context) error {
	select {
	case <-s.started:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *runningSet) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.at)
}

func (s *runningSet) snapshot() map[string]time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.at)
}

// follow watches the bench pods until ctx ends, resuming from the last
// resource version when the server closes the watch.
func (s *runningSet) follow(ctx context.Context, c *kubecluster.Cluster) error {
	pods := c.Client.CoreV1().Pods("default")
	rv := ""
	first := true
	for ctx.Err() == nil {
		w, err := pods.Watch(ctx, metav1.ListOptions{LabelSelector: "bench=many", ResourceVersion: rv})
		if err != nil {
			return err
		}
		if first {
			close(s.started)
			first = false
		}
		for ev := range w.ResultChan() {
			if ev.Type == watch.Error {
				rv = "" // expired: a fresh watch lists the current state
				break
			}
			p, isPod := ev.Object.(*corev1.Pod)
			if !isPod {
				continue
			}
			rv = p.ResourceVersion
			if _, ok := p.Annotations[podnet.Annotation]; ok && ev.Type != watch.Deleted {
				s.mu.Lock()
				if _, seen := s.annotated[p.Name]; !seen {
					s.annotated[p.Name] = time.Now()
				}
				s.mu.Unlock()
			}
			if ev.Type == watch.Deleted || p.Status.Phase != corev1.PodRunning {
				continue
			}
			s.mu.Lock()
			if _, ok := s.at[p.Name]; !ok {
				s.at[p.Name] = time.Now()
				if len(s.at) == s.n {
					close(s.all)
				}
			}
			s.mu.Unlock()
		}
		w.Stop()
	}
	return nil
}

// benchPod is a pod of the echo image bound to node.
func benchPod(name, node string) *corev1.Pod {
	group := "many"
	if name == "single" {
		group = "single"
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"bench": group}},
		Spec: corev1.PodSpec{
			NodeName:                      node,
			TerminationGracePeriodSeconds: new(int64),
			Containers: []corev1.Container{{
				Name: "echo", Image: kubecluster.EchoImage, ImagePullPolicy: corev1.PullNever,
			}},
		},
	}
}

// deleteAll deletes the pods that match selector and waits until they are
// gone.
func deleteAll(ctx context.Context, c *kubecluster.Cluster, selector string) error {
	zero := int64(0)
	if err := c.Client.CoreV1().Pods("default").DeleteCollection(ctx,
		metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{LabelSelector: selector}); err != nil {
		return err
	}
	return c.WaitNoPods(ctx, "default", selector)
}

// wrapPlugin makes a plugin folder in tmp that links every plugin of src
// and puts cnitimer in place of timed.
func wrapPlugin(tmp, src, timed string) (string, error) {
	dir := filepath.Join(tmp, "cni-bin")
	if err := os.MkdirAll(filepath.Join(dir, ".real"), 0o755); err != nil {
		return "", err
	}
	ents, err := os.ReadDir(src)
	if err != nil {
		return "", err
	}
	for _, e := range ents {
		dst := filepath.Join(dir, e.Name())
		if e.Name() == timed {
			dst = filepath.Join(dir, ".real", e.Name())
		}
		if err := os.Symlink(filepath.Join(src, e.Name()), dst); err != nil {
			return "", err
		}
	}
	if err := buildHelper("cnitimer", filepath.Join(dir, timed)); err != nil {
		return "", err
	}
	return dir, nil
}

// buildHelper builds the command in this benchmark's folder pkg (static,
// as a plugin must be) into out.
func buildHelper(pkg, out string) error {
	_, file, _, _ := runtime.Caller(0)
	cmd := exec.Command("go", "build", "-trimpath", "-o", out, "./"+pkg)
	cmd.Dir = filepath.Dir(file)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build %s: %w: %s", pkg, err, b)
	}
	return nil
}

// readTimings returns the durations of the successful calls of command in
// a cnitimer log, and the count of failed ones.
func readTimings(path, command string) (durs []time.Duration, failed int) {
	f, err := os.Open(path)
	if err != nil {
		return nil, 0
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		fs := strings.Fields(s.Text())
		if len(fs) != 5 || fs[0] != command {
			continue
		}
		ns, err1 := strconv.ParseInt(fs[3], 10, 64)
		code, err2 := strconv.Atoi(fs[4])
		if err1 != nil || err2 != nil {
			continue
		}
		if code != 0 {
			failed++
			continue
		}
		durs = append(durs, time.Duration(ns))
	}
	return durs, failed
}

var sloRE = regexp.MustCompile(`podStartSLOduration=([0-9.]+)`)

// sloDurations returns every podStartSLOduration the kubelet logged.
func sloDurations(c *kubecluster.Cluster) []time.Duration {
	b, err := os.ReadFile(filepath.Join(c.Dir, "logs", "kubelet.log"))
	if err != nil {
		return nil
	}
	var out []time.Duration
	for _, m := range sloRE.FindAllSubmatch(b, -1) {
		if v, err := strconv.ParseFloat(string(m[1]), 64); err == nil {
			out = append(out, time.Duration(v*float64(time.Second)))
		}
	}
	return out
}

// pct is the p-th percentile (nearest rank) of ds.
func pct(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(float64(len(s))*p/100+0.5) - 1
	return s[max(0, min(i, len(s)-1))]
}

func ratio(a, b time.Duration) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

func report(name string, n int, r figures) {
	ms := func(d time.Duration) string { return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond)) }
	fmt.Printf("== %s\n", name)
	fmt.Printf("before the cluster: net namespaces %d → %d in %s (%s); at the burst %d; load average %s\n",
		r.settle.from, r.settle.to, ms(r.settle.waited), map[bool]string{true: "settled", false: "still falling at the deadline"}[r.settle.ok],
		r.netnsBurst, r.load)
	fmt.Printf("one pod alone: create → Running %s\n", ms(r.single))
	fmt.Printf("%d pods at once: first create → all Running %s\n", n, ms(r.all))
	fmt.Printf("  per pod create → Running (API watch): p50 %s, p99 %s, max %s\n",
		ms(pct(r.perPod, 50)), ms(pct(r.perPod, 99)), ms(pct(r.perPod, 100)))
	fmt.Printf("  kubelet podStartSLOduration (%d logged; from creationTimestamp, whole seconds): p50 %s, p99 %s\n",
		len(r.slo), ms(pct(r.slo, 50)), ms(pct(r.slo, 99)))
	fmt.Printf("  CNI ADD under load (%d ok, %d failed, %.2f per pod): p50 %s, p90 %s, p99 %s, max %s\n",
		len(r.add), r.addFailed, float64(r.sandboxTries)/100, ms(pct(r.add, 50)), ms(pct(r.add, 90)),
		ms(pct(r.add, 99)), ms(pct(r.add, 100)))
	fmt.Printf("  CPU s per 100 pods, first create → all Running: %s\n", formatCPU(r.cpu))
	var cluster float64
	for _, s := range r.cpu {
		cluster += s * float64(n) / 100
	}
	fmt.Printf("  machine, first create → all Running: %.1f CPU s busy (%.0f %% of the CPUs), of which outside the cluster's processes %.1f s\n",
		r.machine, 100*r.machineShare, r.machine-cluster)
	if r.phases[1] != nil {
		printPhases(r.phases[0], r.phases[1])
	}
	if r.steps != nil {
		printTimeline(r.steps)
	}
	fmt.Printf("  delete all → none left %s\n", ms(r.deleteAll))
}
