package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"kurma.dev/kurma/bench/internal/benchutil"
	"kurma.dev/kurma/bench/internal/kurmanode"
	"kurma.dev/kurma/internal/testutil/kubecluster"
)

// baseBin is the -base-bin flag: a bin folder of another build for the
// kurma-base setup.
var baseBin = flag.String("base-bin", "", "bin folder of another build (e.g. main's) whose Kurma binaries the kurma-base setup runs")

// kurmaBin is the -kurma-bin flag: where the kurma setup's binaries
// come from instead of the cluster's bin folder.
var kurmaBin = flag.String("kurma-bin", "", "bin folder whose Kurma binaries the kurma setup runs (default: the cluster's)")

// agentArgs is the -agent-args flag: more kurma-agent flags for the kurma
// and kurma-base setups, after the bench's own (a later flag wins), e.g.
// "--attach-workers 4 --nice 0" to compare settings in one run.
var agentArgs = flag.String("agent-args", "", "more kurma-agent flags for the kurma setups, space-separated, after the bench's own (e.g. \"--attach-workers 4 --nice 0\")")

// kurmaSetup is Kurma's driver as the node's CNI: the kurma-k8s shim
// (timed by cnitool's wrapper), with the controller, the watcher and a
// kurma-agent in Kubernetes mode running beside the node in the cluster's
// namespace (bench/internal/kurmanode).
func kurmaSetup(ctx context.Context, binDir, tmp string) (setup, error) {
	if *kurmaBin != "" {
		return kurmaFrom(ctx, *kurmaBin, tmp, *kurmaBin)
	}
	return kurmaFrom(ctx, binDir, tmp, "")
}

// kurmaBaseSetup is kurmaSetup with the Kurma binaries of -base-bin (an
// earlier build: before and after a change, in the same run).
func kurmaBaseSetup(ctx context.Context, _, tmp string) (setup, error) {
	if *baseBin == "" {
		return setup{}, fmt.Errorf("kurma-base needs -base-bin")
	}
	return kurmaFrom(ctx, *baseBin, tmp, *baseBin)
}

// kurmaFrom is Kurma's setup with the binaries of binDir; kurmaDir, when
// set, is where the node's Kurma processes come from instead of the
// cluster's bin folder.
func kurmaFrom(_ context.Context, binDir, tmp, kurmaDir string) (setup, error) {
	if err := kurmanode.Check(binDir); err != nil {
		return setup{}, err
	}
	plugins := filepath.Join(tmp, "kurma-bin")
	if err := os.MkdirAll(plugins, 0o755); err != nil {
		return setup{}, err
	}
	if err := os.Symlink(filepath.Join(binDir, "kurma-k8s"), filepath.Join(plugins, "kurma-k8s")); err != nil {
		return setup{}, err
	}
	const metrics = "127.0.0.1:19697"
	// The agent runs at the deployed --nice: it plugs pods while 100
	// sandboxes start on 2 cores, so it runs ahead of them, as a node's
	// networking daemon may (docs/kubernetes.md).
	node := &kurmanode.Node{Socket: filepath.Join(tmp, "sock", "cni.sock"), CtlAddr: "127.0.0.1:19698", Token: "kbench",
		AgentArgs: append([]string{"--metrics-listen", metrics, "--nice", strconv.Itoa(benchutil.AgentNice)}, strings.Fields(*agentArgs)...), BinDir: kurmaDir}
	return setup{
		ConfList: kurmanode.ConfList(node.Socket),
		BinDir:   plugins,
		Timed:    "kurma-k8s",
		Metrics:  "http://" + metrics + "/metrics",
		Traced:   true,
		Started:  node.Start,
		Drained: func(ctx context.Context, _ *kubecluster.Cluster) error {
			return node.WaitDrained(ctx, 2*time.Minute)
		},
	}, nil
}
