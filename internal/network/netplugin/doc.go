// Package netplugin is the logic of Kurma's default network plugin image
// (cmd/kurma-netplugin): it turns the Kurma plugin calls (/opt/network/add
// and /opt/network/del with the network config on stdin and the arguments
// NETNS_PATH POD_UUID IFNAME) into CNI calls on the standard plugins through
// libcni, and runs the image's long-lived main executable, which validates
// the config and garbage-collects attachments whose network namespace is
// gone.
//
// State: libcni's result cache lives under <StateDir>/cache (so `del` gets
// the prevResult of `add`), and per-attachment lock files under
// <StateDir>/locks. Calls for the same (network, pod) are serialised by an
// flock on that lock file, across processes; calls for different pods run
// concurrently (libcni writes one cache file per attachment, host-local
// takes its own lock). A Plugin value has no mutable fields and is safe for
// concurrent use.
//
// Among Kurma packages it imports only kerrors and network/netconf.
// Must not import: `kurma.dev/kurma/...` (except
// `kurma.dev/kurma/pkg/kerrors`,
// `kurma.dev/kurma/internal/network/netconf`).
package netplugin
