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
// This package must never import the daemon, pod manager, stager or any
// package that touches the network (netlink, netns); it may import only
// kerrors among Kurma packages, plus the CNI types.
package netconf
