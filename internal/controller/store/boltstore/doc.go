// Package boltstore is the default controller store: one bbolt file, used
// by one controller process (bbolt takes an exclusive file lock).
//
// Writes are group-committed: Txn calls queue to a single writer goroutine
// that applies every queued transaction inside one bbolt read-write
// transaction (each still all-or-nothing, each with its own revision) and
// fsyncs once for the lot. Reads use concurrent bbolt read transactions.
//
// Values are stored as an 8-byte big-endian modification revision followed
// by the caller's bytes; the global revision lives in the meta bucket.
// Watch history is kept in memory only (the last ~64k events): after a
// restart, watches older than the restart revision get store.ErrCompacted
// and clients re-list, which is the documented recovery path.
//
// Reads go through bbolt's shared mapping of the file; the store trims
// that mapping's page-table entries after open, long scans and every few
// seconds of writes (trim.go), because pages written back while mapped
// made every fsync of a large store slower.
//
// Locking: hub.mu guards the in-memory event history; the writer goroutine
// is the only one that writes to bbolt.
//
// Must not import: `kurma.dev/kurma/internal/controller/api`,
// `kurma.dev/kurma/internal/controller/ipam`.
package boltstore
