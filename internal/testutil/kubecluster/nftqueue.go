package kubecluster

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
)

// queueProbe is the rule shape kube-network-policies installs: new
// connections of selected pods go to an nfqueue.
const queueProbe = `table inet kurma-queue-probe {
	chain c {
		type filter hook forward priority 0; policy accept;
		ct state new queue flags bypass to 98
	}
}
`

// NFTQueue reports why the kernel cannot hold an nftables queue rule
// (nil: it can), which kube-network-policies, the NetworkPolicy peer of
// the harness and of bench/k8s/netpol, depends on. The probe runs in a
// network namespace of its own that ends with the command.
func NFTQueue(ctx context.Context) error {
	cmd := exec.CommandContext(ctx, "unshare", "--net", "--", "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(queueProbe)
	if out, err := cmd.CombinedOutput(); err != nil {
		line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
		return fmt.Errorf("nft rule `ct state new queue flags bypass to 98`: %w: %s", err, line)
	}
	return nil
}
