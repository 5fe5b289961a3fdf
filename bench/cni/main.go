// Command cni measures ADD and DEL latency of the mizarmp CNI plugin (with
// the Kurma controller and host agent running) against the upstream bridge
// plugin with host-local IPAM and ipMasq on, both driven by cnitool in the
// same run, alternating. It also measures mizarmp's own time (process
// start to exit, invoked directly) and prints p50/p99 and the ratios, and
// the floor: two no-op plugins (shell and Go) driven by cnitool the same way
// (floor.go). With -k8s (default) it also measures the Kubernetes driver,
// kurma-k8s, on a real API server with the watcher and an agent in
// Kubernetes mode (kurmak8s.go): ADD/DEL against the floor (goal: ADD <=
// floor + 5 ms with the annotation already there), and the watcher's pod
// create -> annotation latency (goal p99 <= 20 ms).
//
// Goals: mizarmp ADD <= 0.25x bridge ADD, DEL <= 0.1x bridge DEL, own time
// < 3 ms.
//
// Bridge runs in a private "host" netns the benchmark creates (its bridge
// and nft rules stay out of the real host); mizarmp runs in the real host
// netns because it talks to the controller on loopback. Everything the
// benchmark creates is named kcni... and removed at exit.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"

	"kurma.dev/kurma/bench/internal/benchutil"
)

// samples are measured durations.
type samples = benchutil.Samples

func main() {
	n := flag.Int("n", 60, "ADD/DEL cycles per plugin")
	k8s := flag.Bool("k8s", true, "also measure the Kubernetes driver (kurma-k8s) on a real API server, and the watcher's pod→annotation latency")
	flag.Parse()
	if err := run(context.Background(), *n, *k8s); err != nil {
		fmt.Fprintln(os.Stderr, "bench/cni:", err)
		os.Exit(1)
	}
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2fms", float64(d)/float64(time.Millisecond)) }

// tool is one network driven by cnitool.
type tool struct {
	name    string // network name
	cnitool string
	path    string // CNI_PATH
	confDir string
	host    ns.NetNS // nil: the real host netns
	env     []string
}

func (t *tool) run(ctx context.Context, verb, netnsPath string) (time.Duration, error) {
	cmd := exec.CommandContext(ctx, t.cnitool, verb, t.name, netnsPath)
	cmd.Env = append([]string{"CNI_PATH=" + t.path, "NETCONFPATH=" + t.confDir, "PATH=" + os.Getenv("PATH")}, t.env...)
	var d time.Duration
	var out []byte
	do := func() error {
		start := time.Now()
		var err error
		out, err = cmd.CombinedOutput()
		d = time.Since(start)
		return err
	}
	var err error
	if t.host != nil {
		err = t.host.Do(func(ns.NetNS) error { return do() })
	} else {
		err = do()
	}
	if err != nil {
		return 0, fmt.Errorf("cnitool %s %s: %w: %s", verb, t.name, err, out)
	}
	return d, nil
}

type result struct{ add, del samples }

// cycle creates a container netns per tool, then times that tool's ADD and
// DEL, for each tool in turn (the order changes per iteration).
func cycle(ctx context.Context, tools []*tool, res []result, i int) error {
	// Rotate the starting tool, and reverse on odd rounds, so that no tool
	// always follows the same one.
	order := make([]int, len(tools))
	for j := range order {
		order[j] = (i/2 + j) % len(tools)
	}
	if i%2 == 1 {
		slices.Reverse(order)
	}
	for _, k := range order {
		ctr, err := testutils.NewNS()
		if err != nil {
			return err
		}
		d, err := tools[k].run(ctx, "add", ctr.Path())
		if err == nil {
			res[k].add = append(res[k].add, d)
			d, err = tools[k].run(ctx, "del", ctr.Path())
			res[k].del = append(res[k].del, d)
		}
		dropNS(ctr)
		if err != nil {
			return err
		}
	}
	return nil
}

func run(ctx context.Context, n int, k8s bool) error {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	bin, err := filepath.Abs(benchutil.BinDir())
	if err != nil {
		return err
	}
	cnitool := filepath.Join(bin, "tools", "cnitool")
	tmp, err := os.MkdirTemp("", "kcni-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)

	// Upstream reference: bridge + host-local, ipMasq on, in a private host
	// netns.
	hostNS, err := testutils.NewNS()
	if err != nil {
		return fmt.Errorf("create host netns: %w", err)
	}
	defer dropNS(hostNS)
	bridge := &tool{name: "kcnibr", cnitool: cnitool, path: filepath.Join(bin, "cni"), confDir: filepath.Join(tmp, "bridge"), host: hostNS}
	if err := os.MkdirAll(bridge.confDir, 0o755); err != nil {
		return err
	}
	conf := fmt.Sprintf(`{"cniVersion":"1.1.0","name":"kcnibr","plugins":[{"type":"bridge","bridge":"kcnibr0","isGateway":true,"ipMasq":true,
"ipam":{"type":"host-local","subnet":"10.250.0.0/16","dataDir":%q,"routes":[{"dst":"0.0.0.0/0"}]}}]}`, filepath.Join(tmp, "ipam"))
	if err := os.WriteFile(filepath.Join(bridge.confDir, "kcnibr.conflist"), []byte(conf), 0o644); err != nil {
		return err
	}
	tools := []*tool{bridge}
	names := []string{"bridge+host-local"}

	mp, own, cleanup, err := setupMizarmp(ctx, log, bin, cnitool, tmp)
	defer cleanup()
	if err != nil {
		fmt.Printf("mizarmp: not measured: %v\n", err)
	} else {
		tools = append(tools, mp)
		names = append(names, "mizarmp")
	}

	var kenv *k8sEnv
	if k8s {
		kt, ke, kclean, err := setupKurmaK8s(ctx, bin, cnitool, tmp)
		defer kclean()
		if err != nil {
			fmt.Printf("kurma-k8s: not measured: %v\n", err)
		} else {
			tools = append(tools, kt)
			names = append(names, "kurma-k8s")
			kenv = ke
		}
	}

	floors, floorNames, err := setupFloors(ctx, cnitool, tmp)
	if err != nil {
		return fmt.Errorf("floor plugins: %w", err)
	}
	tools = append(tools, floors...)
	names = append(names, floorNames...)

	res := make([]result, len(tools))
	// One warm-up cycle (creates the bridge, the nft table, the VPC's
	// datapath), not counted.
	if err := cycle(ctx, tools, make([]result, len(tools)), 0); err != nil {
		return err
	}
	for i := range n {
		if err := cycle(ctx, tools, res, i); err != nil {
			return err
		}
	}
	if out, err := exec.Command("uptime").Output(); err == nil {
		fmt.Printf("load: %s", out)
	}
	fmt.Printf("CNI ADD/DEL latency via cnitool, %d cycles each, alternating\n", n)
	for k, r := range res {
		fmt.Printf("  %-18s ADD p50 %s p99 %s   DEL p50 %s p99 %s\n", names[k],
			ms(r.add.Pct(0.5)), ms(r.add.Pct(0.99)), ms(r.del.Pct(0.5)), ms(r.del.Pct(0.99)))
	}
	ratio := func(a, b samples) float64 { return float64(a.Pct(0.5)) / float64(b.Pct(0.5)) }
	mpIdx := slices.Index(names, "mizarmp")
	if mpIdx > 0 {
		fmt.Printf("  ratio mizarmp/bridge: ADD p50 %.2fx (goal <= 0.25x)   DEL p50 %.2fx (goal <= 0.10x)\n",
			ratio(res[mpIdx].add, res[0].add), ratio(res[mpIdx].del, res[0].del))
	}
	for k, name := range names {
		if !strings.HasPrefix(name, "floor:") {
			continue
		}
		fmt.Printf("  %s / bridge: ADD p50 %.2fx   DEL p50 %.2fx (the best any such plugin reaches through cnitool here)\n",
			name, ratio(res[k].add, res[0].add), ratio(res[k].del, res[0].del))
		if mpIdx > 0 {
			fmt.Printf("    mizarmp minus %s: ADD p50 %s   DEL p50 %s\n", name,
				ms(res[mpIdx].add.Pct(0.5)-res[k].add.Pct(0.5)), ms(res[mpIdx].del.Pct(0.5)-res[k].del.Pct(0.5)))
		}
		if ki := slices.Index(names, "kurma-k8s"); ki > 0 {
			fmt.Printf("    kurma-k8s minus %s: ADD p50 %s p99 %s   DEL p50 %s p99 %s (goal ADD <= floor + 5ms)\n", name,
				ms(res[ki].add.Pct(0.5)-res[k].add.Pct(0.5)), ms(res[ki].add.Pct(0.99)-res[k].add.Pct(0.99)),
				ms(res[ki].del.Pct(0.5)-res[k].del.Pct(0.5)), ms(res[ki].del.Pct(0.99)-res[k].del.Pct(0.99)))
		}
	}
	if kenv != nil {
		lat, err := kenv.annotationLatency(ctx, 50)
		if err != nil {
			return fmt.Errorf("watcher latency: %w", err)
		}
		fmt.Printf("  watcher pod create -> annotation seen on a watch, 50 pods one at a time: p50 %s p99 %s (goal p99 <= 20ms)\n",
			ms(lat.Pct(0.5)), ms(lat.Pct(0.99)))
	}
	if own != nil {
		a, d, err := own(ctx, n)
		if err != nil {
			return err
		}
		fmt.Printf("  mizarmp own work (run time minus controller wait): ADD p50 %s p99 %s   DEL p50 %s p99 %s (goal < 3ms)\n",
			ms(a.Pct(0.5)), ms(a.Pct(0.99)), ms(d.Pct(0.5)), ms(d.Pct(0.99)))
	}
	return nil
}

// dropNS closes and unmounts a netns the benchmark made, retrying while
// the unmount is busy (parallel mount changes under /run/netns).
func dropNS(n ns.NetNS) {
	_ = n.Close()
	for range 20 {
		if testutils.UnmountNS(n) == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	fmt.Fprintf(os.Stderr, "bench/cni: could not remove netns %s\n", n.Path())
}
