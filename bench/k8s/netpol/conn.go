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
	addr := net.JoinHostPort(podIP(connServer).String(), strconv.Itoa(connPort))
	var ds []time.Duration
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
		// Three streams of dur/3; the median.
		var rates []float64
		for range 3 {
			r, err := stream(d, addr, dur/3)
			if err != nil {
				return err
			}
			rates = append(rates, r)
		}
		slices.Sort(rates)
		mbps = rates[1]
		return nil
	})
	if err != nil {
		return 0, 0, 0, err
	}
	slices.Sort(ds)
	return ds[len(ds)/2], ds[min(len(ds)-1, len(ds)*99/100)], mbps, nil
}
