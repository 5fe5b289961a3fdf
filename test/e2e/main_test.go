package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"kurma.dev/kurma/internal/network/netconf"
	"kurma.dev/kurma/internal/testutil"
)

// defaultBridge is the bridge of the embedded default network, which
// daemons started without pod_networks attach to.
const defaultBridge = netconf.DefaultBridge

// masqTable is the nft table the upstream bridge plugin creates for ipMasq
// (the embedded default network has it on) and never removes.
const masqTable = "cni_plugins_masquerade"

// TestMain removes the host state of the embedded default network — its
// bridge, host-local's store and the upstream masquerade table — when this
// suite created them. Subtests
// share daemons and run in parallel, so only the package as a whole knows
// when nobody uses them any more.
func TestMain(m *testing.M) {
	hadBridge := exec.Command("ip", "link", "show", defaultBridge).Run() == nil
	_, err := os.Stat(netconf.PluginStateDir)
	hadState := err == nil
	hadMasq := exec.Command("nft", "list", "table", "inet", masqTable).Run() == nil
	code := testutil.KeepHost(m)
	if !hadBridge {
		if out, err := exec.Command("ip", "link", "del", defaultBridge).CombinedOutput(); err != nil && exec.Command("ip", "link", "show", defaultBridge).Run() == nil {
			fmt.Fprintf(os.Stderr, "e2e: remove bridge %s: %v: %s\n", defaultBridge, err, out)
			code = 1
		}
	}
	if !hadState {
		if err := os.RemoveAll(netconf.PluginStateDir); err != nil {
			fmt.Fprintf(os.Stderr, "e2e: remove %s: %v\n", netconf.PluginStateDir, err)
			code = 1
		}
	}
	if !hadMasq && exec.Command("nft", "list", "table", "inet", masqTable).Run() == nil {
		// Every pod is gone, so the table must hold no rule any more.
		if out, _ := exec.Command("nft", "list", "table", "inet", masqTable).Output(); strings.Contains(string(out), " masquerade") {
			fmt.Fprintf(os.Stderr, "e2e: masquerade rules leaked:\n%s\n", out)
			code = 1
		}
		if out, err := exec.Command("nft", "delete", "table", "inet", masqTable).CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "e2e: remove nft table %s: %v: %s\n", masqTable, err, out)
			code = 1
		}
	}
	os.Exit(code)
}
