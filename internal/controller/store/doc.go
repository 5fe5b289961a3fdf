// Package store defines the controller's persistence: a small, etcd-shaped
// key/value interface with a global revision, atomic conditional
// transactions (optimistic concurrency), bitmap operations for compact IPAM
// state, and resumable prefix watches. Two backends implement it and pass
// the same conformance suite (storetest): boltstore (embedded bbolt, one
// file, one process, group-committed writes) and etcdstore (etcd v3, shared
// by several controller replicas).
//
// Locking: implementations are safe for concurrent use; this package holds
// only types.
//
// It knows nothing about ports or subnets.
// Must not import: `kurma.dev/kurma/internal/controller/api`,
// `kurma.dev/kurma/internal/controller/ipam`.
package store
