package cniwire

import "encoding/json"

// ConfList is the node's CNI configuration that makes the kurma-k8s shim
// (dialing socket) the network of every pod. Its version is 1.0.0:
// containerd 1.6 (Debian 12's) rejects 1.1.0 results; the driver answers
// in the config's version. With portmap, the upstream portmap plugin
// (nftables backend) is chained after the shim for hostPort: the runtime
// hands the pod's port mappings to the plugins that declare the
// portMappings capability (docs/kubernetes.md, "HostPort").
func ConfList(socket string, portmap bool) []byte {
	plugins := []any{map[string]any{"type": "kurma-k8s", "socket": socket}}
	if portmap {
		plugins = append(plugins, map[string]any{"type": "portmap", "backend": "nftables",
			"capabilities": map[string]any{"portMappings": true}})
	}
	b, _ := json.MarshalIndent(map[string]any{"cniVersion": "1.0.0", "name": "kurma", "plugins": plugins}, "", "  ")
	return append(b, '\n') // plain values always marshal
}
