package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"testing"

	"kurma.dev/kurma/internal/network/netconf"
)

// defaultBridge is the bridge of the embedded default network, which
// daemons started without pod_networks attach to.
const defaultBridge = netconf.DefaultBridge

// TestMain removes the host state of the embedded default network — its
// bridge and host-local's store — when this suite created them. Subtests
// share daemons and run in parallel, so only the package as a whole knows
// when nobody uses them any more.
func TestMain(m *testing.M) {
	hadBridge := exec.Command("ip", "link", "show", defaultBridge).Run() == nil
	_, err := os.Stat(netconf.PluginStateDir)
	hadState := err == nil
	code := m.Run()
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
	os.Exit(code)
}
