// Command lb benchmarks load balancers and floating IPs. Part
// "controller" measures the controller's load-balancer creates/s and
// member replacements/s with 0 and with 30,000 load balancers stored,
// against the port creates/s of the same controller in the same run (no
// root needed; controller.go). Part "agent"
// measures the agent's datapath (internal/agent/lbpath) against a chain
// per load balancer as kube-proxy's nftables mode lays it out, in the same
// run: cold sync, restart convergence, one create and one member
// replacement until read back through netlink, process RSS, connect
// latency through a VIP, and iperf3 throughput pod->pod, pod->VIP and over
// a raw veth pair. Needs root.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	part := flag.String("part", "agent", "what to measure: controller, agent, or agent-e2e (only the end-to-end agent figures; agent-rss is internal)")
	var cc ctlConfig
	flag.IntVar(&cc.ops, "ctl-ops", 3000, "controller: requests per figure")
	flag.IntVar(&cc.conc, "ctl-conc", 32, "controller: concurrent clients")
	ctlStored := flag.String("ctl-stored", "0,30000", "controller: load balancers stored before each round")
	flag.IntVar(&cc.bulk, "ctl-bulk", 500, "controller: load balancers per bulk request when filling the store")
	flag.IntVar(&cc.members, "ctl-members", 2, "controller: members per load balancer")
	flag.BoolVar(&cc.noSync, "ctl-nosync", false, "controller: skip fsync on commit (not the reported figure)")
	sizes := flag.String("sizes", "1000,10000,30000", "agent: numbers of load balancers (2 members each) present")
	peerMax := flag.Int("peer-max", 10000, "agent: largest size the chain-per-LB peer is loaded at (30,000 chains take minutes)")
	connects := flag.Int("connects", 500, "agent: TCP connects through a VIP per size")
	n := flag.Int("n", 10000, "agent-rss: load balancers")
	e2eCreates := flag.Int("e2e-creates", 100, "agent: single creates timed from the controller's 201 per size (0: skip the end-to-end part)")
	rounds := flag.Int("tput-rounds", 3, "agent: iperf3 rounds per path (interleaved; the median is reported)")
	flag.Parse()
	if *part == "controller" {
		var err error
		if cc.stored, err = parseStored(*ctlStored); err == nil {
			err = runControllerBench(context.Background(), cc)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench/lb:", err)
			os.Exit(1)
		}
		return
	}
	if os.Geteuid() != 0 {
		fmt.Println("bench/lb: needs root; skipped")
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	var err error
	switch *part {
	case "agent":
		var sz []int
		if sz, err = parseSizes(*sizes); err == nil {
			err = runAgentBench(ctx, sz, *peerMax, *connects, *rounds)
			if err == nil && *e2eCreates > 0 {
				fmt.Println("\n== end to end: controller 201 -> element live in a real kurma-agent's table (read back through netlink)")
				_, err = runAgentE2E(ctx, sz, *e2eCreates)
			}
		}
	case "agent-e2e":
		var sz []int
		if sz, err = parseSizes(*sizes); err == nil {
			fmt.Println("== end to end: controller 201 -> element live in a real kurma-agent's table (read back through netlink)")
			_, err = runAgentE2E(ctx, sz, *e2eCreates)
		}
	case "agent-rss":
		err = agentRSS(ctx, *n)
	default:
		err = fmt.Errorf("unknown -part %q", *part)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench/lb:", err)
		os.Exit(1)
	}
}

func uniqName(prefix string) string {
	r := make([]byte, 4)
	_, _ = rand.Read(r)
	return prefix + hex.EncodeToString(r)
}
