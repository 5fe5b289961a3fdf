package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"kurma.dev/kurma/internal/testutil/kubecluster"
)

// kurmaSetup is Kurma's driver as the node's CNI: the kurma-k8s shim
// (timed by cnitool's wrapper), with the controller, the watcher and a
// kurma-agent in Kubernetes mode running beside the node in the cluster's
// namespace.
func kurmaSetup(_ context.Context, binDir, tmp string) (setup, error) {
	for _, b := range []string{"kurma-controller", "kurma-agent", "kurma-k8s-watcher", "kurma-k8s"} {
		if _, err := os.Stat(filepath.Join(binDir, b)); err != nil {
			return setup{}, fmt.Errorf("%s not built (make build): %w", b, err)
		}
	}
	plugins := filepath.Join(tmp, "kurma-bin")
	if err := os.MkdirAll(plugins, 0o755); err != nil {
		return setup{}, err
	}
	if err := os.Symlink(filepath.Join(binDir, "kurma-k8s"), filepath.Join(plugins, "kurma-k8s")); err != nil {
		return setup{}, err
	}
	sock := filepath.Join(tmp, "sock", "cni.sock")
	const ctl, metrics = "127.0.0.1:19698", "127.0.0.1:19697"
	return setup{
		ConfList: []byte(`{"cniVersion":"1.0.0","name":"kurma","plugins":[{"type":"kurma-k8s","socket":"` + sock + `"}]}`),
		BinDir:   plugins,
		Timed:    "kurma-k8s",
		Metrics:  "http://" + metrics + "/metrics",
		Started: func(ctx context.Context, c *kubecluster.Cluster) error {
			tok := filepath.Join(c.Dir, "ctl-token")
			if err := os.WriteFile(tok, []byte("kbench"), 0o600); err != nil {
				return err
			}
			for _, p := range [][]string{
				{"kurma-controller", "--listen", ctl, "--store", "bolt:" + filepath.Join(c.Dir, "ctl.db"), "--token-file", tok},
				{"kurma-k8s-watcher", "--kubeconfig", c.Kubeconfig, "--controller", "http://" + ctl, "--token-file", tok},
				{"kurma-agent", "--controller", "http://" + ctl, "--token-file", tok, "--host-id", c.NodeName,
					"--underlay-ip", kubecluster.NodeIP, "--state-dir", filepath.Join(c.Dir, "kurma-agent"),
					"--link-prefix", "kbk", "--nft-table", "kurma-bench-k8s", "--metrics-listen", metrics,
					"--k8s-node-name", c.NodeName, "--k8s-kubeconfig", c.Kubeconfig, "--k8s-cni-socket", sock},
			} {
				if _, err := c.StartProcess(p[0], exec.Command(filepath.Join(binDir, p[0]), p[1:]...)); err != nil {
					return err
				}
			}
			deadline := time.Now().Add(time.Minute)
			for {
				if _, err := os.Stat(sock); err == nil {
					return nil
				}
				if time.Now().After(deadline) {
					return fmt.Errorf("agent socket %s did not appear:\n%s", sock, c.Logs("kurma-agent", 3000))
				}
				time.Sleep(50 * time.Millisecond)
			}
		},
		Drained: func(ctx context.Context, c *kubecluster.Cluster) error {
			// Each sandbox's DEL removes its attachment record.
			recs := filepath.Join(c.Dir, "kurma-agent", "k8s")
			deadline := time.Now().Add(2 * time.Minute)
			for {
				ents, err := os.ReadDir(recs)
				if err == nil && len(ents) == 0 {
					return nil
				}
				if time.Now().After(deadline) {
					return fmt.Errorf("%d sandboxes still attached after 2 minutes", len(ents))
				}
				time.Sleep(100 * time.Millisecond)
			}
		},
	}, nil
}
