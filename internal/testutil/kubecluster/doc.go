// Package kubecluster runs a real, single-node Kubernetes cluster for tests
// and benchmarks: etcd, kube-apiserver, optionally kube-controller-manager
// and kube-scheduler, and a node made of Debian's containerd (CRI) and a real
// kubelet, all built by `make build` (bin/tools/etcd, bin/k8s/*) and all
// inside a network namespace of the cluster's own. The CNI configuration of
// the node is the caller's: a conflist and a plugin folder, so that the same
// harness runs the upstream bridge plugin (the peer) and Kurma's driver.
//
// Every process is started on one OS thread that has entered the cluster's
// network namespace (they share the host's mount namespace, as kubelet,
// containerd and runc must), with a parent-death signal, so a crashed test
// binary leaves no daemon running. Close (or the t.Cleanup that StartT
// registers) removes every pod sandbox through the CRI, stops every process
// by PID, unmounts what the kubelet and containerd mounted, removes the
// cgroups, restores the kernel settings the kubelet changed, and deletes the
// namespace and the cluster's folder. A test binary killed before Close
// takes its daemons with it (parent-death signal); the next Start undoes the
// rest from the record the cluster kept in its folder (sweep.go), CRI
// sandboxes included. A host-wide file lock makes clusters of
// different test packages wait for each other; such packages belong in
// HOST_PKGS in the Makefile.
//
// Facts about running these components on the test machines are in
// docs/kubernetes-testing.md. Only tests and bench/ mains import this
// package.
// Must not import: `kurma.dev/kurma/...` (except
// `kurma.dev/kurma/internal/testutil`, `kurma.dev/kurma/pkg/kerrors`).
package kubecluster
