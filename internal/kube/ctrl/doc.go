// Package ctrl is the controller scaffold the Kubernetes reconcilers
// share (internal/kube/podports for pods and namespaces,
// internal/kube/services for Services): the part of a client-go
// controller that does not depend on what is reconciled.
//
//   - Run starts the informers it is given and waits for their caches
//     (nothing is synced before both the caches and, when leading, the
//     setup are done);
//   - with Config.Lease set, only the holder of that Lease
//     (internal/kube/leader) runs Setup and the workers; a standby keeps
//     warm caches. Losing the lease ends Run with leader.ErrLost;
//   - Setup runs once per leadership, before the workers, and is retried
//     with backoff (100 ms doubling to 5 s) while it fails with anything
//     but kerrors.Invalid or kerrors.Unauthorized, which end Run;
//   - Config.Workers workers drain one rate-limited queue of string keys
//     (per-key exponential backoff from 20 ms to 30 s, under an overall
//     token bucket); the queue never hands one key to two workers at
//     once, a failed key is queued again with its backoff, a synced one
//     is forgotten. A sync that fails with ErrWaiting (an expected wait,
//     such as a namespace whose pods are still terminating) is retried
//     the same way but logged at debug level until it has waited
//     Config.WaitWarn (5 minutes), then as a warning like any failure.
//     Once the leadership's context has ended, workers drop
//     the keys still queued without syncing them, so a replica that lost
//     its lease writes nothing more;
//   - Config.ResyncKey, when set, is queued every Config.Resync;
//   - metrics (Config.Metrics): sync durations by kind of key and result,
//     queue depth, whether this replica leads, and the time of the last
//     successful sync; Health and Status report the informers' sync, the
//     setup and that time.
//
// What is reconciled (keys, Sync, Setup) stays with the caller: handlers
// only enqueue keys with Queue, Sync reads listers by level.
//
// Locking: the scaffold's state is atomics, and waitMu for the start
// times of waiting keys; it holds no lock across Sync.
//
// Must not import: `kurma.dev/kurma/internal/...` (except
// `kurma.dev/kurma/internal/kube/leader`).
package ctrl
