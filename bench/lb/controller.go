package main

// Part "controller": load-balancer creates/s and member replacements/s of
// the controller, with 0 and with N load balancers stored, against the
// port creates/s of the same controller in the same run (see README.md).

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"kurma.dev/kurma/internal/controller/api"
	"kurma.dev/kurma/internal/controller/store/boltstore"
	capi "kurma.dev/kurma/pkg/controllerapi"
)

type ctlConfig struct {
	ops     int   // requests per measurement
	conc    int   // concurrent clients
	stored  []int // load balancers stored before each round
	bulk    int   // load balancers per bulk request when filling
	noSync  bool
	members int
}

type ctlRound struct {
	stored                int
	portPS, lbPS, membPS  float64
	portCPU, lbCPU, mbCPU float64 // requests per CPU-second (client and server: one process)
	fillPS                float64 // bulk creates while filling (0: none)
}

const benchPID, benchVPC = "bench", "vpc"

// runControllerBench runs one round per entry of cfg.stored, each on a
// fresh bbolt store (fsync on unless noSync) served over HTTP on loopback.
func runControllerBench(ctx context.Context, cfg ctlConfig) error {
	dir, err := os.MkdirTemp("", "bench-lb-ctl-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	fmt.Printf("controller: %d requests per figure, %d clients, %d members per load balancer, bbolt fsync=%v, load %s\n",
		cfg.ops, cfg.conc, cfg.members, !cfg.noSync, loadAvg1())
	var rounds []ctlRound
	for i, n := range cfg.stored {
		r, err := ctlRun(ctx, cfg, filepath.Join(dir, fmt.Sprintf("r%d.db", i)), n)
		if err != nil {
			return fmt.Errorf("round with %d stored: %w", n, err)
		}
		rounds = append(rounds, r)
	}
	fmt.Println()
	fmt.Println("| load balancers stored | port creates/s (peer) | LB creates/s | ratio | member replacements/s | ratio | LB creates per CPU-s | port creates per CPU-s |")
	fmt.Println("| --- | --- | --- | --- | --- | --- | --- | --- |")
	for _, r := range rounds {
		fmt.Printf("| %d | %.0f | %.0f | %.2f× | %.0f | %.2f× | %.0f | %.0f |\n", r.stored, r.portPS, r.lbPS, r.lbPS/r.portPS, r.membPS, r.membPS/r.portPS, r.lbCPU, r.portCPU)
	}
	for _, r := range rounds {
		if r.fillPS > 0 {
			fmt.Printf("filling %d load balancers by bulk create (%d per request): %.0f load balancers/s\n", r.stored, cfg.bulk, r.fillPS)
		}
	}
	if len(rounds) > 1 {
		a, b := rounds[0], rounds[len(rounds)-1]
		fmt.Printf("with %d stored vs %d: LB creates %.2f×, member replacements %.2f×, port creates %.2f×\n",
			b.stored, a.stored, b.lbPS/a.lbPS, b.membPS/a.membPS, b.portPS/a.portPS)
	}
	return nil
}

func ctlRun(ctx context.Context, cfg ctlConfig, path string, stored int) (ctlRound, error) {
	r := ctlRound{stored: stored}
	st, err := boltstore.Open(path, boltstore.Options{NoSync: cfg.noSync})
	if err != nil {
		return r, err
	}
	defer st.Close()
	srv, err := api.New(api.Config{Store: st})
	if err != nil {
		return r, err
	}
	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go srv.Run(fctx)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return r, err
	}
	hs := &http.Server{Handler: srv.Handler()}
	go func() { _ = hs.Serve(ln) }()
	defer hs.Close()
	cli, err := capi.New("http://" + ln.Addr().String())
	if err != nil {
		return r, err
	}
	if _, err := cli.CreateProject(ctx, capi.Project{ID: benchPID}); err != nil {
		return r, err
	}
	if _, err := cli.CreateVPC(ctx, benchPID, capi.VPC{ID: benchVPC, CIDR: "10.0.0.0/9"}); err != nil {
		return r, err
	}
	// Pods (and so members) in a /16, VIPs in a /12 service subnet as
	// Kubernetes clusterIPs are.
	if _, err := cli.CreateSubnet(ctx, benchPID, capi.Subnet{ID: "pods", NetworkID: benchVPC, CIDR: "10.1.0.0/16"}); err != nil {
		return r, err
	}
	if _, err := cli.CreateSubnet(ctx, benchPID, capi.Subnet{ID: "svc", NetworkID: benchVPC, CIDR: "10.96.0.0/12", Purpose: capi.SubnetPurposeService}); err != nil {
		return r, err
	}
	lbOf := func(id string, i int) capi.LoadBalancer {
		lb := capi.LoadBalancer{ID: id, VIPSubnetID: "svc", Listeners: []capi.Listener{{Protocol: capi.ProtocolTCP, Port: 80, TargetPort: 8080}}}
		lb.Members = membersOf(i, cfg.members)
		return lb
	}
	if stored > 0 {
		start := time.Now()
		for i := 0; i < stored; i += cfg.bulk {
			var batch []capi.LoadBalancer
			for j := i; j < min(i+cfg.bulk, stored); j++ {
				batch = append(batch, lbOf(fmt.Sprintf("fill-%06d", j), j))
			}
			if _, err := cli.CreateLoadBalancers(ctx, benchPID, batch); err != nil {
				return r, fmt.Errorf("fill: %w", err)
			}
		}
		r.fillPS = float64(stored) / time.Since(start).Seconds()
	}
	// The peer: single port creates on the same controller.
	var err2 error
	r.portPS, r.portCPU, err2 = ctlMeasure(ctx, cfg, func(ctx context.Context, i int) error {
		_, err := cli.CreatePort(ctx, benchPID, capi.Port{ID: fmt.Sprintf("port-%06d", i), NetworkID: "pods", BindingHostID: "h1"})
		return err
	})
	if err2 != nil {
		return r, fmt.Errorf("port creates: %w", err2)
	}
	r.lbPS, r.lbCPU, err2 = ctlMeasure(ctx, cfg, func(ctx context.Context, i int) error {
		_, err := cli.CreateLoadBalancer(ctx, benchPID, lbOf(fmt.Sprintf("lb-%06d", i), stored+i))
		return err
	})
	if err2 != nil {
		return r, fmt.Errorf("lb creates: %w", err2)
	}
	// Member replacements on the load balancers just created (and the
	// stored ones), picked at random: a new pair of members each time.
	total := stored + cfg.ops
	r.membPS, r.mbCPU, err2 = ctlMeasure(ctx, cfg, func(ctx context.Context, i int) error {
		k := rand.IntN(total)
		id := fmt.Sprintf("lb-%06d", k-stored)
		if k < stored {
			id = fmt.Sprintf("fill-%06d", k)
		}
		_, err := cli.SetMembers(ctx, benchPID, id, membersOf(i+7, cfg.members))
		return err
	})
	if err2 != nil {
		return r, fmt.Errorf("member replacements: %w", err2)
	}
	fmt.Printf("  %6d stored: ports %.0f/s, LB creates %.0f/s, member replacements %.0f/s\n", stored, r.portPS, r.lbPS, r.membPS)
	return r, nil
}

// membersOf returns n members in the pods subnet derived from i.
func membersOf(i, n int) []capi.Member {
	ms := make([]capi.Member, n)
	for j := range ms {
		k := (i*n + j) % 62500
		ms[j] = capi.Member{Address: fmt.Sprintf("10.1.%d.%d", k/250, k%250+2), Port: 8080}
	}
	return ms
}

// ctlMeasure runs cfg.ops calls of op over cfg.conc clients and returns
// calls/s and calls per CPU-second of this process.
func ctlMeasure(ctx context.Context, cfg ctlConfig, op func(context.Context, int) error) (float64, float64, error) {
	var next atomic.Int64
	var first error
	var mu sync.Mutex
	var wg sync.WaitGroup
	cpu0 := procCPU()
	start := time.Now()
	for range cfg.conc {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= cfg.ops {
					return
				}
				if err := op(ctx, i); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
					return
				}
			}
		})
	}
	wg.Wait()
	el := time.Since(start).Seconds()
	cpu := procCPU() - cpu0
	if first != nil {
		return 0, 0, first
	}
	perCPU := 0.0
	if cpu > 0 {
		perCPU = float64(cfg.ops) / cpu
	}
	return float64(cfg.ops) / el, perCPU, nil
}

// procCPU is this process's user+system CPU time in seconds.
func procCPU() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	tv := func(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }
	return tv(ru.Utime) + tv(ru.Stime)
}

// loadAvg1 is the 1-minute load average (the machine is shared).
func loadAvg1() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	var l string
	_, _ = fmt.Sscan(string(b), &l)
	return l
}

// parseStored parses a comma-separated list of counts (0 allowed).
func parseStored(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 0 {
			return nil, fmt.Errorf("-ctl-stored %q: %q is not a count", s, f)
		}
		out = append(out, n)
	}
	return out, nil
}
