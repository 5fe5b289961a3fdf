// Package podports is the pod → port controller, the Kubernetes side of
// pod networking (seed 002's "Raven"; the binary is kurma-k8s-watcher): it
// reconciles Namespaces into controller subnets and Pods into controller
// ports, following Namespaces, Pods and Nodes through client-go shared
// informers, in flat mode:
//
//   - one controller project and one VPC for the cluster, created if
//     missing;
//   - one subnet per namespace (by default a /16 from a configurable pool),
//     id "ns-<namespace UID>", name the namespace's name; a namespace that
//     is deleted (or replaced by another of the same name) has its subnet
//     deleted once its ports are gone;
//   - one port per scheduled, non-hostNetwork pod, id "pod-<pod UID>", so
//     that a pod that comes back under the same name (a StatefulSet) gets a
//     new port and one UID can never own two ports; bound to the host id
//     of the pod's node (the Node's kurma.dev/host-id annotation, else the
//     Node name), and rebound in place, keeping address and MAC, when that
//     host id changes; its details are patched into the pod's
//     kurma.dev/pod-networks annotation (internal/kube/podnet) with the
//     pod's UID as a precondition;
//   - a pod that is deleted, or has finished (Succeeded/Failed), loses its
//     port.
//
// Shape (sample-controller style, on the scaffold of internal/kube/ctrl,
// which owns the queue, lease, workers, metrics and health): informer
// handlers only enqueue keys ("n/<namespace>", "p/<pod UID>", "resync")
// on a rate-limited work queue; a fixed number of workers sync each key
// by level from the listers and the controller, and failures are retried
// with exponential backoff. Everything done for one pod (its port made, annotated or
// deleted) is done under its one key, so that the queue, which never
// hands a key to two workers at once, orders a sync that read the pod
// before its deletion before the one that sees it gone. A full resync (at
// start and every Config.Resync) lists the controller's ports and
// subnets once, enqueues the pods whose port is missing or whose
// annotation is not, all of it, what the watcher would write for that
// port now, the UIDs of ports without an eligible pod, and the namespaces
// whose subnet is missing or stale, so kill -9 at any moment followed by
// a restart converges: ids are derived from UIDs, creates that find their
// object existing adopt it, and annotations are rewritten from the port.
// A pod's owner may edit its annotation: between resyncs, a pod's update
// event is synced unless its annotation matches the digest of the one
// the watcher last wrote or found in place for it (Watcher.written, one
// entry per pod that has a port), so an edited address, MAC or host is
// rewritten at once.
//
// Leader election: with Config.Lease set, only the holder of that Lease
// (client-go leaderelection, through internal/kube/ctrl) runs workers and
// writes; other replicas keep warm caches. Losing the lease ends Run with
// ErrLostLease (the process exits and restarts as a follower).
//
// Locking: Watcher.mu guards the subnet cache and serialises address-range
// allocation (two namespaces never get the same range); it is never held
// across a Kubernetes call, and across controller calls only while
// allocating.
//
// It speaks to the controller only through pkg/controllerapi. Must not
// import: `kurma.dev/kurma/internal/controller/...`,
// `kurma.dev/kurma/internal/agent/...`.
package podports
