// Package conformance runs the upstream Kubernetes e2e suite's sig-network
// specs (v1.37.1, built offline by `make e2e`, images by `make
// conformance-images`) against the real cluster of kubecluster: Kurma as
// the CNI and the Service proxy with no kube-proxy, and, in the same run,
// the peer: kube-proxy (nftables mode) with the upstream bridge and portmap
// plugins. Both clusters have what the suite assumes (a public API server,
// the kubelet API, CoreDNS as pods behind kube-dns, hostPort through
// portmap). `make conformance` runs TestUpstream (the 47 [Conformance]
// specs, or the wider [sig-network] set); TestFast, part of `make test`,
// runs a few specs on Kurma only, one per data-plane feature. Results,
// wall times and the reason for each failure are in docs/conformance.md.
// Tests only (mkimage is the image packer of the build).
//
// Must not import: `kurma.dev/kurma/internal/controller/...`, `kurma.dev/kurma/internal/agent/...`.
package conformance
