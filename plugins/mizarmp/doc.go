// Command mizarmp is the CNI plugin (type "mizarmp") backed by the Kurma
// network controller, following spec 003: ADD creates a port for the
// attachment and waits for the host agent to plug it and report it UP in
// one request (POST project/<project>/ports?wait_status=UP; with a
// controller that answers at once it long-polls, then polls, GET on the
// port), reads the subnet (concurrently) for DNS and to check the address,
// and prints the CNI result; DEL deletes the port; CHECK compares the port with
// the interface in the container netns; GC deletes this host's ports that no
// valid attachment owns; STATUS asks the controller. It speaks CNI 0.1.0
// through 1.1.0.
//
// The plugin owns no local state. Port ids are derived (UUID v5) from host,
// project, subnet, network name, container id and interface, so DEL and
// CHECK need no cache and find the port with a single request.
//
// Locking: none; each invocation is one short-lived process.
//
// Speed matters (one exec per pod): this package must stay small.
// Must not depend on: `k8s.io/...`, `go.etcd.io/...`,
// `github.com/prometheus/...`, `net/http`,
// `kurma.dev/kurma/internal/controller/...`.
// It talks to the controller through its own
// small HTTP/1.1 client (api.go) with wire types whose JSON matches
// pkg/controllerapi (tested), because pkg/controllerapi's net/http client
// was a large share of the plugin's process time (bench/cni/README.md).
package main
