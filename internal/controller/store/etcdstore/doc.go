// Package etcdstore implements the controller store on etcd v3, so several
// controller replicas can share state. Conditions map to etcd transaction
// compares; bit operations are read-modify-write guarded by the bitmap
// key's mod revision and retried when another writer got there first, so
// two replicas can never set the same bit. Every key lives under a
// configurable prefix (default "/kurma/controller/").
//
// Locking: none of its own; the etcd client is safe for concurrent use.
//
// Must not import: `kurma.dev/kurma/internal/controller/api`,
// `kurma.dev/kurma/internal/controller/ipam`.
package etcdstore
