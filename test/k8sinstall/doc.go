// Package k8sinstall installs Kurma on a real cluster of two nodes
// (internal/testutil/kubecluster: kube-apiserver, controller manager,
// scheduler, two kubelets each with its containerd, network namespace and
// file system view, on a shared underlay; no CNI, no kube-proxy) the way
// docs/install-kubernetes.md says: import the image `make image` built on
// every node, create the token Secret, label the controller's node, apply
// deploy/kubernetes with only its documented settings changed.
//
// It checks that both nodes go Ready and every Kurma pod is Ready (the
// agents and watchers reach the API server at its real address, with no
// kube-proxy), that pods on the two nodes reach each other over Kurma's
// overlay and a ClusterIP Service from both, and reports the times from
// apply. Then: a rolling upgrade of the agent DaemonSet under Service
// traffic (the established connection survives, the longest gap of new
// connections is reported and held to 1 s, no pod changes address); the
// controller's pod and the watcher leader's pod deleted during a rollout of
// 30 pods (each ends Running with exactly one controller port); the
// agents' RSS and CPU at rest. Last, it uninstalls as documented and checks
// that each node is as it was found (links, routes, nftables tables, CNI
// folders, state folders).
//
// Must not import: `kurma.dev/kurma/internal/agent/...`,
// `kurma.dev/kurma/internal/controller/...`, `kurma.dev/kurma/internal/kube/...`.
package k8sinstall
