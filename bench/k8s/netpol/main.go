// Command netpol is the NetworkPolicy part of bench/k8s (issue 21): the
// agent's policy path (internal/kube/netpol's controller and
// internal/agent/policypath, as kurma-agent --network-policy runs them)
// driven by a real kube-apiserver + etcd (internal/testutil/kubecluster,
// no node). 1,000 pods are on the books (API objects with an address in
// their status; -local of them on the bench node), then for each N
// policies:
//
//	(a) cold sync: the policy process started with everything present →
//	    its first full sync done (its own log line);
//	(b) one policy created (selecting a local pod, allowing a peer on a
//	    new port): API write sent → the exact element in the kernel,
//	    p50/p99 of -adds (also printed from the write returned, which
//	    leaves out the API server's and etcd's own time);
//	(c) one pod label change (a remote pod becomes a peer): write sent
//	    → its element in the kernel, p50/p99 (and from the write returned);
//	(d) peak RSS (VmHWM) of the policy process;
//	(e) TCP connect latency (p50/p99 of 2,000) and one stream's
//	    throughput through an allowed path (conn.go), against the same
//	    path with no policy at all, measured first in the same run; and,
//	    fairer on a machine whose load drifts, alternated in the same
//	    state, 6 pairs in alternating order: the server pod selected by its policies,
//	    and selected by none (relabelled: the path then meets exactly
//	    what it meets with no policy).
//
// Each sample of (b) and (c) is printed in write order, and traced
// (trace.go): the write, a plain watch's event, the policy process's
// own stamps (watch event decoded, handler, compute, apply), the read. The kernel is read
// back with one netlink element lookup (no dump). The policy process is
// this binary with -child, run inside the cluster's network namespace (the
// API server listens there), programming its own table there. Peer
// kube-network-policies v0.8.0: it cannot run on a kernel without the
// nftables queue expression (CONFIG_NFT_QUEUE); the bench probes for it
// and prints the kernel's error (see bench/README.md).
//
// Run as root after `make build`: go run ./bench/k8s/netpol [-sizes 100,1000,10000].
package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	mnl "github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"kurma.dev/kurma/bench/internal/benchutil"
	"kurma.dev/kurma/internal/agent/policypath"
	"kurma.dev/kurma/internal/gcflag"
	"kurma.dev/kurma/internal/kube/netpol"
	"kurma.dev/kurma/internal/nice"
	"kurma.dev/kurma/internal/testutil/kubecluster"
)

const (
	nsName   = "bench"
	node     = "bench-node"
	table    = "kurma-bench-np"
	nPods    = 1000
	apps     = 50 // app label values
	groups   = 10 // grp label values (peer selectors)
	readyMsg = "netpol: full sync"
)

func main() {
	child := flag.Bool("child", false, "run the policy process (internal)")
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig (child)")
	sizes := flag.String("sizes", "100,1000,10000", "policy counts")
	adds := flag.Int("adds", 20, "samples of (b) and (c)")
	local := flag.Int("local", 100, "pods on the bench node")
	inproc := flag.Bool("inprocess", false, "time engine and path alone, no API server (inproc.go)")
	cpuprof := flag.String("cpuprofile", "", "write a CPU profile of this process to the file")
	flag.StringVar(&keepLogs, "childlogs", "", "copy the policy process's log of each size into this folder")
	flag.IntVar(&childGC, "child-gc-percent", gcflag.Default, "GC target of the policy process; the default is kurma-agent's --gc-percent default")
	flag.IntVar(&childNice, "child-nice", benchutil.AgentNice, "CPU priority (nice value) of the policy process; the default is the deployed agent's --nice")
	flag.Parse()
	if *cpuprof != "" {
		f, err := os.Create(*cpuprof)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "-cpuprofile:", err)
			os.Exit(2)
		}
		defer pprof.StopCPUProfile()
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	var err error
	if *child {
		err = runChild(ctx, *kubeconfig)
	} else {
		var ns []int
		for _, s := range strings.Split(*sizes, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(s))
			if err != nil {
				fmt.Fprintln(os.Stderr, "-sizes:", err)
				os.Exit(2)
			}
			ns = append(ns, n)
		}
		// (c) relabels a different remote pod of g-1 for each sample.
		if most := (nPods-*local-2)/groups + 1; !*inproc && *adds > most {
			fmt.Fprintf(os.Stderr, "-adds %d: at most %d with -local %d (each label change takes another of the %d pods)\n", *adds, most, *local, nPods)
			os.Exit(2)
		}
		if *inproc {
			err = inProcess(ctx, ns, *adds, *local)
		} else {
			err = run(ctx, ns, *adds, *local)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "netpol bench:", err)
		os.Exit(1)
	}
}

// runChild is the policy process: the agent's controller and policy path.
func runChild(ctx context.Context, kubeconfig string) error {
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	rc.QPS, rc.Burst = 50, 100
	rc.ContentType = "application/vnd.kubernetes.protobuf" // as kurma-agent's client
	rc.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	kc, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	// The agent's GC target (kurma-agent's --gc-percent default), so that
	// a change meets the collections it would meet in the agent.
	debug.SetGCPercent(childGC)
	if childNice != 0 {
		if err := nice.Set(childNice); err != nil {
			return fmt.Errorf("-child-nice: %w", err)
		}
	}
	// Debug: each partial sync logs its compute, total and lag (oldest
	// event to rules in the kernel), which the parent reads back.
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	pp, err := policypath.New(ctx, policypath.Config{Table: table, Logger: log})
	if err != nil {
		return err
	}
	defer pp.Close()
	c, err := netpol.New(netpol.Config{Kube: kc, NodeName: node, Datapath: adapter{pp, log}, Logger: log})
	if err != nil {
		return err
	}
	return c.Run(ctx)
}

type adapter struct {
	p   *policypath.Path
	log *slog.Logger
}

func (a adapter) Apply(ctx context.Context, ch map[string]*netpol.Rules) error {
	t0 := time.Now()
	pods := conv(ch)
	t1 := time.Now()
	err := a.p.Apply(ctx, pods)
	a.log.Debug("bench: apply", "pods", len(ch), "conv", t1.Sub(t0), "path", time.Since(t1))
	return err
}
func (a adapter) Sync(ctx context.Context, all map[string]*netpol.Rules) error {
	return a.p.Sync(ctx, conv(all))
}

// conv is the agent's convertRules: the engine's rules as the path's,
// uncopied.
func conv(in map[string]*netpol.Rules) map[string]*policypath.Pod { return netpol.PathRules(in) }

// childNice and childGC are -child-nice and -child-gc-percent, passed
// on to the child: the policy controller runs inside the agent, so by
// default the policy process runs at the agent's CPU priority
// (benchutil.AgentNice) and GC target (gcflag.Default).
var childNice, childGC int

// keepLogs is -childlogs.
var keepLogs string

type bench struct {
	c     *kubecluster.Cluster
	kc    kubernetes.Interface
	nf    *mnl.Conn
	local int
	npol  int // policies created so far
	child *kubecluster.Process
	log   *os.File
	conn  *connTopo
	st    *stamps
	// childLog is the policy process's log.
	childLog string
}

type row struct {
	n                          int
	cold                       time.Duration
	add50, add99, lbl50, lbl99 time.Duration
	rssKiB                     int64
	elems                      int
	conn50, conn99             time.Duration // (e) connect through the allowed path
	mbps                       float64
	// (e) alternated with the same path unselected (conn.go alternate).
	on, off   connResult
	pairRatio float64 // median over the pairs of on / off stream rates
	// The policy process's own view of (b) and (c): its partial syncs'
	// lag (oldest watch event to rules in the kernel) and compute time.
	lag50, lag99, comp50, comp99 time.Duration
}

func run(ctx context.Context, sizes []int, adds, local int) error {
	c, err := kubecluster.Start(ctx, kubecluster.Options{NoNode: true,
		APIServerArgs: []string{"--max-requests-inflight=800", "--max-mutating-requests-inflight=400"}})
	if err != nil {
		return err
	}
	defer c.Close()
	b := &bench{c: c, kc: c.Client, local: local}
	if err := c.Do(func() error {
		var err error
		b.nf, err = mnl.Dial(unix.NETLINK_NETFILTER, nil)
		return err
	}); err != nil {
		return err
	}
	defer b.nf.Close()
	if err := b.fillPods(ctx); err != nil {
		return err
	}
	if b.st, err = watchStamps(ctx, b.kc); err != nil {
		return err
	}
	// (e) the baseline: the policy process running, no policy at all.
	if _, err := b.startChild(ctx, 0); err != nil {
		return err
	}
	if b.conn, err = b.setupConn(ctx); err != nil {
		return err
	}
	defer b.conn.close()
	base := row{}
	if base.conn50, base.conn99, base.mbps, err = b.conn.measure(connN, connDur); err != nil {
		return fmt.Errorf("baseline connect: %w", err)
	}
	fmt.Printf("N=0: connect p50/p99 %v/%v, throughput %.0f Mbit/s\n", base.conn50, base.conn99, base.mbps)
	var rows []row
	for _, n := range sizes {
		r, err := b.size(ctx, n, adds)
		if err != nil {
			return fmt.Errorf("N=%d: %w", n, err)
		}
		rows = append(rows, r)
		fmt.Printf("N=%d: cold %v, policy add p50/p99 %v/%v, label p50/p99 %v/%v, RSS %.0f MiB, %d elements, connect p50/p99 %v/%v, %.0f Mbit/s\n",
			n, r.cold, r.add50, r.add99, r.lbl50, r.lbl99, float64(r.rssKiB)/1024, r.elems, r.conn50, r.conn99, r.mbps)
	}
	fmt.Println()
	fmt.Printf("1,000 pods (%d on the node)\n", local)
	if err := kubecluster.NFTQueue(ctx); err != nil {
		fmt.Printf("peer kube-network-policies v0.8.0 not run: it needs the nftables queue expression, which this kernel lacks (CONFIG_NFT_QUEUE): %v\n", err)
	}
	fmt.Println()
	fmt.Println("In the policy process, per partial sync of (b) and (c): oldest watch event → rules in the kernel, and the engine's compute, p50 / p99:")
	fmt.Println()
	fmt.Println("| policies | event → kernel | compute |")
	fmt.Println("|---|---|---|")
	for _, r := range rows {
		fmt.Printf("| %d | %s / %s | %s / %s |\n", r.n, ms(r.lag50), ms(r.lag99), ms(r.comp50), ms(r.comp99))
	}
	fmt.Println()
	fmt.Println("| policies | (a) cold sync | (b) policy created → enforced p50 / p99 | (c) label change → enforced p50 / p99 | (d) RSS | elements | (e) connect p50 / p99 (× none) | (e) throughput (× none) |")
	fmt.Println("|---|---|---|---|---|---|---|---|")
	fmt.Printf("| none | | | | | 0 | %s / %s | %.0f Mbit/s |\n", us(base.conn50), us(base.conn99), base.mbps)
	for _, r := range rows {
		fmt.Printf("| %d | %s | %s / %s | %s / %s | %.0f MiB | %d | %s / %s (%.2f× / %.2f×) | %.0f Mbit/s (%.2f×) |\n", r.n, ms(r.cold), ms(r.add50), ms(r.add99),
			ms(r.lbl50), ms(r.lbl99), float64(r.rssKiB)/1024, r.elems, us(r.conn50), us(r.conn99),
			ratio(r.conn50, base.conn50), ratio(r.conn99, base.conn99), r.mbps, r.mbps/base.mbps)
	}
	fmt.Println()
	fmt.Printf("(e) alternated in the same state (%d pairs, on off, off on, ...): the path with its server pod selected by the policies, against the same path with the pod selected by none (the same chain, its isolation lookups miss, as with no policy):\n", connRounds)
	fmt.Println()
	fmt.Println("| policies | connect p50 / p99 selected | unselected | × | throughput selected (median of streams) | unselected | × | × per pair (median) |")
	fmt.Println("|---|---|---|---|---|---|---|---|")
	for _, r := range rows {
		fmt.Printf("| %d | %s / %s | %s / %s | %.2f× / %.2f× | %.0f Mbit/s | %.0f Mbit/s | %.2f× | %.2f× |\n", r.n, us(r.on.conn50), us(r.on.conn99),
			us(r.off.conn50), us(r.off.conn99), ratio(r.on.conn50, r.off.conn50), ratio(r.on.conn99, r.off.conn99), r.on.mbps, r.off.mbps, r.on.mbps/r.off.mbps, r.pairRatio)
	}
	return nil
}

func us(d time.Duration) string { return fmt.Sprintf("%d µs", d.Microseconds()) }

func ratio(a, b time.Duration) float64 {
	if b <= 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// The samples of (e): connects, and the streams' length; the rounds of
// the alternated comparison (each of connN/connRounds connects and
// connDur of streams per state).
const (
	connN      = 2000
	connDur    = 3 * time.Second
	connRounds = 6
)

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) }

func podIP(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 64, byte(i >> 8), byte(i)}) }

// fillPods creates the namespace and 1,000 pods with addresses; pod i is
// local when i < local, has app=app-(i%apps), grp=g-(i%groups).
func (b *bench) fillPods(ctx context.Context) error {
	if _, err := b.kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: nsName}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	return parallel(nPods, func(i int) error {
		nd := "remote"
		if i < b.local {
			nd = node
		}
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p%d", i), Labels: map[string]string{
			"app": fmt.Sprintf("app-%d", i%apps), "grp": fmt.Sprintf("g-%d", i%groups)}},
			Spec: corev1.PodSpec{NodeName: nd, Containers: []corev1.Container{{Name: "c", Image: "none"}}}}
		p, err := b.kc.CoreV1().Pods(nsName).Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			return err
		}
		p.Status.Phase = corev1.PodRunning
		p.Status.PodIP = podIP(i).String()
		p.Status.PodIPs = []corev1.PodIP{{IP: p.Status.PodIP}}
		_, err = b.kc.CoreV1().Pods(nsName).UpdateStatus(ctx, p, metav1.UpdateOptions{})
		return err
	})
}

func parallel(n int, f func(int) error) error {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	ch := make(chan int)
	for range 32 {
		wg.Go(func() {
			for i := range ch {
				if err := f(i); err != nil {
					mu.Lock()
					first = cmp(first, err)
					mu.Unlock()
				}
			}
		})
	}
	for i := range n {
		ch <- i
	}
	close(ch)
	wg.Wait()
	return first
}

func cmp(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// policy j selects app-(j%apps) and allows grp g-(j%groups) on TCP port
// 1000+j%1000.
func policy(j int) *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("np%d", j)},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": fmt.Sprintf("app-%d", j%apps)}},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"grp": fmt.Sprintf("g-%d", j%groups)}}}},
				Ports: []networkingv1.NetworkPolicyPort{{Port: new(intstr.FromInt32(int32(1000 + j%1000)))}}}}}}
}

// startChild (re)starts the policy process with its table deleted and
// returns the time to its first full sync (its own log line).
func (b *bench) startChild(ctx context.Context, n int) (time.Duration, error) {
	if b.child != nil {
		b.child.Kill()
		<-b.child.Done()
	}
	_ = b.c.Command(ctx, "nft", "delete", "table", "inet", table).Run()
	self, err := os.Executable()
	if err != nil {
		return 0, err
	}
	logPath := fmt.Sprintf("%s/netpol-child-%d.log", b.c.Dir, n)
	b.childLog = logPath
	lf, err := os.Create(logPath)
	if err != nil {
		return 0, err
	}
	cmd := exec.Command(self, "-child", "-kubeconfig", b.c.Kubeconfig, "-child-nice", strconv.Itoa(childNice),
		"-child-gc-percent", strconv.Itoa(childGC))
	cmd.Stderr, cmd.Stdout = lf, lf
	start := time.Now()
	b.child, err = b.c.StartProcess(fmt.Sprintf("netpol-%d", n), cmd)
	_ = lf.Close() // the child holds its own descriptor
	if err != nil {
		return 0, err
	}
	if err := waitLog(logPath, readyMsg, 5*time.Minute); err != nil {
		return 0, err
	}
	took := time.Since(start)
	// The child's own split: watches synced (lists), then the full
	// sync's compute and programming.
	if out, err := os.ReadFile(logPath); err == nil {
		for _, l := range strings.Split(string(out), "\n") {
			if strings.Contains(l, "netpol: watches synced") || strings.Contains(l, "netpol: full sync") {
				fmt.Printf("N=%d cold: %s\n", n, l)
			}
		}
	}
	return took, nil
}

func (b *bench) size(ctx context.Context, n, adds int) (row, error) {
	r := row{n: n}
	if b.npol < n {
		if err := parallel(n-b.npol, func(i int) error {
			_, err := b.kc.NetworkingV1().NetworkPolicies(nsName).Create(ctx, policy(b.npol+i), metav1.CreateOptions{})
			return err
		}); err != nil {
			return r, err
		}
		b.npol = n
	}
	// (a) cold: the table deleted, the process started with all present.
	var err error
	if r.cold, err = b.startChild(ctx, n); err != nil {
		return r, err
	}
	// (b) one policy selecting local pod p0's app, allowing grp of pod
	// p(local+1) (remote) on a new port: its element pod . peer . tcp . port.
	var addT, addW []time.Duration // from the write sent; from the write returned
	var addS, lblS []sample
	for k := range adds {
		port := 20000 + n + k
		j := 0 // app-0: local pod p0; grp g-0
		np := policy(j)
		np.Name = fmt.Sprintf("probe-%d-%d", n, k)
		np.Spec.Ingress[0].Ports[0].Port = new(intstr.FromInt32(int32(port)))
		peer := podIP(groups * (b.local/groups + 1)) // a remote pod of g-0
		key := exactKey(podIP(0), peer, port)
		t0 := time.Now()
		made, err := b.kc.NetworkingV1().NetworkPolicies(nsName).Create(ctx, np, metav1.CreateOptions{})
		if err != nil {
			return r, err
		}
		t1 := time.Now()
		if err := b.until(key, true, 30*time.Second); err != nil {
			return r, fmt.Errorf("policy add: %w", err)
		}
		t2 := time.Now()
		addT = append(addT, t2.Sub(t0))
		addW = append(addW, t2.Sub(t1))
		addS = append(addS, sample{sent: t0, returned: t1, seen: t2, key: "policy/" + np.Name + "@" + made.ResourceVersion})
		if err := b.kc.NetworkingV1().NetworkPolicies(nsName).Delete(ctx, np.Name, metav1.DeleteOptions{}); err != nil {
			return r, err
		}
		if err := b.until(key, false, 30*time.Second); err != nil {
			return r, fmt.Errorf("policy delete: %w", err)
		}
	}
	r.add50, r.add99 = pct(addT)
	// (c) a remote pod of g-1 relabelled to g-0 becomes a peer of every
	// policy allowing g-0 (port 1000 for local pod p0 of app-0).
	var lblT, lblW []time.Duration
	for k := range adds {
		i := b.local + 1 + groups*k // remote, grp g-1; moved there and back
		key := exactKey(podIP(0), podIP(i), 1000)
		p, err := b.kc.CoreV1().Pods(nsName).Get(ctx, fmt.Sprintf("p%d", i), metav1.GetOptions{})
		if err != nil {
			return r, err
		}
		t0 := time.Now()
		p.Labels["grp"] = "g-0"
		made, err := b.kc.CoreV1().Pods(nsName).Update(ctx, p, metav1.UpdateOptions{})
		if err != nil {
			return r, err
		}
		t1 := time.Now()
		if err := b.until(key, true, 30*time.Second); err != nil {
			return r, fmt.Errorf("label: %w", err)
		}
		t2 := time.Now()
		lblT = append(lblT, t2.Sub(t0))
		lblW = append(lblW, t2.Sub(t1))
		lblS = append(lblS, sample{sent: t0, returned: t1, seen: t2, key: "pod/" + p.Name + "@" + made.ResourceVersion})
		p.Labels["grp"] = "g-1"
		p.ResourceVersion = ""
		if _, err := b.kc.CoreV1().Pods(nsName).Update(ctx, p, metav1.UpdateOptions{}); err != nil {
			return r, err
		}
		if err := b.until(key, false, 30*time.Second); err != nil {
			return r, fmt.Errorf("label back: %w", err)
		}
	}
	r.lbl50, r.lbl99 = pct(lblT)
	fmt.Printf("N=%d samples (b) %v\nN=%d samples (c) %v\n", n, round(addT), n, round(lblT))
	w50, w99 := pct(addW)
	l50, l99 := pct(lblW)
	fmt.Printf("N=%d from the write returned (the API server's own time left out): (b) p50/p99 %v/%v, (c) p50/p99 %v/%v\n", n, w50, w99, l50, l99)
	fmt.Printf("N=%d samples from the write returned, in order: (b) %v\nN=%d (c) %v\n", n, round(addW), n, round(lblW))
	lags, comps, err := partialSyncs(b.childLog)
	if err != nil {
		return r, err
	}
	if keepLogs != "" {
		if out, err := os.ReadFile(b.childLog); err == nil {
			_ = os.WriteFile(fmt.Sprintf("%s/netpol-child-%d.log", keepLogs, n), out, 0o644)
		}
	}
	r.lag50, r.lag99 = pct(lags)
	r.comp50, r.comp99 = pct(comps)
	fmt.Printf("N=%d partial syncs: %d, lag p50/p99 %v/%v, compute p50/p99 %v/%v\n", n, len(lags), r.lag50, r.lag99, r.comp50, r.comp99)
	if cs, err := childSyncs(b.childLog); err == nil {
		fmt.Println()
		fmt.Printf("N=%d: ", n)
		splitHeader()
		split("(b) policy created", addS, b.st, cs)
		split("(c) label change", lblS, b.st, cs)
		fmt.Println()
	}
	r.rssKiB, _ = hwm(b.child.PID())
	if r.conn50, r.conn99, r.mbps, err = b.conn.measure(connN, connDur); err != nil {
		return r, fmt.Errorf("connect: %w", err)
	}
	if r.on, r.off, r.pairRatio, err = b.alternate(ctx, connRounds); err != nil {
		return r, fmt.Errorf("connect, alternated: %w", err)
	}
	fmt.Printf("N=%d (e) alternated, %d pairs: selected: connect p50/p99 %v/%v, streams %.0f Mbit/s; unselected: %v/%v, %.0f Mbit/s; median of the pairs' ratios %.2f\n",
		n, connRounds, r.on.conn50, r.on.conn99, r.on.rates, r.off.conn50, r.off.conn99, r.off.rates, r.pairRatio)
	if out, err := b.c.Command(ctx, "nft", "-j", "list", "set", "inet", table, "pol-in-exact").Output(); err == nil {
		r.elems = strings.Count(string(out), "\"concat\"")
	}
	return r, nil
}

func exactKey(pod, peer netip.Addr, port int) []byte {
	a, p := pod.As4(), peer.As4()
	k := append(a[:], p[:]...)
	k = append(k, 6, 0, 0, 0)
	return binary.BigEndian.AppendUint16(k, uint16(port))[:14:14]
}

// until polls the kernel for the exact element until its presence is
// want.
func (b *bench) until(key []byte, want bool, limit time.Duration) error {
	return b.untilIn("pol-in-exact", append(slices.Clone(key), 0, 0), want, limit)
}

// untilIn polls set for key (padded as the kernel stores it) until its
// presence is want.
func (b *bench) untilIn(set string, k []byte, want bool, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		_, ok, err := benchutil.GetElem(b.nf, table, set, k)
		if err != nil {
			return err
		}
		if ok == want {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("element %x present=%v after %v", k, !want, limit)
		}
		time.Sleep(200 * time.Microsecond)
	}
}

// round lists samples in write order, to the 0.1 ms.
func round(ds []time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d.Round(100 * time.Microsecond)
	}
	return out
}

func pct(ds []time.Duration) (time.Duration, time.Duration) {
	if len(ds) == 0 {
		return 0, 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2], s[min(len(s)-1, (len(s)*99+99)/100-1)]
}

// partialSyncs reads the lag and compute time of every partial sync the
// policy process logged.
func partialSyncs(path string) (lags, comps []time.Duration, err error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if !strings.Contains(l, "netpol: partial sync") {
			continue
		}
		var lag, comp time.Duration
		for _, f := range strings.Fields(l) {
			k, v, ok := strings.Cut(f, "=")
			if !ok {
				continue
			}
			switch k {
			case "lag":
				lag, err = time.ParseDuration(v)
			case "compute":
				comp, err = time.ParseDuration(v)
			}
			if err != nil {
				return nil, nil, fmt.Errorf("%s: %q: %w", path, l, err)
			}
		}
		lags, comps = append(lags, lag), append(comps, comp)
	}
	return lags, comps, nil
}

func waitLog(path, msg string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		f, err := os.Open(path)
		if err == nil {
			sc := bufio.NewScanner(f)
			sc.Buffer(make([]byte, 1<<20), 1<<20)
			for sc.Scan() {
				if strings.Contains(sc.Text(), msg) {
					_ = f.Close()
					return nil
				}
			}
			_ = f.Close()
		}
		time.Sleep(5 * time.Millisecond)
	}
	b, _ := os.ReadFile(path)
	return fmt.Errorf("no %q in %v:\n%s", msg, limit, b)
}

func hwm(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmHWM:" {
			return strconv.ParseInt(f[1], 10, 64)
		}
	}
	return 0, errors.New("no VmHWM")
}
