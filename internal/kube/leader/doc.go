// Package leader runs a function only while this replica holds a
// Kubernetes Lease (client-go leaderelection), for the replicated parts of
// the watcher: the pod watcher and the Services reconciler each hold a
// Lease of their own.
//
// Must not import: `kurma.dev/kurma/...`.
package leader
