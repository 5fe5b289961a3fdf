package main

// The agent part of bench/lb: the load-balancer datapath (internal/agent/
// lbpath) against the peer layout, a chain per load balancer as kube-proxy
// writes it, built in the same namespace by the same nft code path
// (knftables, nft -f). Everything runs in namespaces this program creates
// (prefix "klbb") and removes. Needs root, nft and iperf3.

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	mnl "github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"

	"kurma.dev/kurma/bench/internal/benchutil"
	"kurma.dev/kurma/internal/agent/lbpath"
)

const (
	abBridge = "klbbbr0"
	abTable  = "klbb"
	abPeer   = "klbbpeer"
)

type agentBench struct {
	nss  []string
	host string // host namespace path
	pods map[string]string
	n    int
}

func runAgentBench(ctx context.Context, sizes []int, peerMax, connects, rounds int) (retErr error) {
	b := &agentBench{pods: map[string]string{}}
	defer b.cleanup()
	if err := b.topo(); err != nil {
		return err
	}
	fmt.Println("== agent datapath (lbpath: map elements over netlink) vs chain per load balancer (nft -f)")
	fmt.Printf("machine: %d CPUs, kernel %s\n", runtime.NumCPU(), kernel())

	p, err := lbpath.New(ctx, lbpath.Config{HostNS: b.host, Table: abTable})
	if err != nil {
		return err
	}
	defer func() { _ = p.Close() }()
	conn, err := b.nfConn()
	if err != nil {
		return err
	}
	defer conn.Close()

	type row struct {
		n                 int
		cold, restart     time.Duration
		addP50, addP99    time.Duration
		memP50, memP99    time.Duration
		rssKiB            int64
		peerCold          time.Duration
		peerP50, peerP99  time.Duration
		connP50, connP99  time.Duration
		peerMeasured      bool
		connectsMeasured  bool
		peerConnP50       time.Duration
		peerConnMeasuredN int
	}
	var rows []row
	for _, n := range sizes {
		r := row{n: n}
		st := synthState(n)
		if err := p.Sync(ctx, lbpath.State{}); err != nil {
			return err
		}
		t0 := time.Now()
		if err := p.Sync(ctx, st); err != nil {
			return fmt.Errorf("cold sync of %d: %w", n, err)
		}
		r.cold = time.Since(t0)
		// Restart: a fresh Path (no memory of the kernel) converges on the
		// same state: reads every element back, writes nothing.
		t0 = time.Now()
		p2, err := lbpath.New(ctx, lbpath.Config{HostNS: b.host, Table: abTable})
		if err != nil {
			return err
		}
		err = p2.Sync(ctx, st)
		r.restart = time.Since(t0)
		if err != nil {
			return err
		}
		// The new Path switched the sets' generation: it is the one to use.
		_ = p.Close()
		p = p2
		// One create with n present, until read back through netlink.
		var adds, mems benchutil.Samples
		for i := range 200 {
			l := synthLB(n+i, 2)
			t0 := time.Now()
			if err := p.Apply(ctx, lbpath.Changes{LBs: []lbpath.LB{l}}); err != nil {
				return err
			}
			if err := waitElem(conn, abTable, p.SetName("services"), svcKeyBytes(l.Iface, l.VIP, lbpath.TCP, 80), true); err != nil {
				return err
			}
			adds = append(adds, time.Since(t0))
			// Replace one member.
			l.Members[1].Addr = netip.AddrFrom4([4]byte{10, 2, byte(i >> 8), byte(i)})
			t0 = time.Now()
			if err := p.Apply(ctx, lbpath.Changes{LBs: []lbpath.LB{l}}); err != nil {
				return err
			}
			k := append(svcKeyBytes(l.Iface, l.VIP, lbpath.TCP, 80), binary.NativeEndian.AppendUint32(nil, 1)...)
			if err := waitElemVal(conn, abTable, p.SetName("backends"), k, l.Members[1].Addr); err != nil {
				return err
			}
			mems = append(mems, time.Since(t0))
		}
		r.addP50, r.addP99 = adds.Pct(0.50), adds.Pct(0.99)
		r.memP50, r.memP99 = mems.Pct(0.50), mems.Pct(0.99)
		if rss, err := childRSS(n); err == nil {
			r.rssKiB = rss
		} else {
			fmt.Println("rss:", err)
		}
		if connects > 0 {
			c, err := b.connectLatency(ctx, p, n, connects)
			if err != nil {
				return err
			}
			r.connP50, r.connP99 = c.Pct(0.50), c.Pct(0.99)
			r.connectsMeasured = true
		}
		if err := p.Sync(ctx, lbpath.State{}); err != nil {
			return err
		}
		if n <= peerMax {
			cold, ch, err := b.peer(ctx, n)
			if err != nil {
				return fmt.Errorf("peer at %d: %w", n, err)
			}
			r.peerCold, r.peerP50, r.peerP99 = cold, ch.Pct(0.50), ch.Pct(0.99)
			r.peerMeasured = true
		}
		rows = append(rows, r)
	}
	fmt.Println()
	fmt.Printf("%-7s %-10s %-10s %-18s %-18s %-9s %-18s %-22s\n", "LBs", "cold sync", "restart", "create p50/p99", "member p50/p99", "RSS", "connect p50/p99", "peer cold / create p50,p99")
	for _, r := range rows {
		peer := "not run (see README)"
		if r.peerMeasured {
			peer = fmt.Sprintf("%s / %s, %s", ms(r.peerCold), ms(r.peerP50), ms(r.peerP99))
		}
		conn := "-"
		if r.connectsMeasured {
			conn = fmt.Sprintf("%s / %s", us(r.connP50), us(r.connP99))
		}
		fmt.Printf("%-7d %-10s %-10s %-18s %-18s %-9s %-18s %-22s\n", r.n, ms(r.cold), ms(r.restart),
			ms(r.addP50)+" / "+ms(r.addP99), ms(r.memP50)+" / "+ms(r.memP99), fmt.Sprintf("%.1fMiB", float64(r.rssKiB)/1024), conn, peer)
		if r.peerMeasured {
			fmt.Printf("        ratio peer/ours: cold %.1fx, create p99 %.1fx\n", float64(r.peerCold)/float64(r.cold), float64(r.peerP99)/float64(r.addP99))
		}
	}
	var first, last time.Duration
	for _, r := range rows {
		if r.connectsMeasured {
			if first == 0 {
				first = r.connP50
			}
			last = r.connP50
		}
	}
	if first > 0 {
		fmt.Printf("connect p50 through the VIP, largest/smallest table: %.2fx (goal <= 1.2x)\n", float64(last)/float64(first))
	}
	return b.throughput(ctx, p, rounds)
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2fms", benchutil.Ms(d)) }
func us(d time.Duration) string { return fmt.Sprintf("%.0fus", float64(d)/float64(time.Microsecond)) }

func kernel() string {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return "?"
	}
	return unix.ByteSliceToString(u.Release[:])
}

// synthLB is load balancer i: VIP 10.96.x.y:80 -> two members on 8080
// (the first two member pods of the topology, so traffic works).
func synthLB(i, members int) lbpath.LB {
	l := lbpath.LB{ID: "lb" + strconv.Itoa(i), Iface: abBridge,
		VIP:       netip.AddrFrom4([4]byte{10, byte(96 + i>>16), byte(i >> 8), byte(i)}),
		Listeners: []lbpath.Listener{{Proto: lbpath.TCP, Port: 80, TargetPort: 8080}}}
	for m := range members {
		l.Members = append(l.Members, lbpath.Member{Addr: netip.AddrFrom4([4]byte{10, 0, 0, byte(11 + m)})})
	}
	return l
}

func synthState(n int) lbpath.State {
	st := lbpath.State{LBs: make([]lbpath.LB, n)}
	for i := range n {
		st.LBs[i] = synthLB(i, 2)
	}
	return st
}

func svcKeyBytes(iface string, vip netip.Addr, proto uint8, port uint16) []byte {
	var f [16]byte
	copy(f[:], iface)
	a := vip.As4()
	b := append(f[:], a[:]...)
	b = append(b, proto, 0, 0, 0)
	return append(b, byte(port>>8), byte(port), 0, 0)
}

func (b *agentBench) cleanup() {
	for _, n := range b.nss {
		_ = exec.Command("ip", "netns", "del", n).Run()
	}
}

func (b *agentBench) newNS() (string, error) {
	n := uniqName("klbb")
	if err := runCmd("ip", "netns", "add", n); err != nil {
		return "", err
	}
	b.nss = append(b.nss, n)
	p := "/run/netns/" + n
	return p, runCmd("ip", "-n", n, "link", "set", "lo", "up")
}

// topo: a host namespace with a bridge (10.0.0.1/24, forwarding on) and
// pods client (.10), m0 (.11), m1 (.12) on it, hairpin on every port.
func (b *agentBench) topo() error {
	var err error
	if b.host, err = b.newNS(); err != nil {
		return err
	}
	h := nsName(b.host)
	for _, args := range [][]string{
		{"ip", "netns", "exec", h, "sysctl", "-qw", "net.ipv4.ip_forward=1"},
		{"ip", "-n", h, "link", "add", abBridge, "type", "bridge"},
		{"ip", "-n", h, "addr", "add", "10.0.0.1/24", "dev", abBridge},
		{"ip", "-n", h, "link", "set", abBridge, "up"},
	} {
		if err := runCmd(args[0], args[1:]...); err != nil {
			return err
		}
	}
	for i, name := range []string{"client", "m0", "m1"} {
		p, err := b.newNS()
		if err != nil {
			return err
		}
		hv := fmt.Sprintf("klbbv%d", i)
		ip := fmt.Sprintf("10.0.0.%d/24", 10+i)
		for _, args := range [][]string{
			{"ip", "-n", h, "link", "add", hv, "type", "veth", "peer", "name", "eth0", "netns", nsName(p)},
			{"ip", "-n", h, "link", "set", hv, "master", abBridge, "up"},
			{"ip", "-n", h, "link", "set", hv, "type", "bridge_slave", "hairpin", "on"},
			{"ip", "-n", nsName(p), "addr", "add", ip, "dev", "eth0"},
			{"ip", "-n", nsName(p), "link", "set", "eth0", "up"},
			{"ip", "-n", nsName(p), "route", "add", "default", "via", "10.0.0.1"},
		} {
			if err := runCmd(args[0], args[1:]...); err != nil {
				return err
			}
		}
		b.pods[name] = p
	}
	return nil
}

func nsName(p string) string { return p[strings.LastIndex(p, "/")+1:] }

func runCmd(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %v: %w: %s", name, args, err, out)
	}
	return nil
}

// nfConn opens a netfilter netlink socket in the host namespace, for
// reading single elements back.
func (b *agentBench) nfConn() (*mnl.Conn, error) { return b.nfConnAt(b.host) }

func waitElem(c *mnl.Conn, table, set string, key []byte, want bool) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, ok, err := benchutil.GetElem(c, table, set, key)
		if err != nil {
			return fmt.Errorf("read element back: %w", err)
		}
		if ok == want {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("element of %s never became %v", set, want)
		}
	}
}

// waitElemVal waits until a backends element's data holds addr.
func waitElemVal(c *mnl.Conn, table, set string, key []byte, addr netip.Addr) error {
	a := addr.As4()
	deadline := time.Now().Add(10 * time.Second)
	for {
		data, ok, err := benchutil.GetElem(c, table, set, key)
		if err != nil {
			return fmt.Errorf("read element back: %w", err)
		}
		if ok && strings.Contains(string(data), string(a[:])) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("element of %s never got %v", set, addr)
		}
	}
}

// peer loads n load balancers as kube-proxy lays them out (a chain per
// load balancer, a verdict map pointing at it) through knftables in one
// nft -f, then times single creates until read back.
func (b *agentBench) peer(ctx context.Context, n int) (time.Duration, benchutil.Samples, error) {
	var nft knftables.Interface
	err := ns.WithNetNSPath(b.host, func(ns.NetNS) error {
		var err error
		nft, err = knftables.New(knftables.InetFamily, abPeer)
		return err
	})
	if err != nil {
		return 0, nil, err
	}
	run := func(tx *knftables.Transaction) error {
		return ns.WithNetNSPath(b.host, func(ns.NetNS) error { return nft.Run(ctx, tx) })
	}
	defer func() {
		tx := nft.NewTransaction()
		tx.Delete(&knftables.Table{})
		_ = run(tx)
	}()
	addLB := func(tx *knftables.Transaction, i int) {
		l := synthLB(i, 2)
		ch := "lb-" + strconv.Itoa(i)
		tx.Add(&knftables.Chain{Name: ch})
		tx.Add(&knftables.Rule{Chain: ch, Rule: fmt.Sprintf("meta l4proto tcp dnat ip to numgen random mod 2 map { 0 : %s . 8080, 1 : %s . 8080 }", l.Members[0].Addr, l.Members[1].Addr)})
		tx.Add(&knftables.Element{Map: "services", Key: []string{strconv.Quote(abBridge), l.VIP.String(), "tcp", "80"}, Value: []string{"goto " + ch}})
	}
	tx := nft.NewTransaction()
	tx.Add(&knftables.Table{})
	tx.Add(&knftables.Map{Name: "services", TypeOf: "iifname . ip daddr . meta l4proto . th dport : verdict"})
	hook, prio, typ := knftables.PreroutingHook, knftables.DNATPriority, knftables.NATType
	tx.Add(&knftables.Chain{Name: "nat-pre", Type: &typ, Hook: &hook, Priority: &prio})
	tx.Add(&knftables.Rule{Chain: "nat-pre", Rule: "iifname . ip daddr . meta l4proto . th dport vmap @services"})
	for i := range n {
		addLB(tx, i)
	}
	t0 := time.Now()
	if err := run(tx); err != nil {
		return 0, nil, err
	}
	cold := time.Since(t0)
	conn, err := b.nfConn()
	if err != nil {
		return 0, nil, err
	}
	defer conn.Close()
	var s benchutil.Samples
	for i := range 20 {
		tx := nft.NewTransaction()
		addLB(tx, n+i)
		l := synthLB(n+i, 2)
		t0 := time.Now()
		if err := run(tx); err != nil {
			return 0, nil, err
		}
		if err := waitElem(conn, abPeer, "services", svcKeyBytes(abBridge, l.VIP, lbpath.TCP, 80), true); err != nil {
			return 0, nil, err
		}
		s = append(s, time.Since(t0))
	}
	return cold, s, nil
}

// connectLatency times TCP connects from the client pod to a VIP (whose
// members m0, m1 accept on 8080) with n load balancers in the table.
func (b *agentBench) connectLatency(ctx context.Context, p *lbpath.Path, n, count int) (benchutil.Samples, error) {
	stop, err := b.serve("m0", "10.0.0.11:8080")
	if err != nil {
		return nil, err
	}
	defer stop()
	stop2, err := b.serve("m1", "10.0.0.12:8080")
	if err != nil {
		return nil, err
	}
	defer stop2()
	vip := synthLB(n/2, 2).VIP.String() + ":80" // one from the middle of the table
	var s benchutil.Samples
	err = ns.WithNetNSPath(b.pods["client"], func(ns.NetNS) error {
		d := net.Dialer{Timeout: 2 * time.Second}
		for range count {
			t0 := time.Now()
			c, err := d.DialContext(ctx, "tcp", vip)
			if err != nil {
				return err
			}
			s = append(s, time.Since(t0))
			_, _ = io.Copy(io.Discard, c)
			_ = c.Close()
		}
		return nil
	})
	return s, err
}

// serve accepts TCP connections on addr in pod name and closes them.
func (b *agentBench) serve(name, addr string) (func(), error) {
	var ln net.Listener
	err := ns.WithNetNSPath(b.pods[name], func(ns.NetNS) error {
		var err error
		ln, err = net.Listen("tcp", addr)
		return err
	})
	if err != nil {
		return nil, err
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
	return func() { _ = ln.Close() }, nil
}

// throughput runs iperf3 (5 s each): pod->pod over the bridge, pod->VIP
// (one member, so every flow is DNATed to the same server), and a raw
// veth pair between two namespaces as the physical limit.
func (b *agentBench) throughput(ctx context.Context, p *lbpath.Path, rounds int) error {
	if _, err := exec.LookPath("iperf3"); err != nil {
		fmt.Println("iperf3 not installed (hack/apt-packages.txt): throughput skipped")
		return nil
	}
	l := synthLB(0, 1)
	l.Listeners[0] = lbpath.Listener{Proto: lbpath.TCP, Port: 5201, TargetPort: 5201}
	if err := p.Sync(ctx, lbpath.State{LBs: []lbpath.LB{l}}); err != nil {
		return err
	}
	a, err := b.newNS()
	if err != nil {
		return err
	}
	z, err := b.newNS()
	if err != nil {
		return err
	}
	for _, args := range [][]string{
		{"ip", "-n", nsName(a), "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", nsName(z)},
		{"ip", "-n", nsName(a), "addr", "add", "10.9.0.1/24", "dev", "eth0"},
		{"ip", "-n", nsName(z), "addr", "add", "10.9.0.2/24", "dev", "eth0"},
		{"ip", "-n", nsName(a), "link", "set", "eth0", "up"},
		{"ip", "-n", nsName(z), "link", "set", "eth0", "up"},
	} {
		if err := runCmd(args[0], args[1:]...); err != nil {
			return err
		}
	}
	// Interleaved rounds: a busy neighbour slows all three paths alike.
	var raws, directs, vips []float64
	for range max(rounds, 1) {
		raw, err := iperf(ctx, z, "10.9.0.2", a, "10.9.0.2")
		if err != nil {
			return err
		}
		direct, err := iperf(ctx, b.pods["m0"], "10.0.0.11", b.pods["client"], "10.0.0.11")
		if err != nil {
			return err
		}
		vip, err := iperf(ctx, b.pods["m0"], "10.0.0.11", b.pods["client"], l.VIP.String())
		if err != nil {
			return err
		}
		raws, directs, vips = append(raws, raw), append(directs, direct), append(vips, vip)
	}
	raw, direct, vip := medianF(raws), medianF(directs), medianF(vips)
	fmt.Printf("\nTCP throughput (iperf3, 1 stream, 5 s, median of %d interleaved rounds): raw veth %.2f Gbit/s, pod->pod %.2f Gbit/s, pod->VIP %.2f Gbit/s\n",
		len(raws), raw, direct, vip)
	fmt.Printf("rounds: raw %.2f, pod->pod %.2f, pod->VIP %.2f\n", raws, directs, vips)
	fmt.Printf("ratio pod->VIP / pod->pod: %.2fx (goal >= 0.8x); pod->pod / raw veth: %.2fx\n", vip/direct, direct/raw)
	return p.Sync(ctx, lbpath.State{})
}

// iperf runs an iperf3 server bound to bind in server ns and a 5 s client
// to target in client ns; it returns the received rate in Gbit/s.
func iperf(ctx context.Context, server, bind, client, target string) (float64, error) {
	srv := exec.CommandContext(ctx, "ip", "netns", "exec", nsName(server), "iperf3", "-s", "-1", "-B", bind)
	if err := srv.Start(); err != nil {
		return 0, err
	}
	defer func() { _ = srv.Process.Kill(); _ = srv.Wait() }()
	var res struct {
		Error string `json:"error"`
		End   struct {
			SumReceived struct {
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
	}
	var out []byte
	var err error
	// The server may not listen yet: iperf3 -J then reports the error in
	// its JSON (exit status 0 or not).
	for range 50 {
		out, err = exec.CommandContext(ctx, "ip", "netns", "exec", nsName(client), "iperf3", "-c", target, "-t", "5", "-J").Output()
		res.Error, res.End.SumReceived.BitsPerSecond = "", 0
		if jerr := json.Unmarshal(out, &res); jerr == nil && res.Error == "" && res.End.SumReceived.BitsPerSecond > 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if res.Error != "" || res.End.SumReceived.BitsPerSecond == 0 {
		return 0, fmt.Errorf("iperf3 to %s: %v %q: %s", target, err, res.Error, out)
	}
	return res.End.SumReceived.BitsPerSecond / 1e9, nil
}

// childRSS runs this program again as "-part agent-rss -n N": a process
// that holds only an lbpath.Path synced to N load balancers, and reports
// its VmRSS (KiB).
func childRSS(n int) (int64, error) {
	self, err := os.Executable()
	if err != nil {
		return 0, err
	}
	out, err := exec.Command(self, "-part", "agent-rss", "-n", strconv.Itoa(n)).CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("%w: %s", err, out)
	}
	f := strings.Fields(string(out))
	if len(f) == 0 {
		return 0, fmt.Errorf("no output")
	}
	return strconv.ParseInt(f[len(f)-1], 10, 64)
}

// agentRSS is the child of childRSS.
func agentRSS(ctx context.Context, n int) error {
	b := &agentBench{pods: map[string]string{}}
	defer b.cleanup()
	h, err := b.newNS()
	if err != nil {
		return err
	}
	p, err := lbpath.New(ctx, lbpath.Config{HostNS: h, Table: abTable})
	if err != nil {
		return err
	}
	defer p.Close()
	if err := p.Sync(ctx, synthState(n)); err != nil {
		return err
	}
	runtime.GC()
	rss, err := vmRSS()
	if err != nil {
		return err
	}
	fmt.Println(rss)
	return nil
}

func vmRSS() (int64, error) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, err
	}
	return parseRSS(string(b))
}

// parseRSS returns VmRSS (KiB) from a /proc/<pid>/status text.
func parseRSS(status string) (int64, error) {
	for _, line := range strings.Split(status, "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			return strconv.ParseInt(strings.Fields(v)[0], 10, 64)
		}
	}
	return 0, errors.New("no VmRSS")
}

func medianF(v []float64) float64 {
	c := slices.Clone(v)
	slices.Sort(c)
	return c[len(c)/2]
}

func parseSizes(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("sizes %q: %v", s, f)
		}
		out = append(out, n)
	}
	slices.Sort(out)
	return out, nil
}
