// Package k8sinstall installs Kurma on a real cluster (internal/testutil/kubecluster:
// kube-apiserver, controller manager, scheduler, a kubelet with containerd;
// no CNI, no kube-proxy) the way docs/install-kubernetes.md says: import the
// image `make image` built, create the token Secret, label the controller's
// node, apply deploy/kubernetes with only its documented settings changed.
// It checks that the node goes Ready, that a pod gets Running with an
// address and that a ClusterIP Service answers, reports the times from
// apply, then uninstalls as documented and checks that the node is as it
// was found (links, nftables tables, CNI folders, state folders).
//
// Must not import: `kurma.dev/kurma/internal/agent/...`,
// `kurma.dev/kurma/internal/controller/...`, `kurma.dev/kurma/internal/kube/...`.
package k8sinstall
