package datapath

import (
	"fmt"
	"net"
	"os/exec"
	"slices"
	"sync"
	"testing"
	"time"

	"kurma.dev/kurma/internal/agent/nettest"
	"kurma.dev/kurma/internal/testutil"
)

// BenchmarkPlug measures Plug of a fresh port (then Unplug, untimed).
func BenchmarkPlug(b *testing.B) {
	dp := benchDatapath(b)
	if err := dp.EnsureVPC(b.Context(), VPCSpec{VNI: 5, Gateways: []net.IPNet{{IP: net.IPv4(10, 5, 0, 1).To4(), Mask: net.CIDRMask(16, 32)}}}); err != nil {
		b.Fatal(err)
	}
	pod := nettest.NewNS(b, testutil.UniqueName(testPrefix))
	b.ResetTimer()
	for i := range b.N {
		spec := PortSpec{ID: fmt.Sprintf("bench-%d", i), VNI: 5, NetNS: pod, IfName: "eth0",
			MAC:   net.HardwareAddr{2, 0, 0, 0, byte(i >> 8), byte(i)},
			Addrs: []PortAddr{{Addr: net.IPNet{IP: net.IPv4(10, 5, byte(i>>8), byte(i)).To4(), Mask: net.CIDRMask(16, 32)}, Gateway: net.IPv4(10, 5, 0, 1).To4()}}}
		if err := dp.Plug(b.Context(), spec); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if err := dp.Unplug(b.Context(), spec.ID); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}

// BenchmarkSetGuards100 measures one SetGuards with 100 ports guarded
// that adds or removes the guard of a 101st (a port's arrival or
// departure).
func BenchmarkSetGuards100(b *testing.B) {
	dp := benchDatapath(b)
	var gs []Guard
	for i := range 101 {
		gs = append(gs, Guard{PortID: fmt.Sprintf("pod-%d", i), MAC: net.HardwareAddr{2, 0, 0, 0, 0, byte(i)},
			IPs: []net.IP{net.IPv4(10, 5, 0, byte(i)).To4()}})
	}
	if err := dp.SetGuards(b.Context(), gs[:100]); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := range b.N {
		if err := dp.SetGuards(b.Context(), gs[:100+(i+1)%2]); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPlugBurst plugs 100 ports, 4 at a time (the agent's urgent
// workers), while their 100 network namespaces are being made, each port
// as soon as its namespace exists, as a node's pod sandboxes and their
// CNI ADDs arrive together: every namespace creation and every plug
// request contend for the kernel's RTNL lock. It reports the burst's wall
// time and the plugs' p50 and p99.
func BenchmarkPlugBurst(b *testing.B) {
	const pods, workers = 100, 4
	dp := benchDatapath(b)
	if err := dp.EnsureVPC(b.Context(), VPCSpec{VNI: 5, Gateways: []net.IPNet{{IP: net.IPv4(10, 5, 0, 1).To4(), Mask: net.CIDRMask(16, 32)}}}); err != nil {
		b.Fatal(err)
	}
	var plugs, walls []time.Duration
	for round := range b.N {
		ready := make(chan int, pods)
		names := make([]string, pods)
		errs := make(chan error, 2*pods)
		var made sync.WaitGroup
		start := time.Now()
		for i := range pods {
			names[i] = testutil.UniqueName(testPrefix)
			made.Go(func() {
				if out, err := exec.Command("ip", "netns", "add", names[i]).CombinedOutput(); err != nil {
					errs <- fmt.Errorf("netns %s: %v: %s", names[i], err, out)
					return
				}
				if out, err := exec.Command("ip", "-n", names[i], "link", "set", "lo", "up").CombinedOutput(); err != nil {
					errs <- fmt.Errorf("lo up in %s: %v: %s", names[i], err, out)
				}
				ready <- i
			})
		}
		go func() { made.Wait(); close(ready) }()
		var mu sync.Mutex
		var plugged sync.WaitGroup
		for range workers {
			plugged.Go(func() {
				for i := range ready {
					spec := PortSpec{ID: fmt.Sprintf("burst-%d-%d", round, i), VNI: 5, NetNS: "/run/netns/" + names[i], IfName: "eth0",
						MAC:   net.HardwareAddr{2, 0, 0, byte(round), byte(i >> 8), byte(i)},
						Addrs: []PortAddr{{Addr: net.IPNet{IP: net.IPv4(10, 5, byte(1+round), byte(i)).To4(), Mask: net.CIDRMask(16, 32)}, Gateway: net.IPv4(10, 5, 0, 1).To4()}}}
					t0 := time.Now()
					err := dp.Plug(b.Context(), spec)
					d := time.Since(t0)
					if err != nil {
						errs <- err
						continue
					}
					mu.Lock()
					plugs = append(plugs, d)
					mu.Unlock()
				}
			})
		}
		plugged.Wait()
		walls = append(walls, time.Since(start))
		b.StopTimer()
		close(errs)
		for _, n := range names {
			_ = exec.Command("ip", "netns", "del", n).Run()
		}
		for err := range errs {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	slices.Sort(plugs)
	slices.Sort(walls)
	at := func(p float64) float64 {
		return float64(plugs[min(len(plugs)-1, int(float64(len(plugs))*p))]) / float64(time.Millisecond)
	}
	b.ReportMetric(float64(walls[len(walls)/2])/float64(time.Millisecond), "burst-ms")
	b.ReportMetric(at(0.5), "plug-p50-ms")
	b.ReportMetric(at(0.9), "plug-p90-ms")
	b.ReportMetric(at(0.99), "plug-p99-ms")
}

// benchDatapath is a Datapath on a host namespace of its own with a veth
// as its underlay, closed when b ends.
func benchDatapath(b *testing.B) *Datapath {
	testutil.RequireRoot(b)
	hostNS := nettest.NewNS(b, testutil.UniqueName(testPrefix))
	nettest.IP(b, hostNS, "link", "add", "kagtu0", "type", "veth", "peer", "name", "kagtu1")
	dp, err := New(b.Context(), Config{HostNS: hostNS, Prefix: testPrefix, UnderlayIP: net.ParseIP("192.0.2.1"),
		UnderlayDev: "kagtu0", NFTTable: testutil.UniqueName(testPrefix)})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = dp.Close() })
	return dp
}
