// Package core is the network controller's resource logic: projects, VPCs,
// subnets and their IPAM cache, ports, hosts, load balancers, external
// networks and floating IPs, the watch feeds agents follow and the
// long-poll waits. It is called with typed requests (pkg/controllerapi
// types and the few request types defined here) and answers with typed
// results and pkg/kerrors categories; internal/controller/api is the HTTP
// layer over it (decode, call, encode).
//
// All state lives in a store.Store. The core keeps only caches (subnet
// trackers, project existence) that the store's conditional transactions
// make safe to be stale, so several controller replicas can share one
// etcd.
//
// Locking: Core.mu guards the subnet and project caches; each
// ipam.Tracker has its own lock; waiters.mu guards the long-poll waiters.
// No lock is held across a store call.
//
// It must not be imported by the store or ipam packages.
// Must not import: `net/http`, `kurma.dev/kurma/internal/controller/api`.
package core
