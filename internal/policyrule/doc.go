// Package policyrule holds the NetworkPolicy rule types that the policy
// engine (internal/kube/netpol) computes and the agent's datapath
// (internal/agent/policypath) programs: one type on both sides, so a
// change's allow lists pass from the engine to the kernel without being
// copied or converted (the copy of 20 pods × 2,000 allows cost 0.46 ms per
// label change, more when it met the garbage collector). A direction's
// list is persistent (Dir: a shared Base and a small overlay of changes),
// so that a change of a few allows builds a few allows, not a new list.
//
// It is a leaf: plain values, no Kubernetes, no nftables.
// Must not import: `kurma.dev/kurma/...`, `k8s.io/...`.
package policyrule
