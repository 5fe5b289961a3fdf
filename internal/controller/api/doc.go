// Package api is the network controller's HTTP server: routing (Go 1.22
// net/http patterns, paths exactly as spec 003 and docs/controller-api.md),
// bearer-token auth, request decoding and validation, the resource logic
// (projects, VPCs, subnets with IPAM, ports, hosts), long-poll waits,
// watch streams and Prometheus metrics. All state lives in a store.Store;
// the server keeps only caches (subnet trackers, project existence) that the
// store's conditional transactions make safe to be stale, so several
// replicas can share one etcd.
//
// Locking: Server.mu guards the subnet and project caches; each
// ipam.Tracker has its own lock; waiters.mu guards the long-poll waiters.
// No lock is held across a store call.
//
// Must not be imported by the store or ipam packages; imports
// pkg/controllerapi for wire types.
package api
