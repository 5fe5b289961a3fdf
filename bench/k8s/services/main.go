// Command services is the Services part of bench/k8s: Kurma's path
// (kurma-k8s-watcher → kurma-controller → kurma-agent's nftables
// datapath) against kube-proxy in nftables mode, both driven by one real
// kube-apiserver + etcd (internal/testutil/kubecluster, no node) in the
// same run. For each N (ClusterIP Services of 2 endpoints each, their
// EndpointSlices written through the API as a selector-less Service's
// would be):
//
//	(a) ours: watcher and agent, stopped while the Services were
//	    created (-fill-stopped, the default), started → the last VIP live
//	    in the kernel; with -fill-stopped=false, last object created →
//	    its VIP live;
//	(b) one Service added (slice first): API write returned → VIP live,
//	    p50/p99 of -adds;
//	(c) one endpoint replaced (slice update): write returned → the new
//	    address live in the Service's backends;
//	(d) cold sync: watcher and agent (tables deleted) started with N
//	    present → VIPs live; kube-proxy started with N present → its first
//	    "SyncProxyRules complete";
//	(e) peak RSS (VmHWM) of watcher + agent against kube-proxy's.
//
// With -nodeports, two more, ours and kube-proxy's, with the N ClusterIP
// Services present:
//
//	(f) one NodePort Service added (slice first): write returned → its
//	    node port live, p50/p99 of -adds, and its ratio to (b);
//	(g) one endpoint replaced in a NodePort Service with
//	    externalTrafficPolicy Local (both endpoints on this node): write
//	    returned → the new address live among the node port's backends.
//
// Ours is read back through netlink (one element lookup, no dump).
// kube-proxy's "programmed" is its own log line "SyncProxyRules complete"
// (--v=2), the first one after the write, as ../shared/k8s-notes.md
// advises; the result is checked once afterwards with nft, outside the
// timed interval. The two run one after the other against the same API
// server and objects (so they do not share the 2 cores while timed).
//
// The N Services are written into etcd by default (-fill etcd, see
// etcdfill.go: through the API, kube-apiserver v1.37 spends O(N) per
// Service create, so 30,000 took most of an hour); -fill api creates them
// through the API with 32 creators and a protobuf client without rate
// limit. The fill prints its rate and each process's CPU time per 1,000
// Services (where a slow fill's time goes).
//
// With -profile DIR, the watcher and agent serve /debug/pprof/ and log
// every GC (GODEBUG=gctrace=1); at the (e) reading, their heap profiles
// (inuse and alloc since start), MemStats and logs are saved in DIR.
//
// Run as root after `make build`: go run ./bench/k8s/services [-sizes 1000,10000].
package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	mnl "github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"kurma.dev/kurma/bench/internal/benchutil"
	"kurma.dev/kurma/internal/kube/podnet"
	"kurma.dev/kurma/internal/testutil/kubecluster"
	capi "kurma.dev/kurma/pkg/controllerapi"
)

const (
	project  = "k8s"
	vpc      = "k8s-pods"
	ctlAddr  = "127.0.0.1:19698"
	ns       = "bench"
	node     = "bench-node"
	nftTable = "kbsvc"
	lbTable  = "kurma-lb"
	prefix   = "kv"
)

func main() {
	sizes := flag.String("sizes", "1000,10000", "numbers of Services present, comma-separated")
	adds := flag.Int("adds", 20, "single adds and endpoint replacements timed per size")
	profile := flag.String("profile", "", "save heap profiles, MemStats and GC traces of watcher and agent in this directory")
	gcPercent := flag.String("gc-percent", "", "pass --gc-percent to watcher and agent (empty: their default)")
	nodePorts := flag.Bool("nodeports", false, "also time NodePort adds (f) and externalTrafficPolicy Local endpoint changes (g)")
	apiProfile := flag.String("apiserver-profile", "", "write a 30 s CPU profile of kube-apiserver, taken during the last fill, to this file")
	fillHow := flag.String("fill", "etcd", "how the N Services are made: etcd (written into etcd as a restore would, see etcdfill.go) or api (created through the API server)")
	keepLogs := flag.String("keep-logs", "", "on failure, copy the cluster's process logs into this new directory (default: a new folder under $TMPDIR)")
	fillStopped := flag.Bool("fill-stopped", true, "stop watcher and agent while the N Services are created; (a) is then their start → last VIP live")
	flag.Parse()
	var ns []int
	for _, f := range strings.Split(*sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			fmt.Fprintln(os.Stderr, "bad -sizes:", *sizes)
			os.Exit(2)
		}
		ns = append(ns, n)
	}
	if *profile != "" {
		if err := os.MkdirAll(*profile, 0o755); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	if *fillHow != "etcd" && *fillHow != "api" {
		fmt.Fprintln(os.Stderr, "bad -fill:", *fillHow)
		os.Exit(2)
	}
	if err := run(context.Background(), ns, *adds, *profile, *gcPercent, *nodePorts, *fillStopped, *apiProfile, *fillHow == "etcd", *keepLogs); err != nil {
		fmt.Fprintln(os.Stderr, "services bench:", err)
		os.Exit(1)
	}
}

type row struct {
	n                                 int
	all                               time.Duration
	add50, add99, mem50, mem99        time.Duration
	cold                              time.Duration
	rssKiB                            int64
	kpAdd50, kpAdd99, kpMem50, kpMem9 time.Duration
	kpCold                            time.Duration
	kpRSSKiB                          int64
	// -nodeports: (f) NodePort add, (g) eTP Local endpoint change.
	np50, np99, loc50, loc99       time.Duration
	ip50, ip99                     time.Duration // (b'): ClusterIP adds made in (f)'s loop
	kpNp50, kpNp99, kpLoc50, kpL99 time.Duration
}

type bench struct {
	c *kubecluster.Cluster
	// k is the bench's own client: protobuf, and a rate limit far above
	// what the API server takes, so that the fill is paced by the server.
	k         kubernetes.Interface
	ctl       *capi.Client
	dir       string
	nf        *mnl.Conn
	iface     string
	created   int // Services made so far (s-0 … s-created-1)
	seq       int
	procs     map[string]*kubecluster.Process
	profile   string // -profile directory, or ""
	gcPercent string // -gc-percent, or ""
	nodePorts bool   // -nodeports
	// fillStopped: watcher and agent are stopped while Services are
	// created, and (a) is their start → last VIP live.
	fillStopped bool
	apiProfile  string   // -apiserver-profile file, or ""
	fillEtcd    bool     // -fill etcd
	vips        []string // ClusterIP of fill Service i
}

// growVIPs makes room for n fill Services' VIPs.
func (b *bench) growVIPs(n int) {
	if len(b.vips) < n {
		b.vips = append(b.vips, make([]string, n-len(b.vips))...)
	}
}

// Debug listeners of watcher and agent with -profile.
const (
	agentDebug   = "127.0.0.1:19697"
	watcherDebug = "127.0.0.1:19699"
)

func run(ctx context.Context, sizes []int, adds int, profile, gcPercent string, nodePorts, fillStopped bool, apiProfile string, fillEtcd bool, keepLogs string) (retErr error) {
	c, err := kubecluster.Start(ctx, kubecluster.Options{NoNode: true,
		APIServerArgs: []string{"--max-requests-inflight=800", "--max-mutating-requests-inflight=400",
			"--profiling=" + strconv.FormatBool(apiProfile != "")}})
	if err != nil {
		return err
	}
	defer c.Close()
	defer func() {
		if retErr == nil {
			return
		}
		// The cluster's folder goes with Close: keep its logs, in a
		// new folder of the temporary directory unless -keep-logs
		// names one (a rare miss is worth its logs every time).
		dst := keepLogs
		if dst == "" {
			d, err := os.MkdirTemp("", "kbench-services-logs-")
			if err != nil {
				fmt.Fprintf(os.Stderr, "keep logs: %v\n", err)
				return
			}
			dst = filepath.Join(d, "logs")
		}
		if out, err := exec.Command("cp", "-r", filepath.Join(c.Dir, "logs"), dst).CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "keep logs: %v: %s\n", err, out)
			return
		}
		fmt.Fprintf(os.Stderr, "cluster logs kept in %s\n", dst)
	}()
	kc := rest.CopyConfig(c.Config)
	kc.QPS, kc.Burst = 5000, 10000
	kc.ContentType = "application/vnd.kubernetes.protobuf"
	kc.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	k, err := kubernetes.NewForConfig(kc)
	if err != nil {
		return err
	}
	b := &bench{c: c, k: k, dir: c.Dir, procs: map[string]*kubecluster.Process{}, profile: profile, gcPercent: gcPercent,
		nodePorts: nodePorts, fillStopped: fillStopped, apiProfile: apiProfile, fillEtcd: fillEtcd}
	if err := b.setup(ctx); err != nil {
		return err
	}
	defer b.stopAll()
	var rows []row
	for _, n := range sizes {
		r, err := b.size(ctx, n, adds)
		if err != nil {
			return fmt.Errorf("N=%d: %w", n, err)
		}
		rows = append(rows, r)
	}
	fmt.Println()
	fmt.Println("| N | (a) ours: last created → live | (b) add p50/p99 ours | kube-proxy | (c) endpoint p50/p99 ours | kube-proxy | (d) cold sync ours | kube-proxy | (e) RSS watcher+agent | kube-proxy | ratio |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|---|")
	for _, r := range rows {
		fmt.Printf("| %d | %s | %s / %s | %s / %s | %s / %s | %s / %s | %s | %s | %.0f MiB | %.0f MiB | %.2f× |\n", r.n,
			ms(r.all), ms(r.add50), ms(r.add99), ms(r.kpAdd50), ms(r.kpAdd99), ms(r.mem50), ms(r.mem99),
			ms(r.kpMem50), ms(r.kpMem9), ms(r.cold), ms(r.kpCold), float64(r.rssKiB)/1024, float64(r.kpRSSKiB)/1024,
			float64(r.rssKiB)/float64(max(r.kpRSSKiB, 1)))
	}
	for _, r := range rows {
		if !*withPeer {
			break // no peer: no ratios to it
		}
		fmt.Printf("N=%d ratios ours/kube-proxy: add p99 %.3f, endpoint p99 %.3f, cold sync %.3f, RSS %.2f\n", r.n,
			ratio(r.add99, r.kpAdd99), ratio(r.mem99, r.kpMem9), ratio(r.cold, r.kpCold), float64(r.rssKiB)/float64(max(r.kpRSSKiB, 1)))
	}
	if !nodePorts {
		return nil
	}
	fmt.Println()
	fmt.Println("| N | (f) NodePort add p50/p99 ours | kube-proxy | (b') ClusterIP add p50/p99 ours, same loop | ours NodePort/ClusterIP add p99, (b') | (b) | (g) eTP Local endpoint p50/p99 ours | kube-proxy |")
	fmt.Println("|---|---|---|---|---|---|---|---|")
	for _, r := range rows {
		fmt.Printf("| %d | %s / %s | %s / %s | %s / %s | %.2f× | %.2f× | %s / %s | %s / %s |\n", r.n, ms(r.np50), ms(r.np99), ms(r.kpNp50), ms(r.kpNp99),
			ms(r.ip50), ms(r.ip99), ratio(r.np99, r.ip99), ratio(r.np99, r.add99), ms(r.loc50), ms(r.loc99), ms(r.kpLoc50), ms(r.kpL99))
	}
	for _, r := range rows {
		fmt.Printf("N=%d ratios: ours NodePort/ClusterIP add p99 %.3f", r.n, ratio(r.np99, r.add99))
		if *withPeer {
			fmt.Printf("; ours/kube-proxy NodePort add p99 %.3f, eTP Local endpoint p99 %.3f", ratio(r.np99, r.kpNp99), ratio(r.loc99, r.kpL99))
		}
		fmt.Println()
		fmt.Printf("N=%d ours NodePort/ClusterIP add p99, ClusterIP adds made in the same loop (b'): %.3f (p50 %.3f)\n",
			r.n, ratio(r.np99, r.ip99), ratio(r.np50, r.ip50))
	}
	return nil
}

func ratio(a, b time.Duration) float64 { return float64(a) / float64(max(b, 1)) }

func ms(d time.Duration) string {
	if d >= 10*time.Second {
		return fmt.Sprintf("%.1f s", d.Seconds())
	}
	return fmt.Sprintf("%.1f ms", benchutil.Ms(d))
}

// setup starts the controller, makes the project, VPC, a pod subnet and a
// port bound to the agent's host (so the agent programs the VPC's load
// balancers), the bench namespace and the Node kube-proxy waits for.
func (b *bench) setup(ctx context.Context) error {
	tok := filepath.Join(b.dir, "ctl-token")
	if err := os.WriteFile(tok, []byte("bench-token"), 0o600); err != nil {
		return err
	}
	if err := b.start("controller", filepath.Join(b.c.BinDir, "kurma-controller"), "--listen", ctlAddr,
		"--store", "bolt:"+filepath.Join(b.dir, "ctl.db"), "--token-file", tok); err != nil {
		return err
	}
	hc := &http.Client{Transport: &http.Transport{DialContext: b.c.DialContext, MaxIdleConnsPerHost: 16}}
	ctl, err := capi.New("http://"+ctlAddr, capi.WithToken("bench-token"), capi.WithHTTPClient(hc))
	if err != nil {
		return err
	}
	b.ctl = ctl
	if err := wait(20*time.Second, "controller", func() error { _, err := ctl.ListProjects(ctx); return err }); err != nil {
		return err
	}
	if _, err := ctl.CreateProject(ctx, capi.Project{ID: project}); err != nil {
		return err
	}
	v, err := ctl.CreateVPC(ctx, project, capi.VPC{ID: vpc, CIDR: "10.32.0.0/11"})
	if err != nil {
		return err
	}
	b.iface = fmt.Sprintf("%sb%06x", prefix, v.VNI)
	if _, err := ctl.CreateSubnet(ctx, project, capi.Subnet{ID: "benchpods", NetworkID: vpc, CIDR: "10.63.0.0/16"}); err != nil {
		return err
	}
	for _, args := range [][]string{
		{"link", "add", "kbsu0", "type", "veth", "peer", "name", "kbsu1"},
		{"link", "set", "kbsu1", "up"},
		{"addr", "add", "192.0.2.1/24", "dev", "kbsu0"},
		{"link", "set", "kbsu0", "up"},
	} {
		if out, err := b.c.Command(ctx, "ip", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("ip %v: %v: %s", args, err, out)
		}
	}
	if err := b.startAgent(); err != nil {
		return err
	}
	podNS := filepath.Join("/run/netns", "kbsvcpod")
	if out, err := exec.Command("ip", "netns", "add", "kbsvcpod").CombinedOutput(); err != nil {
		return fmt.Errorf("ip netns add: %v: %s", err, out)
	}
	port, err := ctl.CreatePort(ctx, project, capi.Port{NetworkID: "benchpods", VethName: "eth0", NetworkNS: podNS, BindingHostID: "bench"})
	if err != nil {
		return err
	}
	if _, err := ctl.WaitPort(ctx, project, port.ID, capi.StatusUp, 30*time.Second); err != nil {
		return fmt.Errorf("agent did not plug its port: %w\n%s", err, b.c.Logs("agent", 3000))
	}
	if err := b.c.Do(func() error {
		var err error
		b.nf, err = mnl.Dial(unix.NETLINK_NETFILTER, nil)
		return err
	}); err != nil {
		return err
	}
	if err := b.startWatcher(); err != nil {
		return err
	}
	k := b.k
	if _, err := k.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	// The node's agent is host "bench": endpoints on this node are its
	// local members (externalTrafficPolicy Local).
	nd, err := k.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node,
		Annotations: map[string]string{podnet.HostIDAnnotation: "bench"}}}, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	nd.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.0.2.1"}}
	_, err = k.CoreV1().Nodes().UpdateStatus(ctx, nd, metav1.UpdateOptions{})
	return err
}

func (b *bench) start(name, bin string, args ...string) error {
	cmd := exec.Command(bin, args...)
	if b.profile != "" && (name == "agent" || name == "watcher") {
		cmd.Env = append(os.Environ(), "GODEBUG=gctrace=1")
	}
	p, err := b.c.StartProcess(name+"-"+strconv.Itoa(len(b.c.Processes())), cmd)
	if err != nil {
		return err
	}
	b.procs[name] = p
	return nil
}

func (b *bench) kill(name string) {
	if p := b.procs[name]; p != nil {
		p.Kill()
		delete(b.procs, name)
	}
}

func (b *bench) stopAll() {
	for n := range b.procs {
		b.kill(n)
	}
	if b.nf != nil {
		_ = b.nf.Close()
	}
	_ = exec.Command("ip", "netns", "del", "kbsvcpod").Run()
}

func (b *bench) startAgent() error {
	st := filepath.Join(b.dir, "agent")
	args := []string{"--controller", "http://" + ctlAddr,
		"--token-file", filepath.Join(b.dir, "ctl-token"), "--host-id", "bench", "--underlay-ip", "192.0.2.1",
		"--underlay-dev", "kbsu0", "--state-dir", st, "--link-prefix", prefix, "--nft-table", nftTable, "--lb-nft-table", lbTable, "--resync", "600s"}
	if b.profile != "" {
		args = append(args, "--metrics-listen", agentDebug, "--pprof")
	}
	if b.gcPercent != "" {
		args = append(args, "--gc-percent", b.gcPercent)
	}
	return b.start("agent", filepath.Join(b.c.BinDir, "kurma-agent"), args...)
}

func (b *bench) startWatcher() error {
	args := []string{"--kubeconfig", b.c.Kubeconfig,
		"--controller", "http://" + ctlAddr, "--token-file", filepath.Join(b.dir, "ctl-token"),
		"--service-cidr", kubecluster.ServiceCIDR, "--resync", "600s"}
	if b.profile != "" {
		args = append(args, "--debug-listen", watcherDebug)
	}
	if b.gcPercent != "" {
		args = append(args, "--gc-percent", b.gcPercent)
	}
	return b.start("watcher", filepath.Join(b.c.BinDir, "kurma-k8s-watcher"), args...)
}

// saveProfiles writes, for -profile, the heap profile (inuse and alloc
// since start), the MemStats text and the log (GC trace) of the watcher
// and the agent, as <proc>-<n>-<what>.
func (b *bench) saveProfiles(ctx context.Context, n int) error {
	hc := &http.Client{Transport: &http.Transport{DialContext: b.c.DialContext}, Timeout: time.Minute}
	for name, addr := range map[string]string{"agent": agentDebug, "watcher": watcherDebug} {
		base := filepath.Join(b.profile, name+"-"+strconv.Itoa(n))
		for suffix, path := range map[string]string{".heap.pb.gz": "/debug/pprof/heap", ".heap.txt": "/debug/pprof/heap?debug=1"} {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+path, nil)
			if err != nil {
				return err
			}
			resp, err := hc.Do(req)
			if err != nil {
				return fmt.Errorf("%s profile: %w", name, err)
			}
			body, err := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if err != nil {
				return err
			}
			if err := os.WriteFile(base+suffix, body, 0o644); err != nil {
				return err
			}
		}
		if p := b.procs[name]; p != nil && p.Log != "" {
			if lb, err := os.ReadFile(p.Log); err == nil {
				_ = os.WriteFile(base+".log", lb, 0o644)
			}
		}
	}
	return nil
}

// The kinds of Service the bench makes.
type svcKind int

const (
	clusterIP     svcKind = iota
	nodePort              // type NodePort
	localNodePort         // type NodePort, externalTrafficPolicy Local
)

func service(name string, kind svcKind) *corev1.Service {
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}}},
	}
	if kind != clusterIP {
		s.Spec.Type = corev1.ServiceTypeNodePort
	}
	if kind == localNodePort {
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	}
	return s
}

// timedService is Service i of the given kind as the bench creates it
// through the API. After an etcd fill, a timed Service (i from
// 1,000,000) asks for its own ClusterIP, timedIP, outside the fill's
// range: the fill's blind writes race kube-apiserver's IP repair
// controller (it may see a fill IPAddress before its Service, take it for
// an orphan and free it), and a randomly allocated VIP could then be one
// a fill Service still holds, so that the timed change never goes live.
// Node ports need no such care: the fill has none, and the API server
// allocates them from its own bitmap.
func (b *bench) timedService(i int, kind svcKind) (*corev1.Service, error) {
	s := service("s-"+strconv.Itoa(i), kind)
	if b.fillEtcd && i >= 1_000_000 {
		ip, err := timedIP(i - 1_000_000)
		if err != nil {
			return nil, err
		}
		s.Spec.ClusterIP = ip
	}
	return s, nil
}

// timedIP is timed Service j's ClusterIP: 10.96.0.10 onwards, below the
// etcd fill's 10.96.10.0 (svcIP) and above the API server's 10.96.0.1.
func timedIP(j int) (string, error) {
	const first, limit = 10, 10 * 256 // 10.96.0.10 … 10.96.9.255
	if first+j >= limit {
		return "", fmt.Errorf("timed Service %d: out of ClusterIPs below the fill's range (%d at most)", j, limit-first)
	}
	v := first + j
	return netip.AddrFrom4([4]byte{10, 96, byte(v >> 8), byte(v)}).String(), nil
}

// svcAndSlice creates Service i's slice (2 endpoints) and then the Service.
func (b *bench) svcAndSlice(ctx context.Context, i int, kind svcKind) (*corev1.Service, error) {
	name := "s-" + strconv.Itoa(i)
	svc, err := b.timedService(i, kind)
	if err != nil {
		return nil, err
	}
	if _, err := b.k.DiscoveryV1().EndpointSlices(ns).Create(ctx, slice(name, i, 0), metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	return b.k.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{})
}

func member(i, k, gen int) string {
	return netip.AddrFrom4([4]byte{10, byte(40 + gen*2 + k), byte(i >> 8), byte(i)}).String()
}

func slice(name string, i, gen int) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name + "-x", Labels: map[string]string{discoveryv1.LabelServiceName: name}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Port: new(int32(8080)), Protocol: new(corev1.ProtocolTCP), Name: new("")}},
	}
	for k := range 2 {
		g := 0
		if k == 1 {
			g = gen
		}
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{member(i, k, g)},
			Conditions: discoveryv1.EndpointConditions{Ready: new(true)}, NodeName: new(node)})
	}
	return s
}

// timedFill runs fill and prints its rate and the CPU time each of the
// cluster's processes spent during it, per 1,000 Services: where a slow
// fill's time goes.
func (b *bench) timedFill(ctx context.Context, n int) (*corev1.Service, error) {
	procs := b.c.Processes()
	before := make([]time.Duration, len(procs))
	for i, p := range procs {
		before[i], _ = cpuTime(p)
	}
	from, t0 := b.created, time.Now()
	profDone := make(chan error, 1)
	if b.apiProfile != "" && n > from {
		// Overwritten by each fill: the last (largest) one's is kept.
		go func() { profDone <- b.apiserverProfile(ctx) }()
	} else {
		profDone <- nil
	}
	var last *corev1.Service
	var err error
	if b.fillEtcd {
		last, err = b.etcdFill(ctx, n)
	} else {
		last, err = b.fill(ctx, n)
	}
	d := time.Since(t0)
	if perr := <-profDone; perr != nil {
		fmt.Printf("  kube-apiserver profile: %v\n", perr)
	}
	if err != nil || n == from {
		return last, err
	}
	per := float64(n-from) / 1000
	var cpu []string
	for i, p := range procs {
		select {
		case <-p.Done():
			continue
		default:
		}
		if after, err := cpuTime(p); err == nil && after-before[i] >= 10*time.Millisecond {
			cpu = append(cpu, fmt.Sprintf("%s %.2f s", p.Name, (after-before[i]).Seconds()/per))
		}
	}
	la, _ := os.ReadFile("/proc/loadavg")
	fmt.Printf("  fill: %d Services + slices in %s (%.0f Services/s, load %s); CPU per 1,000: %s\n",
		n-from, ms(d), float64(n-from)/d.Seconds(), strings.Join(strings.Fields(string(la))[:3], " "), strings.Join(cpu, ", "))
	return last, nil
}

// apiserverProfile writes a 30 s CPU profile of kube-apiserver, started
// with a fill, to -apiserver-profile (a fill shorter than that waits for
// it, outside its timed part).
func (b *bench) apiserverProfile(ctx context.Context) error {
	body, err := b.k.CoreV1().RESTClient().Get().AbsPath("/debug/pprof/profile").Param("seconds", "30").
		Timeout(2 * time.Minute).DoRaw(ctx)
	if err != nil {
		return err
	}
	return os.WriteFile(b.apiProfile, body, 0o644)
}

// fill creates Services up to n with 32 workers and returns the last.
func (b *bench) fill(ctx context.Context, n int) (*corev1.Service, error) {
	var mu sync.Mutex
	var last *corev1.Service
	var firstErr error
	next := b.created
	var wg sync.WaitGroup
	b.growVIPs(n)
	for range 32 {
		wg.Go(func() {
			for {
				mu.Lock()
				i := next
				next++
				mu.Unlock()
				if i >= n {
					return
				}
				s, err := b.svcAndSlice(ctx, i, clusterIP)
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = err
				}
				if s != nil && (last == nil || i == n-1) {
					last = s
				}
				if s != nil {
					b.vips[i] = s.Spec.ClusterIP
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	b.created = n
	return last, firstErr
}

func (b *bench) svcKey(vip string) []byte {
	var f [16]byte
	copy(f[:], b.iface)
	a := netip.MustParseAddr(vip).As4()
	k := append(f[:], a[:]...)
	k = append(k, unix.IPPROTO_TCP, 0, 0, 0)
	return append(k, 0, 80, 0, 0)
}

// vipLive reports whether the VIP's services element exists in either
// generation of the agent's sets.
func (b *bench) vipLive(vip string) (bool, error) {
	for _, set := range []string{"services-a", "services-b"} {
		_, ok, err := benchutil.GetElem(b.nf, lbTable, set, b.svcKey(vip))
		if err != nil || ok {
			return ok, err
		}
	}
	return false, nil
}

// memberLive reports whether addr is one of the VIP's first two backends.
func (b *bench) memberLive(vip, addr string) (bool, error) {
	a := netip.MustParseAddr(addr).As4()
	for _, set := range []string{"backends-a", "backends-b"} {
		for idx := range uint32(2) {
			k := append(b.svcKey(vip), binary.NativeEndian.AppendUint32(nil, idx)...)
			d, ok, err := benchutil.GetElem(b.nf, lbTable, set, k)
			if err != nil {
				return false, err
			}
			if ok && strings.Contains(string(d), string(a[:])) {
				return true, nil
			}
		}
	}
	return false, nil
}

// npKey is a TCP node port's key in the nodeports map.
func npKey(port int32) []byte {
	return []byte{unix.IPPROTO_TCP, 0, 0, 0, byte(port >> 8), byte(port), 0, 0}
}

// nodePortLive reports whether the node port's element exists in either
// generation of the agent's sets.
func (b *bench) nodePortLive(port int32) (bool, error) {
	for _, set := range []string{"nodeports-a", "nodeports-b"} {
		_, ok, err := benchutil.GetElem(b.nf, lbTable, set, npKey(port))
		if err != nil || ok {
			return ok, err
		}
	}
	return false, nil
}

// nodePortMemberLive reports whether addr is one of the node port's
// first two backends.
func (b *bench) nodePortMemberLive(port int32, addr string) (bool, error) {
	a := netip.MustParseAddr(addr).As4()
	for _, set := range []string{"nodeport-backends-a", "nodeport-backends-b"} {
		for idx := range uint32(2) {
			d, ok, err := benchutil.GetElem(b.nf, lbTable, set, binary.NativeEndian.AppendUint32(npKey(port), idx))
			if err != nil {
				return false, err
			}
			if ok && strings.Contains(string(d), string(a[:])) {
				return true, nil
			}
		}
	}
	return false, nil
}

// nodePortsOurs times (f) and (g), ours, and returns the names of the
// Services it made.
func (b *bench) nodePortsOurs(ctx context.Context, r *row, adds int) ([]string, error) {
	var npS, locS, ipS benchutil.Samples
	var made []string
	for range adds {
		// A ClusterIP add in the same loop (b'): the machine's load
		// drifts, and (f) is compared with adds made beside it.
		for _, kind := range []svcKind{clusterIP, nodePort, localNodePort} {
			i := 1_000_000 + b.seq
			b.seq++
			s, err := b.svcAndSlice(ctx, i, kind)
			if err != nil {
				return made, err
			}
			made = append(made, s.Name)
			t1 := time.Now()
			if kind == clusterIP {
				if err := spin(30*time.Second, "added VIP live", func() (bool, error) { return b.vipLive(s.Spec.ClusterIP) }); err != nil {
					return made, err
				}
				ipS = append(ipS, time.Since(t1))
				continue
			}
			np := s.Spec.Ports[0].NodePort
			if err := spin(30*time.Second, "added node port live", func() (bool, error) { return b.nodePortLive(np) }); err != nil {
				return made, err
			}
			if kind == nodePort {
				npS = append(npS, time.Since(t1))
				continue
			}
			if _, err := b.k.DiscoveryV1().EndpointSlices(ns).Update(ctx, b.bump(ctx, s.Name, i), metav1.UpdateOptions{}); err != nil {
				return made, err
			}
			t1 = time.Now()
			if err := spin(30*time.Second, "replaced local endpoint live", func() (bool, error) {
				return b.nodePortMemberLive(np, member(i, 1, 1))
			}); err != nil {
				return made, err
			}
			locS = append(locS, time.Since(t1))
		}
	}
	r.np50, r.np99, r.loc50, r.loc99 = npS.Pct(0.5), npS.Pct(0.99), locS.Pct(0.5), locS.Pct(0.99)
	r.ip50, r.ip99 = ipS.Pct(0.5), ipS.Pct(0.99)
	fmt.Printf("  (f) ours NodePort add p50 %s p99 %s (%.2f× the ClusterIP add p99 of (b), %.2f× that of (b') made in the same loop, p50 %s p99 %s); (g) eTP Local endpoint p50 %s p99 %s\n",
		ms(r.np50), ms(r.np99), ratio(r.np99, r.add99), ratio(r.np99, r.ip99), ms(r.ip50), ms(r.ip99), ms(r.loc50), ms(r.loc99))
	fmt.Printf("      slowest (f) %s; (g) %s\n", npS.Slowest(3), locS.Slowest(3))
	return made, nil
}

func spin(limit time.Duration, what string, f func() (bool, error)) error {
	deadline := time.Now().Add(limit)
	for {
		ok, err := f()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not within %s", what, limit)
		}
		time.Sleep(200 * time.Microsecond)
	}
}

func wait(limit time.Duration, what string, f func() error) error {
	return spin(limit, what, func() (bool, error) { return f() == nil, nil })
}

// withPeer is the -peer flag: false leaves kube-proxy out (its columns
// stay empty), for a run that compares ours with ours, such as (f)
// against (b), in minutes instead of the peer's half hour at 30,000.
var withPeer = flag.Bool("peer", true, "also time kube-proxy (false: ours only)")

func (b *bench) size(ctx context.Context, n, adds int) (row, error) {
	r := row{n: n}
	fmt.Printf("N=%d: creating %d Services and slices (watcher and agent %s)...\n", n, n-b.created,
		map[bool]string{true: "stopped", false: "running"}[b.fillStopped])
	if b.fillStopped {
		b.kill("watcher")
		b.kill("agent")
	}
	last, err := b.timedFill(ctx, n)
	if err != nil {
		return r, err
	}
	t0 := time.Now()
	if b.fillStopped {
		if err := b.startAgent(); err != nil {
			return r, err
		}
		if err := b.startWatcher(); err != nil {
			return r, err
		}
	}
	if err := spin(10*time.Minute, "last VIP live", func() (bool, error) { return b.vipLive(last.Spec.ClusterIP) }); err != nil {
		return r, err
	}
	r.all = time.Since(t0)
	// Every VIP live before anything is timed.
	for i := range n {
		if err := spin(10*time.Minute, "VIP "+b.vips[i]+" live", func() (bool, error) { return b.vipLive(b.vips[i]) }); err != nil {
			return r, err
		}
	}
	allLive := time.Since(t0)
	// Steady state before anything is timed: watcher, agent and
	// controller idle (under 5 % of a core each over a second).
	settle, err := b.settle(5 * time.Minute)
	if err != nil {
		return r, err
	}
	fmt.Printf("  settled (watcher, agent, controller idle) %s after all were live\n", ms(settle))
	if b.fillStopped {
		fmt.Printf("  (a) ours: watcher and agent started with N present (agent's tables kept) → last VIP live %s, all %d live %s\n", ms(r.all), n, ms(allLive))
	} else {
		fmt.Printf("  (a) ours: last created → live %s, all %d live %s\n", ms(r.all), n, ms(allLive))
	}

	// (b), (c) ours.
	var addS, memS benchutil.Samples
	var extra []string
	for range adds {
		i := 1_000_000 + b.seq
		b.seq++
		s, err := b.svcAndSlice(ctx, i, clusterIP)
		if err != nil {
			return r, err
		}
		t1 := time.Now()
		if err := spin(30*time.Second, "added VIP live", func() (bool, error) { return b.vipLive(s.Spec.ClusterIP) }); err != nil {
			return r, err
		}
		addS = append(addS, time.Since(t1))
		extra = append(extra, s.Name)
		if _, err := b.k.DiscoveryV1().EndpointSlices(ns).Update(ctx, b.bump(ctx, s.Name, i), metav1.UpdateOptions{}); err != nil {
			return r, err
		}
		t1 = time.Now()
		if err := spin(30*time.Second, "replaced endpoint live", func() (bool, error) {
			return b.memberLive(s.Spec.ClusterIP, member(i, 1, 1))
		}); err != nil {
			return r, err
		}
		memS = append(memS, time.Since(t1))
	}
	r.add50, r.add99, r.mem50, r.mem99 = addS.Pct(0.5), addS.Pct(0.99), memS.Pct(0.5), memS.Pct(0.99)
	fmt.Printf("  (b) ours add p50 %s p99 %s; (c) endpoint p50 %s p99 %s\n", ms(r.add50), ms(r.add99), ms(r.mem50), ms(r.mem99))
	fmt.Printf("      slowest (b) %s; (c) %s\n", addS.Slowest(3), memS.Slowest(3))
	if b.nodePorts {
		made, err := b.nodePortsOurs(ctx, &r, adds)
		extra = append(extra, made...)
		if err != nil {
			return r, err
		}
	}
	// Keep N exact for the peer: remove the extra Services.
	for _, name := range extra {
		_ = b.k.CoreV1().Services(ns).Delete(ctx, name, metav1.DeleteOptions{})
		_ = b.k.DiscoveryV1().EndpointSlices(ns).Delete(ctx, name+"-x", metav1.DeleteOptions{})
	}
	wrss, _ := hwm(b.procs["watcher"])
	arss, _ := hwm(b.procs["agent"])
	r.rssKiB = wrss + arss
	wcpu, _ := cpuTime(b.procs["watcher"])
	acpu, _ := cpuTime(b.procs["agent"])
	fmt.Printf("  (e) ours peak RSS watcher %.0f MiB + agent %.0f MiB (CPU since start: watcher %.1f s, agent %.1f s)\n",
		float64(wrss)/1024, float64(arss)/1024, wcpu.Seconds(), acpu.Seconds())
	fmt.Printf("      now: watcher %s; agent %s\n", rssSplit(b.procs["watcher"]), rssSplit(b.procs["agent"]))
	if b.profile != "" {
		if err := b.saveProfiles(ctx, n); err != nil {
			return r, err
		}
	}

	// (d) ours: kill -9 both, delete the agent's tables, start both.
	b.kill("watcher")
	b.kill("agent")
	for _, t := range []string{lbTable, nftTable} {
		_ = b.c.Command(ctx, "nft", "delete", "table", "inet", t).Run()
	}
	first, err := b.k.CoreV1().Services(ns).Get(ctx, "s-0", metav1.GetOptions{})
	if err != nil {
		return r, err
	}
	t0 = time.Now()
	if err := b.startAgent(); err != nil {
		return r, err
	}
	if err := b.startWatcher(); err != nil {
		return r, err
	}
	if err := spin(10*time.Minute, "cold sync", func() (bool, error) {
		ok, err := b.vipLive(first.Spec.ClusterIP)
		if !ok || err != nil {
			return ok, err
		}
		return b.vipLive(last.Spec.ClusterIP)
	}); err != nil {
		return r, err
	}
	r.cold = time.Since(t0)
	fmt.Printf("  (d) ours cold sync (watcher + agent started, tables gone) → VIPs live %s\n", ms(r.cold))

	if !*withPeer {
		return r, nil
	}
	// The peer, alone: watcher and agent stopped while it is timed.
	b.kill("watcher")
	b.kill("agent")
	if err := b.kubeProxy(ctx, &r, adds); err != nil {
		return r, err
	}
	if err := b.startAgent(); err != nil {
		return r, err
	}
	if err := b.startWatcher(); err != nil {
		return r, err
	}
	return r, nil
}

// settle waits until the watcher, the agent and the controller each used
// under 5 % of a core over a second, and returns when that was.
func (b *bench) settle(limit time.Duration) (time.Duration, error) {
	t0 := time.Now()
	procs := []*kubecluster.Process{b.procs["watcher"], b.procs["agent"], b.procs["controller"]}
	for time.Since(t0) < limit {
		var before []time.Duration
		for _, p := range procs {
			c, _ := cpuTime(p)
			before = append(before, c)
		}
		time.Sleep(time.Second)
		idle := true
		for i, p := range procs {
			if c, _ := cpuTime(p); c-before[i] > 50*time.Millisecond {
				idle = false
			}
		}
		if idle {
			return time.Since(t0), nil
		}
	}
	return 0, fmt.Errorf("watcher, agent and controller not idle within %s", limit)
}

// bump replaces the second endpoint of Service i's slice.
func (b *bench) bump(ctx context.Context, name string, i int) *discoveryv1.EndpointSlice {
	s := slice(name, i, 1)
	if cur, err := b.k.DiscoveryV1().EndpointSlices(ns).Get(ctx, name+"-x", metav1.GetOptions{}); err == nil {
		s.ResourceVersion = cur.ResourceVersion
	}
	return s
}

// kubeProxy times kube-proxy (nftables mode, in the cluster's namespace)
// from a cold start with the N Services present, then single adds and
// endpoint replacements, and reads its peak RSS.
func (b *bench) kubeProxy(ctx context.Context, r *row, adds int) error {
	_ = b.c.Command(ctx, "nft", "delete", "table", "ip", "kube-proxy").Run()
	_ = b.c.Command(ctx, "nft", "delete", "table", "ip6", "kube-proxy").Run()
	logPath := filepath.Join(b.dir, "kube-proxy-"+strconv.Itoa(r.n)+".log")
	lf, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer lf.Close()
	tail := newSyncTail(logPath)
	defer tail.stop()
	cmd := exec.Command(filepath.Join(b.c.BinDir, "k8s", "kube-proxy"), "--proxy-mode=nftables",
		"--kubeconfig="+b.c.Kubeconfig, "--hostname-override="+node, "--conntrack-max-per-core=0", "--conntrack-min=0",
		"--conntrack-tcp-timeout-established=0", "--conntrack-tcp-timeout-close-wait=0",
		"--metrics-bind-address=127.0.0.1:10249", "--healthz-bind-address=127.0.0.1:10256", "--v=2")
	cmd.Stdout, cmd.Stderr = lf, lf
	t0 := time.Now()
	p, err := b.c.StartProcess("kube-proxy-"+strconv.Itoa(r.n), cmd)
	if err != nil {
		return err
	}
	defer p.Stop(10 * time.Second)
	if _, err := tail.next(t0, 10*time.Minute); err != nil {
		return fmt.Errorf("kube-proxy cold sync: %w", err)
	}
	r.kpCold = time.Since(t0)
	fmt.Printf("  (d) kube-proxy cold start → first SyncProxyRules complete %s\n", ms(r.kpCold))
	var addS, memS benchutil.Samples
	var vips, names []string
	var nps []int32
	for range adds {
		i := 1_000_000 + b.seq
		b.seq++
		// The slice first (its own sync), then, once kube-proxy is quiet,
		// the Service: the next sync is the one that includes it.
		name := "s-" + strconv.Itoa(i)
		if _, err := b.k.DiscoveryV1().EndpointSlices(ns).Create(ctx, slice(name, i, 0), metav1.CreateOptions{}); err != nil {
			return err
		}
		tail.quiet()
		s, err := b.k.CoreV1().Services(ns).Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}}},
		}, metav1.CreateOptions{})
		if err != nil {
			return err
		}
		t1 := time.Now()
		at, err := tail.next(t1, 30*time.Second)
		if err != nil {
			return err
		}
		addS = append(addS, at.Sub(t1))
		vips, names = append(vips, s.Spec.ClusterIP), append(names, s.Name)
		tail.quiet()
		if _, err := b.k.DiscoveryV1().EndpointSlices(ns).Update(ctx, b.bump(ctx, s.Name, i), metav1.UpdateOptions{}); err != nil {
			return err
		}
		t1 = time.Now()
		if at, err = tail.next(t1, 30*time.Second); err != nil {
			return err
		}
		memS = append(memS, at.Sub(t1))
	}
	r.kpAdd50, r.kpAdd99, r.kpMem50, r.kpMem9 = addS.Pct(0.5), addS.Pct(0.99), memS.Pct(0.5), memS.Pct(0.99)
	if b.nodePorts {
		var npS, locS benchutil.Samples
		for range adds {
			for _, kind := range []svcKind{nodePort, localNodePort} {
				i := 1_000_000 + b.seq
				b.seq++
				name := "s-" + strconv.Itoa(i)
				if _, err := b.k.DiscoveryV1().EndpointSlices(ns).Create(ctx, slice(name, i, 0), metav1.CreateOptions{}); err != nil {
					return err
				}
				svc, err := b.timedService(i, kind)
				if err != nil {
					return err
				}
				tail.quiet()
				s, err := b.k.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{})
				if err != nil {
					return err
				}
				t1 := time.Now()
				at, err := tail.next(t1, 30*time.Second)
				if err != nil {
					return err
				}
				names = append(names, s.Name)
				if kind == nodePort {
					npS = append(npS, at.Sub(t1))
					nps = append(nps, s.Spec.Ports[0].NodePort)
					continue
				}
				tail.quiet()
				if _, err := b.k.DiscoveryV1().EndpointSlices(ns).Update(ctx, b.bump(ctx, s.Name, i), metav1.UpdateOptions{}); err != nil {
					return err
				}
				t1 = time.Now()
				if at, err = tail.next(t1, 30*time.Second); err != nil {
					return err
				}
				locS = append(locS, at.Sub(t1))
			}
		}
		r.kpNp50, r.kpNp99, r.kpLoc50, r.kpL99 = npS.Pct(0.5), npS.Pct(0.99), locS.Pct(0.5), locS.Pct(0.99)
		fmt.Printf("  (f) kube-proxy NodePort add p50 %s p99 %s; (g) eTP Local endpoint p50 %s p99 %s\n",
			ms(r.kpNp50), ms(r.kpNp99), ms(r.kpLoc50), ms(r.kpL99))
	}
	r.kpRSSKiB, _ = hwm(p)
	fmt.Printf("  (b) kube-proxy add p50 %s p99 %s; (c) endpoint p50 %s p99 %s; (e) peak RSS %.0f MiB\n",
		ms(r.kpAdd50), ms(r.kpAdd99), ms(r.kpMem50), ms(r.kpMem9), float64(r.kpRSSKiB)/1024)
	// Checked once, outside the timed part: every added VIP is in its map.
	out, err := b.c.Command(ctx, "nft", "list", "map", "ip", "kube-proxy", "service-ips").CombinedOutput()
	if err != nil {
		return fmt.Errorf("nft list: %v: %s", err, out)
	}
	for _, v := range vips {
		if !strings.Contains(string(out), v+" . tcp . 80") {
			return fmt.Errorf("kube-proxy's service-ips lacks %s", v)
		}
	}
	if len(nps) > 0 {
		out, err := b.c.Command(ctx, "nft", "list", "map", "ip", "kube-proxy", "service-nodeports").CombinedOutput()
		if err != nil {
			return fmt.Errorf("nft list: %v: %s", err, out)
		}
		for _, np := range nps {
			if !strings.Contains(string(out), "tcp . "+strconv.Itoa(int(np))+" ") {
				return fmt.Errorf("kube-proxy's service-nodeports lacks %d", np)
			}
		}
	}
	for _, name := range names {
		_ = b.k.CoreV1().Services(ns).Delete(ctx, name, metav1.DeleteOptions{})
		_ = b.k.DiscoveryV1().EndpointSlices(ns).Delete(ctx, name+"-x", metav1.DeleteOptions{})
	}
	p.Stop(10 * time.Second)
	_ = b.c.Command(ctx, "nft", "delete", "table", "ip", "kube-proxy").Run()
	_ = b.c.Command(ctx, "nft", "delete", "table", "ip6", "kube-proxy").Run()
	return nil
}

// syncTail follows kube-proxy's log and records when each
// "SyncProxyRules complete" line appears.
type syncTail struct {
	mu    sync.Mutex
	times []time.Time
	done  chan struct{}
}

func newSyncTail(path string) *syncTail {
	t := &syncTail{done: make(chan struct{})}
	go func() {
		var f *os.File
		for f == nil {
			f, _ = os.Open(path)
			select {
			case <-t.done:
				return
			case <-time.After(time.Millisecond):
			}
		}
		defer f.Close()
		rd := bufio.NewReader(f)
		var part string
		for {
			line, err := rd.ReadString('\n')
			part += line
			if err == nil {
				if strings.Contains(part, "SyncProxyRules complete") {
					t.mu.Lock()
					t.times = append(t.times, time.Now())
					t.mu.Unlock()
				}
				part = ""
				continue
			}
			select {
			case <-t.done:
				return
			case <-time.After(500 * time.Microsecond):
			}
		}
	}()
	return t
}

func (t *syncTail) stop() { close(t.done) }

// quiet waits until no sync has completed for 1.2 s (more than
// kube-proxy's 1 s minimum sync period), so that a sync triggered earlier
// is not mistaken for the one of the next write.
func (t *syncTail) quiet() {
	for {
		t.mu.Lock()
		var last time.Time
		if len(t.times) > 0 {
			last = t.times[len(t.times)-1]
		}
		t.mu.Unlock()
		d := time.Since(last)
		if d >= 1200*time.Millisecond {
			return
		}
		time.Sleep(1200*time.Millisecond - d)
	}
}

// next returns the time of the first sync completion seen after since.
func (t *syncTail) next(since time.Time, limit time.Duration) (time.Time, error) {
	deadline := time.Now().Add(limit)
	for {
		t.mu.Lock()
		i := slices.IndexFunc(t.times, func(x time.Time) bool { return x.After(since) })
		var at time.Time
		if i >= 0 {
			at = t.times[i]
		}
		t.mu.Unlock()
		if i >= 0 {
			return at, nil
		}
		if time.Now().After(deadline) {
			return time.Time{}, errors.New("no SyncProxyRules complete in time")
		}
		time.Sleep(time.Millisecond)
	}
}

// hwm returns a process's peak RSS (VmHWM) in KiB.
func hwm(p *kubecluster.Process) (int64, error) {
	if p == nil {
		return 0, errors.New("no process")
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.PID()))
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

// rssSplit returns a process's current resident memory by kind
// (anonymous: heap and stacks; file: its binary's pages).
func rssSplit(p *kubecluster.Process) string {
	if p == nil {
		return "?"
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.PID()))
	if err != nil {
		return err.Error()
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && (f[0] == "RssAnon:" || f[0] == "RssFile:") {
			kib, _ := strconv.ParseInt(f[1], 10, 64)
			out = append(out, fmt.Sprintf("%s %.1f MiB", strings.TrimSuffix(f[0], ":"), float64(kib)/1024))
		}
	}
	return strings.Join(out, ", ")
}

// cpuTime returns a process's user + system CPU time so far.
func cpuTime(p *kubecluster.Process) (time.Duration, error) {
	if p == nil {
		return 0, errors.New("no process")
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.PID()))
	if err != nil {
		return 0, err
	}
	// Fields after the command (which may hold spaces): state is the 3rd
	// field, utime and stime the 14th and 15th, in clock ticks (100/s).
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0, errors.New("short /proc stat")
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(u+st) * 10 * time.Millisecond, nil
}
