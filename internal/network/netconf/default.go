package netconf

import (
	"encoding/json"
	"fmt"
)

// The embedded default network: a bridge with host-local addresses, served by
// the plugin image this repository builds (bin/images/kurma-netplugin.aci).
const (
	DefaultName      = "kurma"
	DefaultBridge    = "kurma0"
	DefaultSubnet    = "10.220.0.0/16"
	DefaultInterface = "eth0"
	// DefaultCNIVersion is the CNI version of the default network's config.
	DefaultCNIVersion = "1.0.0"
	// PluginStateDir is where the default plugin image keeps its state (a
	// persistent volume in the networking pod): the libcni cache, locks and
	// host-local's allocations (under ipam/).
	PluginStateDir = "/var/lib/kurma-network"
)

// Default returns the network Kurma uses when pod_networks is empty: bridge
// "kurma0", subnet 10.220.0.0/16 from host-local, the bridge as gateway, IP
// masquerade on, interface "eth0", attached to every pod by default. aci
// locates the plugin image (e.g. "file:///var/lib/kurma/kurma-netplugin.aci").
func Default(aci string) (Network, error) {
	entry := map[string]any{
		KeyName:               DefaultName,
		KeyACI:                aci,
		KeyDefault:            true,
		KeyContainerInterface: DefaultInterface,
		"cniVersion":          DefaultCNIVersion,
		"type":                "bridge",
		"bridge":              DefaultBridge,
		"isGateway":           true,
		"ipMasq":              true,
		// The plugin image ships nft, not iptables.
		"ipMasqBackend": "nftables",
		"ipam": map[string]any{
			"type":   "host-local",
			"subnet": DefaultSubnet,
			// Allocations must survive a restart of the plugin container.
			"dataDir": PluginStateDir + "/ipam",
			"routes":  []map[string]string{{"dst": "0.0.0.0/0"}},
		},
	}
	b, err := json.Marshal(entry)
	if err != nil {
		return Network{}, fmt.Errorf("default network: %w", err)
	}
	n, err := ParseEntry(b)
	if err != nil {
		return Network{}, fmt.Errorf("default network: %w", err)
	}
	return n, nil
}
