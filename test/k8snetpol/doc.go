// Package k8snetpol is the end-to-end proof of NetworkPolicy on a real
// cluster (issue 21): kubelet, containerd, kube-controller-manager,
// kurma-k8s-watcher and kurma-agent with --network-policy, no kube-proxy.
// Tests only.
//
// Must not import: `kurma.dev/kurma/internal/controller/...`.
package k8snetpol
