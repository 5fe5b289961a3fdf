// Package netconf owns the description of Kurma's pod networks: parsing and
// validating the `pod_networks` section of the daemon configuration, the
// embedded default network, rendering `containerInterface` templates into
// checked Linux interface names, and turning a plugin's `add` output (the
// Kurma ip4/ip6 form, CNI 0.1/0.2, or CNI 0.3+/1.x results) into one
// internal result type.
//
// Everything here is pure logic on values: no I/O, no goroutines, no global
// mutable state, so there is no locking. Randomness for templates is drawn
// from an io.Reader the caller may supply (crypto/rand by default).
//
// It touches no network (no netlink, no netns) and imports, among Kurma
// packages, only kerrors.
// Must not import: `kurma.dev/kurma/...`, `github.com/vishvananda/...`,
// `github.com/containernetworking/plugins/pkg/ns` (except
// `kurma.dev/kurma/pkg/kerrors`).
package netconf
