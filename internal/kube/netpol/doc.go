// Package netpol computes what Kubernetes NetworkPolicy (networking.k8s.io/v1)
// allows for the pods of one node, as plain data the agent's nftables
// datapath (internal/agent/policypath) turns into set elements.
//
// The Engine holds compact copies of every pod (namespace, name, node,
// address, labels, named container ports), the namespaces' labels and the
// compiled policies. For each local pod (one whose spec.nodeName is this
// node) it computes Rules: whether the pod is isolated for ingress and for
// egress, and the allowed peers of each direction as Allow values (a
// range of peer addresses, a protocol, a range of ports). Exact tuples
// (one peer, one port) stay exact, so the datapath can put them in hashed
// sets; ipBlock (a CIDR minus its excepts, split into address ranges) and
// endPort are ranges.
//
// Semantics follow the API's documentation: a pod is isolated for a
// direction when a policy of its namespace selects it with that policy
// type (policyTypes empty: Ingress, plus Egress when the policy has egress
// rules); a rule without peers allows every peer, without ports every port
// and protocol; a peer with both selectors means pods matching podSelector
// in namespaces matching namespaceSelector; a named port is resolved on
// the destination pod (the local pod for ingress, each peer pod for
// egress; an ipBlock peer cannot resolve one and matches nothing); a pod
// in a terminal phase or on the host network is neither selected nor a
// peer. A rule allowing every peer on every port makes the pod not
// isolated for that direction (the same verdicts, no elements).
//
// Where the work happens: every node's agent computes only its own pods'
// rules from the whole cluster's pods and policies (informers with a
// transform that keeps only the fields above). A central computation
// (Antrea's controller) would send each node less data, but Kubernetes'
// watch already delivers the objects once per node and the per-node
// computation scales with the node's pods, not the cluster's.
//
// Incremental: a change of a policy, a namespace or a local pod marks the
// local pods whose rules may change (the pods a policy selects before and
// after; the local pods of policies with a namespaceSelector; the pod
// itself), and Compute recomputes only those. A change of a peer pod is a
// delta: each local pod keeps counted contributions (policy, rule, peer,
// port) per Allow, and the peer's old contributions are taken out and its
// new ones put in, without recomputation. Policies that name peers alike
// share a signature, so a pod's change checks each signature once; those
// that also have the same ports share a shape, so the delta is applied
// once per shape and local pod, weighted by how many of the shape's
// policies select the pod (weights kept per signature until one of its
// policies changes or a local pod is recomputed).
// TestIncrementalEqualsScratch checks that the result always equals a
// fresh computation.
//
// Trust: a pod's address is its status.podIPs (the kubelet's), or before
// the kubelet reports it the kurma.dev/pod-networks annotation, which
// anyone who may edit the pod can write. The Controller uses the
// annotation's address only once Config.VerifyAddr (the agent's record
// of the pod's port, from the controller) confirms it; until then the
// engine has the pod without an address (neither selected nor a peer),
// Run asks again every 200 ms, and WaitPod every 50 ms while an ADD
// waits.
//
// Locking: an Engine is not safe for concurrent use; the Controller
// serialises it under its mutex.
//
// It uses client-go and the API types only. Must not import: `kurma.dev/kurma/internal/agent/...`, `kurma.dev/kurma/internal/controller/...`.
package netpol
