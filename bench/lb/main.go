// Command lb benchmarks load balancers and floating IPs. Part "agent"
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
	part := flag.String("part", "agent", "what to measure: agent (agent-rss is internal)")
	sizes := flag.String("sizes", "1000,10000,30000", "agent: numbers of load balancers (2 members each) present")
	peerMax := flag.Int("peer-max", 10000, "agent: largest size the chain-per-LB peer is loaded at (30,000 chains take minutes)")
	connects := flag.Int("connects", 500, "agent: TCP connects through a VIP per size")
	n := flag.Int("n", 10000, "agent-rss: load balancers")
	flag.Parse()
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
			err = runAgentBench(ctx, sz, *peerMax, *connects)
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
