// Package kubecluster runs a real Kubernetes cluster for tests and
// benchmarks: etcd, kube-apiserver, optionally kube-controller-manager and
// kube-scheduler, and one node (or Options.Nodes of them) made of Debian's
// containerd (CRI) and a real kubelet, all built by `make build`
// (bin/tools/etcd, bin/k8s/*) and all inside a network namespace of the
// cluster's own. A second node gets a namespace, folders, cgroup root and
// sockets of its own, on an underlay shared with the first (a bridge in
// a namespace of its own, the switch, and a veth from each node). The CNI
// configuration of the nodes is the caller's: a conflist and a plugin
// folder, so that the same harness runs the upstream bridge plugin (the
// peer) and Kurma's driver.
//
// Close removes the sandboxes of every node through the CRI; when a test
// has removed a node's CNI configuration (an uninstall), it first writes a
// loopback-only conflist there, without which containerd 1.6 cannot stop a
// sandbox ("cni plugin not initialized").
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
