// Package cniwire is the message format between the kurma-k8s CNI shim
// (plugins/kurma-k8s) and the node agent's CNI daemon (internal/kube/cnid)
// over a unix socket: the shim writes one Request (the CNI_* environment
// and the config from stdin) as JSON and half-closes; the daemon answers
// one Response (what the plugin prints and its exit code) and closes.
//
// It also holds the plugin-specific CNI error codes, documented in
// docs/kubernetes.md.
//
// Locking: none. It keeps the shim small and quick to start. Must not
// import: `kurma.dev/kurma/...`, `k8s.io/...`, `net/http`.
package cniwire

import "path/filepath"

// DefaultSocket is where the agent listens unless the network config's
// "socket" says otherwise.
const DefaultSocket = "/run/kurma/cni.sock"

// MaxMessage bounds a request or response.
const MaxMessage = 1 << 20

// EnvKeys are the environment variables the shim forwards.
var EnvKeys = []string{"CNI_COMMAND", "CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_ARGS", "CNI_PATH"}

// Request is one CNI invocation.
type Request struct {
	Env   map[string]string `json:"env"`
	Stdin []byte            `json:"stdin"`
}

// Response is what the plugin prints on stdout and its exit status.
type Response struct {
	ExitCode int    `json:"exit_code"`
	Stdout   []byte `json:"stdout"`
}

// Plugin-specific CNI error codes (the CNI spec leaves 100 and up to
// plugins). Spec codes the driver also uses: 4 (bad CNI_* variables or
// CNI_ARGS), 5 (I/O), 6 (config not JSON), 7 (bad network config), 11 (try again later: the agent is not
// reachable), 50 (STATUS: not ready), 999 (internal).
const (
	// ErrAnnotationTimeout: the pod's kurma.dev/pod-networks annotation
	// did not appear (for this pod UID and this host) in time.
	ErrAnnotationTimeout = 100
	// ErrPodNotFound: the API server has no pod of that namespace and name.
	ErrPodNotFound = 101
	// ErrUIDMismatch: the pod of that name has another UID than the
	// runtime's K8S_POD_UID (it was replaced), or its annotation was made
	// for another UID.
	ErrUIDMismatch = 102
	// ErrControllerUnreachable: the agent cannot reach the Kurma
	// controller (it has not listed its ports yet).
	ErrControllerUnreachable = 103
	// ErrPlugFailed: the agent could not plug the port into the pod's
	// network namespace.
	ErrPlugFailed = 104
	// ErrPolicyNotReady: the pod's NetworkPolicy rules were not in the
	// kernel in time (the agent's policy watch is behind or failing); the
	// pod is not plugged, so it never runs unprotected.
	ErrPolicyNotReady = 105
	// ErrPortNotOwned: the port the annotation names is not this pod's
	// (its id is not pod-<UID>, or the controller's record of it has
	// another device id or owner), or it is attached to another live
	// sandbox. The agent never moves such a port.
	ErrPortNotOwned = 106
)

// DelQueue is the folder, beside the agent's socket, where the shim leaves
// a DEL it could not deliver because the agent was down. The runtime then
// sees the DEL succeed and frees the sandbox instead of retrying it
// forever; the agent carries out every queued DEL when it starts, and
// again every so often. A DEL is idempotent, so one carried out late or
// twice does no harm.
func DelQueue(socket string) string { return filepath.Join(filepath.Dir(socket), "del-queue") }

// QueueFile is the name of a queued DEL's file, "<container>_<ifname>.json",
// or "" when either value could not safely be part of a file name (such
// a DEL is not queued).
func QueueFile(containerID, ifName string) string {
	if !safeName(containerID, 128) || !safeName(ifName, 15) {
		return ""
	}
	return containerID + "_" + ifName + ".json"
}

// safeName: 1 to max letters, digits, '.', '-' or '_', not starting with
// a dot.
func safeName(s string, max int) bool {
	if s == "" || len(s) > max || s[0] == '.' {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}
