package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The allowed path of (e): client pod p101 (grp g-1, remote) to server
// pod p1 (app-1, local) on TCP port 1001, which policy 1 (and, at 10,000
// policies, 199 more selecting app-1) allows. Both pods are network
// namespaces of their own, routed through the cluster's namespace, where
// the policy process's forward chain filters them.
const (
	connServer = 1
	connClient = 101
	connPort   = 1001
)

// connTopo is the two pod namespaces and the server's listener.
type connTopo struct {
	client, server string // namespace names under /run/netns
	ln             net.Listener
	sink           chan struct{}
}

func run1(ctx context.Context, name string, args ...string) error {
	if out, err := exec.CommandContext(ctx, name, args...).CombinedOutput(); err != nil {
		return fmt.Errorf("%s %v: %w: %s", name, args, err, out)
	}
	return nil
}

// setupConn makes the pods: in each, eth0 holds the pod's address and a
// default route via 169.254.1.1 (the cluster side of its veth); the
// cluster's namespace routes each pod address to its veth and forwards.
func (b *bench) setupConn(ctx context.Context) (*connTopo, error) {
	t := &connTopo{client: fmt.Sprintf("kbnp-c%d", os.Getpid()), server: fmt.Sprintf("kbnp-s%d", os.Getpid())}
	if err := b.c.Do(func() error { return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644) }); err != nil {
		return nil, fmt.Errorf("ip_forward: %w", err)
	}
	for i, p := range []struct {
		name string
		pod  int
	}{{t.client, connClient}, {t.server, connServer}} {
		host := "kbnpv" + strconv.Itoa(i)
		ip := podIP(p.pod).String()
		if err := run1(ctx, "ip", "netns", "add", p.name); err != nil {
			t.close()
			return nil, err
		}
		for _, args := range [][]string{
			{"ip", "link", "add", host, "type", "veth", "peer", "name", "eth0", "netns", p.name},
			{"ip", "addr", "add", "169.254.1.1/32", "dev", host},
			{"ip", "link", "set", host, "up"},
			{"ip", "route", "add", ip + "/32", "dev", host},
		} {
			if err := b.c.Command(ctx, args[0], args[1:]...).Run(); err != nil {
				t.close()
				return nil, fmt.Errorf("%v: %w", args, err)
			}
		}
		for _, args := range [][]string{
			{"link", "set", "lo", "up"},
			{"addr", "add", ip + "/32", "dev", "eth0"},
			{"link", "set", "eth0", "up"},
			{"route", "add", "169.254.1.1", "dev", "eth0"},
			{"route", "add", "default", "via", "169.254.1.1", "dev", "eth0"},
		} {
			if err := run1(ctx, "ip", append([]string{"-n", p.name}, args...)...); err != nil {
				t.close()
				return nil, err
			}
		}
	}
	err := inNS(t.server, func() error {
		var err error
		t.ln, err = net.Listen("tcp4", net.JoinHostPort(podIP(connServer).String(), strconv.Itoa(connPort)))
		return err
	})
	if err != nil {
		t.close()
		return nil, err
	}
	t.sink = make(chan struct{})
	go t.serve()
	return t, nil
}

// serve accepts until the listener closes; each connection is drained.
func (t *connTopo) serve() {
	defer close(t.sink)
	for {
		c, err := t.ln.Accept()
		if err != nil {
			return
		}
		go func() {
			_, _ = io.Copy(io.Discard, c)
			_ = c.Close()
		}()
	}
}

func (t *connTopo) close() {
	if t.ln != nil {
		_ = t.ln.Close()
		<-t.sink
	}
	for _, n := range []string{t.client, t.server} {
		_ = exec.Command("ip", "netns", "del", n).Run() // its veth goes with it
	}
}

func inNS(name string, f func() error) error {
	n, err := ns.GetNS("/run/netns/" + name)
	if err != nil {
		return err
	}
	defer n.Close()
	return n.Do(func(ns.NetNS) error { return f() })
}

// stream sends on one connection for dur and returns the rate in Mbit/s.
func stream(d net.Dialer, addr string, dur time.Duration) (float64, error) {
	c, err := d.Dial("tcp4", addr)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	buf := make([]byte, 64<<10)
	var sent int64
	start := time.Now()
	_ = c.SetWriteDeadline(start.Add(dur))
	for {
		k, err := c.Write(buf)
		sent += int64(k)
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				break
			}
			return 0, err
		}
	}
	return float64(sent) * 8 / time.Since(start).Seconds() / 1e6, nil
}

// measure times n sequential connects (SYN to established, the SYN
// through the policy lookups) and the median throughput of three streams
// of dur/3 each.
func (t *connTopo) measure(n int, dur time.Duration) (p50, p99 time.Duration, mbps float64, err error) {
	ds, rates, err := t.sample(n, dur)
	if err != nil {
		return 0, 0, 0, err
	}
	r := summarize(ds, rates)
	return r.conn50, r.conn99, r.mbps, nil
}

// sample returns n sequential connects' times and three streams' rates
// (of dur/3 each).
func (t *connTopo) sample(n int, dur time.Duration) (ds []time.Duration, rates []float64, err error) {
	addr := net.JoinHostPort(podIP(connServer).String(), strconv.Itoa(connPort))
	err = inNS(t.client, func() error {
		d := net.Dialer{Timeout: 2 * time.Second}
		for range n {
			t0 := time.Now()
			c, err := d.Dial("tcp4", addr)
			if err != nil {
				return err
			}
			ds = append(ds, time.Since(t0))
			_ = c.(*net.TCPConn).SetLinger(0) // RST: no TIME_WAIT pile-up
			_ = c.Close()
		}
		for range 3 {
			r, err := stream(d, addr, dur/3)
			if err != nil {
				return err
			}
			rates = append(rates, r)
		}
		return nil
	})
	return ds, rates, err
}

// connResult is (e) of one state: connect p50/p99, the median stream
// rate, and every stream's rate.
type connResult struct {
	conn50, conn99 time.Duration
	mbps           float64
	rates          []float64
}

func summarize(ds []time.Duration, rates []float64) connResult {
	ds, rates = slices.Clone(ds), slices.Clone(rates)
	slices.Sort(ds)
	slices.Sort(rates)
	return connResult{conn50: ds[len(ds)/2], conn99: ds[min(len(ds)-1, len(ds)*99/100)], mbps: rates[len(rates)/2], rates: rates}
}

// alternate measures the allowed path with the server pod selected by its
// policies (on) and selected by none (off: it is relabelled out of
// app-1, so its packets meet the same chain and the same two isolation
// lookups miss, as with no policy at all; established packets are
// accepted by conntrack before any lookup either way), rounds times
// each, in pairs whose order alternates (on off, off on, ...), so that
// the machine's drifting load falls on both alike. It returns each
// state's pooled figures and the median over the pairs of the ratio of
// their median stream rates (on / off). The pod is selected again at
// the end.
func (b *bench) alternate(ctx context.Context, rounds int) (on, off connResult, ratio float64, err error) {
	var dOn, dOff []time.Duration
	var rOn, rOff, ratios []float64
	for i := range rounds {
		var pair [2][]float64
		for k := range 2 {
			sel := (i+k)%2 == 0
			if err := b.selectServer(ctx, sel); err != nil {
				return on, off, 0, err
			}
			ds, rates, err := b.conn.sample(connN/rounds, connDur)
			if err != nil {
				return on, off, 0, err
			}
			if sel {
				dOn, rOn, pair[0] = append(dOn, ds...), append(rOn, rates...), rates
			} else {
				dOff, rOff, pair[1] = append(dOff, ds...), append(rOff, rates...), rates
			}
		}
		ratios = append(ratios, median(pair[0])/median(pair[1]))
	}
	if err := b.selectServer(ctx, true); err != nil {
		return on, off, 0, err
	}
	return summarize(dOn, rOn), summarize(dOff, rOff), median(ratios), nil
}

func median(fs []float64) float64 {
	s := slices.Clone(fs)
	slices.Sort(s)
	if len(s)%2 == 0 {
		return (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return s[len(s)/2]
}

// selectServer labels the server pod app-1 (selected by the policies
// allowing the path) or app-none (by none) and waits until the kernel's
// ingress isolation set holds it, or not.
func (b *bench) selectServer(ctx context.Context, sel bool) error {
	name := fmt.Sprintf("p%d", connServer)
	p, err := b.kc.CoreV1().Pods(nsName).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	app := "app-none"
	if sel {
		app = fmt.Sprintf("app-%d", connServer%apps)
	}
	if p.Labels["app"] != app {
		p.Labels["app"] = app
		if _, err := b.kc.CoreV1().Pods(nsName).Update(ctx, p, metav1.UpdateOptions{}); err != nil {
			return err
		}
	}
	a := podIP(connServer).As4()
	return b.untilIn("pol-in-iso", a[:], sel, 30*time.Second)
}
