// Package cniconformance is a reusable conformance harness for the CNI
// plugins Kurma ships. Run(t, Plugin{...}) drives a plugin binary through
// libcni, exactly as a container runtime would, for every cniVersion it
// claims: VERSION, ADD (result schema for that version, and the interface
// really present in the container netns with the reported MAC and
// addresses), CHECK, DEL (twice: idempotent), DEL with an empty netns after
// the netns is gone, DEL of a never-added container, concurrent ADDs for
// different containers, unknown config args ignored, invalid configs
// rejected with CNI error JSON on stdout, GC with cni.dev/valid-attachments
// and STATUS. After every ADD→DEL cycle it compares snapshots of the host
// and container network state (links, addresses, routes, rules, nftables
// and iptables rulesets) and of the plugin's external state (IPAM files,
// controller ports) with the state before.
//
// Plugins that touch only namespaces run inside a private "host" netns the
// harness creates, so snapshots are exact even while other tests change the
// real host. Plugins that must reach a loopback service (mizarmp) run in the
// real host netns; there the host snapshot is restricted to lines naming an
// attachment's addresses or MAC.
//
// The helpers create resources (netns, cache dirs) that remove themselves
// with t.Cleanup. No locking: an Env is used by one test, except for the
// concurrent-ADD check, which uses distinct containers.
//
// Only tests import this package. Its mpenv sub-package (which starts the
// real controller and agent binaries for mizarmp tests and the benchmark)
// uses only pkg/controllerapi.
// Must not import: `kurma.dev/kurma/...` (except
// `kurma.dev/kurma/internal/testutil`, `kurma.dev/kurma/pkg/kerrors`,
// `kurma.dev/kurma/test/cniconformance/mpenv`,
// `kurma.dev/kurma/pkg/controllerapi`).
package cniconformance
