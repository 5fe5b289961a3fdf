package agent

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"kurma.dev/kurma/internal/agent/datapath"
	"kurma.dev/kurma/internal/agent/nettest"
	"kurma.dev/kurma/internal/testutil"
	"kurma.dev/kurma/pkg/controllerapi"
)

// cpuTime is the CPU time (user and system) this process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkAttachBurst is the agent's share of a Kubernetes pod burst:
// 100 ports of one VPC, listed PENDING as the watcher makes them, then
// attached at once (as 100 CNI ADDs), on the real datapath. It reports
// the agent's CPU seconds per 100 attaches (the process's, so the
// kernel's work for its netlink requests included), a measure that the
// machine's load does not skew as it skews wall time.
func BenchmarkAttachBurst(b *testing.B) {
	const n = 100
	testutil.RequireRoot(b)
	hostNS := nettest.NewNS(b, testutil.UniqueName("kagt"))
	nettest.IP(b, hostNS, "link", "add", "kagtu0", "type", "veth", "peer", "name", "kagtu1")
	table := testutil.UniqueName("kagt")
	b.StopTimer()
	for range b.N {
		dp, err := datapath.New(b.Context(), datapath.Config{HostNS: hostNS, Prefix: "kagt", UnderlayIP: net.ParseIP("192.0.2.1"),
			UnderlayDev: "kagtu0", NFTTable: table})
		if err != nil {
			b.Fatal(err)
		}
		fc := &fakeController{statuses: map[string][]string{}, live: make(chan controllerapi.Event, 4),
			hosts: []controllerapi.Host{{ID: "h1", UnderlayIP: "192.0.2.1"}}}
		for i := range n {
			fc.ports = append(fc.ports, controllerapi.Port{ID: fmt.Sprintf("p%03d", i), ProjectID: "proj", BindingHostID: "h1", VNI: 9,
				MACAddress: fmt.Sprintf("02:00:00:00:00:%02x", i), Status: controllerapi.StatusPending, RevisionNumber: 1,
				FixedIPs: []controllerapi.FixedIP{{SubnetID: "s", IPAddress: fmt.Sprintf("10.9.0.%d", i+2), CIDR: "10.9.0.0/24", GatewayIP: "10.9.0.1"}}})
		}
		a, err := New(Config{HostID: "h1", UnderlayIP: net.ParseIP("192.0.2.1"), Controller: fc, Datapath: dp, LocalAttach: true,
			Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))})
		if err != nil {
			b.Fatal(err)
		}
		ctx, stop := context.WithCancel(b.Context())
		done := make(chan error, 1)
		go func() { done <- a.Run(ctx) }()
		<-a.Synced()
		nss := make([]string, n)
		for i := range nss {
			nss[i] = nettest.NewNS(b, testutil.UniqueName("kagt"))
		}
		b.StartTimer()
		c0 := cpuTime()
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				actx, cancel := context.WithTimeout(ctx, time.Minute)
				defer cancel()
				if _, err := a.Attach(actx, fc.ports[i].ID, Attachment{NetNS: nss[i], IfName: "eth0"}); err != nil {
					b.Error(err)
				}
			})
		}
		wg.Wait()
		cpu := cpuTime() - c0
		b.StopTimer()
		b.ReportMetric(cpu.Seconds()*100/n, "cpu-s/100attach")
		stop()
		<-done
		_ = dp.Close()
		for _, ns := range nss {
			nettest.DelNS(nettest.Name(ns))
		}
	}
}
