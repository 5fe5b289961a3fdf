// Command controller benchmarks the Kurma network controller over real
// HTTP on loopback with the default bbolt store (fsync on): single and
// bulk port-creation throughput, and create-to-UP latency, first on an
// empty store and then with 1,000,000 ports preloaded directly into the
// store. See README.md for what is measured and how.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"iter"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"kurma.dev/kurma/internal/controller/api"
	"kurma.dev/kurma/internal/controller/store"
	"kurma.dev/kurma/internal/controller/store/boltstore"
	capi "kurma.dev/kurma/pkg/controllerapi"
)

// Alcor's published figures (requests/s) that the results are compared to.
const (
	alcorPeak      = 3617.0
	alcorAt1MLow   = 184.0
	alcorAt1MHigh  = 511.0
	benchHost      = "bench-host"
	throughputHost = "tput-host"
)

type config struct {
	single             int
	singleConc         []int // the sweep: one run of c.single ports per entry
	bulkReqs, bulkSize int
	bulkConc           int
	lat, latConc       int
	preload            int
	dir                string
	noSync             bool
	exe                string // kurma-controller binary: run the server as its own process
	clientProcs        int    // GOMAXPROCS during the single-create sweep when exe is set
}

type result struct {
	singlePS, bulkPS   float64 // singlePS: the best of the sweep
	singleSweep        []float64
	singleCPU, bulkCPU float64 // ports per CPU-second (server process alone when separate)
	cpuWho             string
	p50, p99           time.Duration
}

func main() {
	var c config
	flag.IntVar(&c.single, "single", 20000, "ports created one per request")
	conc := flag.String("single-conc", "64,128,256", "concurrent clients for single creates: a comma-separated sweep, the peak is reported")
	flag.IntVar(&c.bulkReqs, "bulk-reqs", 200, "bulk requests")
	flag.IntVar(&c.bulkSize, "bulk-size", 100, "ports per bulk request")
	flag.IntVar(&c.bulkConc, "bulk-conc", 8, "concurrent clients for bulk creates")
	flag.IntVar(&c.lat, "lat", 3000, "ports for the create-to-UP latency run")
	flag.IntVar(&c.latConc, "lat-conc", 8, "concurrent clients for the latency run")
	flag.IntVar(&c.preload, "preload", 1000000, "ports preloaded for the second round (0: skip)")
	flag.StringVar(&c.exe, "controller", defaultExe(), "kurma-controller binary to run the server in its own process (\"\": in-process); default $KURMA_BIN_DIR/kurma-controller when present")
	flag.BoolVar(&c.noSync, "nosync", false, "skip fsync on commit (isolates CPU cost; not the default figure)")
	flag.StringVar(&c.dir, "dir", "", "directory for the bbolt files (default: a temp dir, removed after)")
	prof := flag.String("cpuprofile", "", "write a CPU profile here")
	clientProcs := flag.Int("client-procs", 1, "GOMAXPROCS of the benchmark process during the single-create sweep when the server is its own process, like wrk -t; 0: the runtime default")
	flag.Parse()
	for _, f := range strings.Split(*conc, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			fmt.Fprintf(os.Stderr, "bench: -single-conc: bad count %q\n", f)
			os.Exit(2)
		}
		c.singleConc = append(c.singleConc, n)
	}
	c.clientProcs = *clientProcs
	if *prof != "" {
		f, err := os.Create(*prof)
		if err == nil && pprof.StartCPUProfile(f) == nil {
			defer pprof.StopCPUProfile()
		}
	}
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err := run(context.Background(), c); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		pprof.StopCPUProfile()
		os.Exit(1)
	}
}

func run(ctx context.Context, c config) error {
	dir := c.dir
	if dir == "" {
		d, err := os.MkdirTemp("", "kctl-bench-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		dir = d
	}
	where := "in this process"
	if c.exe != "" {
		where = "in its own process (" + c.exe + ")"
	}
	fmt.Printf("controller benchmark: server %s, bbolt store (fsync %v), HTTP on loopback, %d CPUs, load average %s\n", where, !c.noSync, numCPU(), loadAvg())
	fmt.Printf("single: %d ports x1 by each of %v clients (peak reported); bulk: %d x %d ports by %d clients; latency: %d ports by %d clients\n",
		c.single, c.singleConc, c.bulkReqs, c.bulkSize, c.bulkConc, c.lat, c.latConc)
	fmt.Println("create->UP: a watch-driven agent stand-in (WatchPorts on its host, PUT status UP per ADDED port); the client times POST port -> long-poll GET ?wait_status=UP returning UP")
	r0, err := round(ctx, c, filepath.Join(dir, "empty.db"), 0)
	if err != nil {
		return fmt.Errorf("empty store: %w", err)
	}
	report(c, "0 ports stored", r0)
	if c.preload > 0 {
		r1, err := round(ctx, c, filepath.Join(dir, "loaded.db"), c.preload)
		if err != nil {
			return fmt.Errorf("preloaded store: %w", err)
		}
		report(c, fmt.Sprintf("%d ports stored", c.preload), r1)
		fmt.Printf("slowdown at %d ports: single %.2fx, bulk %.2fx (goal <= 1.5x)\n", c.preload, r0.singlePS/r1.singlePS, r0.bulkPS/r1.bulkPS)
		fmt.Printf("vs Alcor with 1.2M ports (%.0f-%.0f req/s): single %.1fx-%.1fx\n", alcorAt1MLow, alcorAt1MHigh, r1.singlePS/alcorAt1MHigh, r1.singlePS/alcorAt1MLow)
	}
	return nil
}

func report(c config, label string, r result) {
	fmt.Printf("[%s] single create: %.0f ports/s at peak (%.2fx Alcor peak %.0f req/s); by clients:", label, r.singlePS, r.singlePS/alcorPeak, alcorPeak)
	for i, ps := range r.singleSweep {
		fmt.Printf(" %d: %.0f/s", c.singleConc[i], ps)
	}
	fmt.Println()
	fmt.Printf("[%s] bulk create:   %.0f ports/s (%.2fx Alcor peak)\n", label, r.bulkPS, r.bulkPS/alcorPeak)
	fmt.Printf("[%s] CPU cost (%s): single %.0f ports per CPU-second, bulk %.0f ports per CPU-second\n", label, r.cpuWho, r.singleCPU, r.bulkCPU)
	fmt.Printf("[%s] create->UP:    p50 %.2f ms, p99 %.2f ms (goal p99 <= 20 ms)\n", label, ms(r.p50), ms(r.p99))
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func numCPU() int {
	n := 0
	b, _ := os.ReadFile("/sys/fs/cgroup/cpu.max")
	_ = b
	n = runtimeNumCPU()
	return n
}

// round runs the three measurements against a fresh controller whose store
// holds preload ports.
func round(ctx context.Context, c config, path string, preload int) (result, error) {
	var r result
	st, err := boltstore.Open(path, boltstore.Options{NoSync: c.noSync})
	if err != nil {
		return r, err
	}
	defer st.Close() // a second Close is harmless
	srv, err := api.New(api.Config{Store: st})
	if err != nil {
		return r, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return r, err
	}
	hs := &http.Server{Handler: srv.Handler()}
	go func() { _ = hs.Serve(ln) }()
	defer hs.Close()
	base := "http://" + ln.Addr().String()
	cli, err := capi.New(base)
	if err != nil {
		return r, err
	}
	if _, err := cli.CreateProject(ctx, capi.Project{ID: "bench"}); err != nil {
		return r, err
	}
	if _, err := cli.CreateVPC(ctx, "bench", capi.VPC{ID: "vpc"}); err != nil {
		return r, err
	}
	// A /11 holds 2M addresses: the preload plus every benchmark port.
	if _, err := cli.CreateSubnet(ctx, "bench", capi.Subnet{ID: "sub", NetworkID: "vpc", CIDR: "10.64.0.0/11"}); err != nil {
		return r, err
	}
	if preload > 0 {
		start := time.Now()
		err := srv.Preload(ctx, "bench", "sub", preload, func(i int) string { return fmt.Sprintf("host-%04d", i%1000) }, st.BulkLoad)
		if err != nil {
			return r, fmt.Errorf("preload: %w", err)
		}
		fi, _ := os.Stat(path)
		fmt.Printf("preloaded %d ports in %.1fs (store file %d MB)\n", preload, time.Since(start).Seconds(), fi.Size()>>20)
	}
	cpuOf := cpuSeconds
	r.cpuWho = "client+server in this process"
	if c.exe != "" {
		// Hand the file over to a real controller process.
		_ = hs.Close()
		if err := st.Close(); err != nil {
			return r, err
		}
		proc, url, err := startController(ctx, c.exe, path, c.noSync)
		if err != nil {
			return r, err
		}
		defer proc.stop()
		base = url
		if cli, err = capi.New(url); err != nil {
			return r, err
		}
		cpuOf = proc.cpuSeconds
		r.cpuWho = "controller process alone"
		if preload > 0 {
			waitCountedHTTP(url, preload)
		}
	} else {
		fctx, cancelFeed := context.WithCancel(ctx)
		defer cancelFeed()
		go srv.Run(fctx)
		if preload > 0 {
			// Let the feed finish counting the preloaded ports before timing.
			waitCounted(srv, preload)
		}
	}

	cpu0 := cpuOf()
	prevProcs := 0
	if c.clientProcs > 0 && c.exe != "" {
		// Only the load generator runs here (in-process the server shares
		// it): one P, like wrk -t1, for the throughput sweep only.
		prevProcs = runtime.GOMAXPROCS(c.clientProcs)
	}
	r.singleSweep, err = single(ctx, base, c)
	if prevProcs > 0 {
		runtime.GOMAXPROCS(prevProcs)
	}
	if err != nil {
		return r, err
	}
	r.singlePS = slices.Max(r.singleSweep)
	cpu1 := cpuOf()
	if r.bulkPS, err = bulk(ctx, cli, c); err != nil {
		return r, err
	}
	cpu2 := cpuOf()
	r.singleCPU = float64(c.single*len(c.singleConc)) / (cpu1 - cpu0)
	r.bulkCPU = float64(c.bulkReqs*c.bulkSize) / (cpu2 - cpu1)
	if r.p50, r.p99, err = latency(ctx, cli, c); err != nil {
		return r, err
	}
	return r, nil
}

func waitCounted(srv *api.Server, n int) {
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		mfs, _ := srv.Registry().Gather()
		for _, mf := range mfs {
			if mf.GetName() != "kurma_controller_ports" {
				continue
			}
			sum := 0.0
			for _, m := range mf.GetMetric() {
				sum += m.GetGauge().GetValue()
			}
			if sum >= float64(n) {
				return
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// parallel runs fn(i) for i in [0,n) on conc goroutines and returns the
// elapsed time.
func parallel(n, conc int, fn func(i int) error) (time.Duration, error) {
	var next atomic.Int64
	var firstErr error
	var once sync.Once
	var wg sync.WaitGroup
	start := time.Now()
	for range conc {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := fn(i); err != nil {
					once.Do(func() { firstErr = err })
					return
				}
			}
		})
	}
	wg.Wait()
	return time.Since(start), firstErr
}

// single creates c.single ports, one per request, from each count of
// kept-alive connections in c.singleConc (rawclient.go), each answer
// checked for 201 and a port body. It returns ports/s per count.
func single(ctx context.Context, base string, c config) ([]float64, error) {
	body, err := json.Marshal(capi.PortBody{Port: capi.Port{NetworkID: "sub", BindingHostID: throughputHost, VethName: "eth0", NetworkNS: "/var/run/netns/x"}})
	if err != nil {
		return nil, err
	}
	var out []float64
	for _, conc := range c.singleConc {
		d, err := postParallel(ctx, base, "/project/bench/ports", c.single, conc, body, http.StatusCreated, []byte(`{"port":{`))
		if err != nil {
			return nil, fmt.Errorf("single create (%d clients): %w", conc, err)
		}
		out = append(out, float64(c.single)/d.Seconds())
	}
	return out, nil
}

func bulk(ctx context.Context, cli *capi.Client, c config) (float64, error) {
	d, err := parallel(c.bulkReqs, c.bulkConc, func(i int) error {
		ps := make([]capi.Port, c.bulkSize)
		for j := range ps {
			ps[j] = capi.Port{NetworkID: "sub", BindingHostID: throughputHost, VethName: "eth0", NetworkNS: "/var/run/netns/x"}
		}
		_, err := cli.CreatePorts(ctx, "bench", ps)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("bulk create: %w", err)
	}
	return float64(c.bulkReqs*c.bulkSize) / d.Seconds(), nil
}

// agent stands in for kurma-agent on benchHost: it watches its ports and
// reports each new PENDING port UP.
func agent(ctx context.Context, cli *capi.Client) {
	todo := make(chan capi.Port, 4096)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for p := range todo {
				_, _ = cli.SetPortStatus(ctx, p.ProjectID, p.ID, capi.StatusUp, "")
			}
		})
	}
	defer func() { close(todo); wg.Wait() }()
	var seq iter.Seq2[capi.Event, error] = cli.WatchPorts(ctx, 0, benchHost)
	for ev, err := range seq {
		if err != nil {
			if ctx.Err() == nil {
				slog.Error("agent watch ended", "err", err)
			}
			return
		}
		if ev.Type == capi.EventAdded && ev.Port != nil && ev.Port.Status == capi.StatusPending {
			todo <- *ev.Port
		}
	}
}

func latency(ctx context.Context, cli *capi.Client, c config) (time.Duration, time.Duration, error) {
	actx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { agent(actx, cli); close(done) }()
	defer func() { cancel(); <-done }()
	time.Sleep(200 * time.Millisecond) // let the agent's watch start
	lat := make([]time.Duration, c.lat)
	post := make([]time.Duration, c.lat)
	_, err := parallel(c.lat, c.latConc, func(i int) error {
		start := time.Now()
		p, err := cli.CreatePort(ctx, "bench", capi.Port{NetworkID: "sub", BindingHostID: benchHost, VethName: "eth0"})
		if err != nil {
			return err
		}
		post[i] = time.Since(start)
		got, err := cli.WaitPort(ctx, "bench", p.ID, capi.StatusUp, 10*time.Second)
		if err != nil {
			return err
		}
		if got.Status != capi.StatusUp {
			return errors.New("port not UP within 10s")
		}
		lat[i] = time.Since(start)
		return nil
	})
	if err != nil {
		return 0, 0, fmt.Errorf("latency run: %w", err)
	}
	slices.Sort(lat)
	slices.Sort(post)
	pct := func(d []time.Duration, q float64) float64 { return ms(d[min(len(d)-1, int(float64(len(d))*q))]) }
	fmt.Printf("  create->UP p90 %.2f ms, p99.9 %.2f ms, max %.2f ms; the POST alone p50 %.2f ms, p99 %.2f ms\n",
		pct(lat, 0.9), pct(lat, 0.999), ms(lat[len(lat)-1]), pct(post, 0.5), pct(post, 0.99))
	return lat[len(lat)/2], lat[len(lat)*99/100], nil
}

var _ store.Store = (*boltstore.Store)(nil)
