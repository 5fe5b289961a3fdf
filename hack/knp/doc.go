// Package knp only pins kube-network-policies v0.8.0 for `make knp` (its
// main is sigs.k8s.io/kube-network-policies/cmd, a tool of this module).
//
// Must not import: kurma.dev/kurma (a module of its own).
package knp
