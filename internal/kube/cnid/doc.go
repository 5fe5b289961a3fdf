// Package cnid is the node agent's side of the Kubernetes CNI driver: it
// serves the kurma-k8s shim (plugins/kurma-k8s) on a unix socket (mode
// 0600 in a 0700 directory) and does each CNI verb inside the long-running
// agent, where a watch cache of this node's pods and the agent's datapath
// are already warm:
//
//   - ADD reads CNI_ARGS as a set (IgnoreUnknown, K8S_POD_NAMESPACE,
//     K8S_POD_NAME, K8S_POD_INFRA_CONTAINER_ID, K8S_POD_UID), waits for the
//     pod's kurma.dev/pod-networks annotation (internal/kube/podnet) on its
//     watch of pods with spec.nodeName = this node, falling back to
//     polling the API server every Config.PollInterval, up to
//     Config.AnnotationTimeout (seed 002: 0.5 s and 10 s); checks the pod
//     UID against the runtime's and the annotation's; records the
//     attachment (container, interface, namespace, port) in its state
//     directory; has the agent plug the port into CNI_NETNS
//     (agent.Attach) and waits until it is plugged (not for UP: the
//     agent's UP report to the controller follows); and prints a CNI
//     result from the annotation.
//   - DEL detaches the port (the agent unplugs it) unless a newer sandbox
//     of the same pod holds it, and forgets the attachment; an unknown
//     attachment is success. The controller port stays: the watcher owns
//     it and deletes it with the pod.
//   - CHECK compares the interface in CNI_NETNS with the annotation.
//   - GC detaches every recorded attachment not in
//     cni.dev/valid-attachments.
//   - STATUS is ready once the pod cache has synced and the agent has
//     listed its ports.
//
// Each successful ADD is logged on one line ("cnid: ADD": container, pod,
// port, and the time spent reading the request, waiting for the
// annotation, for network policy and for the plug, with the number of
// requests served at that moment); bench/k8s joins these lines with the
// runtime's side into the burst's ADD timeline.
//
// Errors are CNI error JSON with the codes of internal/kube/cniwire
// (documented in docs/kubernetes.md). Every limit stays well below the
// kubelet's 4-minute sandbox timeout.
//
// Restart safety: attachments are files (written by rename) under
// Config.StateDir, replayed into the agent (agent.Restore) before it
// starts, so a restarted agent neither unplugs running pods nor forgets
// what DEL must undo.
//
// Locking: Daemon.mu guards the attachment records and the annotation
// waiters; it is never held across a network, netlink or file call.
// Requests are served by at most Config.MaxConcurrent goroutines.
//
// It uses client-go, internal/agent (for its Attach API), podnet, cniwire,
// the CNI libraries and netlink. Must not import:
// `kurma.dev/kurma/internal/controller/...`.
package cnid
