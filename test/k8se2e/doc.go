// Package k8se2e holds the end-to-end test of Kurma's Kubernetes pod
// networking on a real cluster (internal/testutil/kubecluster: etcd,
// kube-apiserver, kube-controller-manager, kube-scheduler, containerd and a
// kubelet), with the real kurma-controller, kurma-k8s-watcher, kurma-agent
// and the kurma-k8s CNI shim as the node's network. It starts clusters, so
// it is in HOST_PKGS. It has no non-test code.
package k8se2e
