// Package kurmanode runs Kurma beside a benchmark's Kubernetes node: the
// controller, the watcher and a kurma-agent in Kubernetes mode, all inside
// the cluster's network namespace (internal/testutil/kubecluster), and
// gives the node's conflist for the kurma-k8s driver.
//
// Its place: shared by the bench/k8s programs only; it runs the binaries
// of cmd/ and plugins/ rather than linking them. Must not import:
// `kurma.dev/kurma/internal/controller/...`, `kurma.dev/kurma/internal/agent/...`,
// `kurma.dev/kurma/internal/kube/...`.
package kurmanode

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"kurma.dev/kurma/internal/testutil/kubecluster"
)

// Binaries are the build outputs Start runs and the plugin the node calls.
var Binaries = []string{"kurma-controller", "kurma-agent", "kurma-k8s-watcher", "kurma-k8s"}

// Node is Kurma beside one cluster node.
type Node struct {
	// Socket is the agent's CNI socket the shim forwards to.
	Socket string
	// CtlAddr is the controller's listen address inside the cluster's
	// namespace; Token its bearer token.
	CtlAddr, Token string
	// StateDir is the agent's state folder (attachment records under
	// k8s/).
	StateDir string
	// WatcherArgs and AgentArgs are extra flags.
	WatcherArgs, AgentArgs []string
	// BinDir, when set, holds the Kurma binaries to run instead of the
	// cluster's bin folder (another build, compared in the same run).
	BinDir string
}

// Check reports a missing binary in binDir.
func Check(binDir string) error {
	for _, b := range Binaries {
		if _, err := os.Stat(filepath.Join(binDir, b)); err != nil {
			return fmt.Errorf("%s not built (make build): %w", b, err)
		}
	}
	return nil
}

// ConfList is the node conflist for the kurma-k8s driver on socket.
func ConfList(socket string) []byte {
	return []byte(`{"cniVersion":"1.0.0","name":"kurma","plugins":[{"type":"kurma-k8s","socket":"` + socket + `"}]}`)
}

// Start runs the controller (bbolt store under c.Dir), the watcher and the
// agent, and waits until the agent's CNI socket is there.
func (n *Node) Start(ctx context.Context, c *kubecluster.Cluster) error {
	if n.StateDir == "" {
		n.StateDir = filepath.Join(c.Dir, "kurma-agent")
	}
	tok := filepath.Join(c.Dir, "ctl-token")
	if err := os.WriteFile(tok, []byte(n.Token), 0o600); err != nil {
		return err
	}
	ctl := "http://" + n.CtlAddr
	for _, p := range [][]string{
		{"kurma-controller", "--listen", n.CtlAddr, "--store", "bolt:" + filepath.Join(c.Dir, "ctl.db"), "--token-file", tok},
		append([]string{"kurma-k8s-watcher", "--kubeconfig", c.Kubeconfig, "--controller", ctl, "--token-file", tok}, n.WatcherArgs...),
		append([]string{"kurma-agent", "--controller", ctl, "--token-file", tok, "--host-id", c.NodeName,
			"--underlay-ip", kubecluster.NodeIP, "--state-dir", n.StateDir,
			"--link-prefix", "kbk", "--nft-table", "kurma-bench-k8s",
			"--k8s-node-name", c.NodeName, "--k8s-kubeconfig", c.Kubeconfig, "--k8s-cni-socket", n.Socket}, n.AgentArgs...),
	} {
		dir := n.BinDir
		if dir == "" {
			dir = c.BinDir
		}
		if _, err := c.StartProcess(p[0], exec.Command(filepath.Join(dir, p[0]), p[1:]...)); err != nil {
			return err
		}
	}
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(time.Minute)
	for {
		if _, err := os.Stat(n.Socket); err == nil {
			return nil
		}
		select {
		case <-tick.C:
		case <-deadline:
			return fmt.Errorf("agent socket %s did not appear:\n%s", n.Socket, c.Logs("kurma-agent", 3000))
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// WaitDrained waits until every sandbox the agent attached is gone: each
// sandbox's DEL removes its attachment record. Call it after deleting the
// pods and before the cluster's Close stops the agent.
func (n *Node) WaitDrained(ctx context.Context, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		ents, err := os.ReadDir(filepath.Join(n.StateDir, "k8s"))
		if err == nil && len(ents) == 0 {
			return nil
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return fmt.Errorf("%d sandboxes still attached after %s: %w", len(ents), limit, ctx.Err())
		}
	}
}
