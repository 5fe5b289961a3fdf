// Package stageinit is the first process of every pod: started by the pod
// manager (internal/pod) in the pod's fresh mount, UTS, IPC, PID and
// network namespaces, it makes the stager spec's mounts in the stager's
// root, waits for the daemon's go-ahead on fd 3, pivots into the root
// (detaching the host's mount tree) and execs the stager, which keeps its
// PID (1 of the pod's PID namespace) and fd 4, the readiness pipe.
//
// It runs as its own small binary, cmd/kurma-stage-init, so that its start
// (and a warm spare's, which is made while pods start and stop) costs a
// minimal Go runtime rather than the daemon's, whose binary takes many
// more page faults to start (figures in bench/README.md). `kurmad stage-init` runs the same code
// where that binary is missing.
//
// It imports as little as it can: every package linked costs each pod
// start its initialisation.
// Must not depend on: `kurma.dev/kurma/...`.
package stageinit
