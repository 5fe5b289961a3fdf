// Package podnet is the schema of the pod annotation through which the
// Kubernetes watcher (internal/kube/podports) hands a pod's controller port
// to the node agent's CNI daemon (internal/kube/cnid): the
// "kurma.dev/pod-networks" annotation, a JSON object keyed by network name
// ("default" is the pod's primary interface), as OVN-Kubernetes keys
// k8s.ovn.org/pod-networks. Each entry names the port (id, project,
// subnet), its MAC, addresses with prefix, gateways, routes, the UID of the
// pod it was made for and the host id the port is bound to. docs/kubernetes.md
// documents the schema for operators.
//
// Encode and Decode validate strictly (unknown fields, bad addresses,
// gateways outside their prefix, oversize input are errors in category
// kerrors.Invalid naming the field), because the annotation is outside
// input: anyone allowed to patch pods can write it.
//
// Locking: none; the package has no state.
//
// This package is a leaf of the Kubernetes integration, shared by the CNI
// daemon and the watcher at no cost. Must not import: `k8s.io/...`,
// `kurma.dev/kurma/...` (except `kurma.dev/kurma/pkg/kerrors`).
package podnet
