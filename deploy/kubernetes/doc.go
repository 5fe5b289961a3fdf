// Package kubernetes holds the manifests that install Kurma's pod
// networking on a cluster (*.yaml: RBAC, the watcher Deployment, the agent
// DaemonSet; see docs/kubernetes.md) and the test that validates them
// with a server-side dry-run against a real kube-apiserver. It has no
// non-test code. Must not import: `kurma.dev/kurma/...`.
package kubernetes
