// Package services turns Kubernetes Services into Kurma load balancers and
// floating IPs (seed 002, issue 16), so that a cluster runs without
// kube-proxy:
//
//   - every Service with a clusterIP inside the API server's
//     --service-cluster-ip-range gets one load balancer, id
//     "svc-<Service UID>", whose VIP is exactly the clusterIP (allocated as
//     a requested address from the cluster's service subnet), one listener
//     per Service port (TCP, UDP, SCTP; a named targetPort resolved through
//     the EndpointSlices' ports), and as members the ready endpoints of the
//     Service's EndpointSlices (kube-controller-manager's, or anyone's for
//     Services without a selector). sessionAffinity ClientIP becomes
//     SOURCE_IP persistence with the same timeout. Headless and
//     ExternalName Services get none;
//   - a Service of type LoadBalancer (loadBalancerClass unset or ours)
//     also gets a floating IP, id "svc-<Service UID>", from the configured
//     external network, associated with its load balancer; the address is
//     written to status.loadBalancer.ingress with ipMode VIP.
//     spec.loadBalancerIP is requested as such; an address that is taken
//     gives an Event and a False status condition, never another address.
//
// Shape (sample-controller style, on the scaffold of internal/kube/ctrl,
// which owns the queue, lease, workers, metrics and health): informer
// handlers only enqueue the Service's namespace/name on a rate-limited
// work queue, after a window
// of a few milliseconds so that a burst of changes to one Service and its
// slices is synced once. A worker syncs one key by level: it computes the
// wanted load balancer (desired.go, pure) and sends the smallest change
// (nothing, one member replacement, one update, or a create), so a change
// of one Service touches only its own load balancer. The last state the
// controller returned is cached per load balancer and floating IP.
//
// Restart safety: ids derive from Service UIDs, so a create that finds its
// id taken adopts the object; the full resync (at start and every
// Config.Resync) lists the project's load balancers and floating IPs,
// deletes those whose Service UID no longer wants one, and enqueues every
// Service. kill -9 at any moment followed by a restart therefore converges
// with nothing stale and nothing duplicated.
//
// Locking: Reconciler.mu guards the caches (lbs, fips, warned); it
// is never held across a controller or Kubernetes call.
//
// It speaks to the controller only through pkg/controllerapi and runs
// beside internal/kube/podports in cmd/kurma-k8s-watcher without importing
// it. Must not import: `kurma.dev/kurma/internal/controller/...`,
// `kurma.dev/kurma/internal/agent/...`, `kurma.dev/kurma/internal/kube/podports`.
package services
