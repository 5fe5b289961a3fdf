// Package e2e is a slim main for the upstream Kubernetes e2e suite: only the
// sig-network specs (test/e2e/network and its NetworkPolicy specs), compiled
// with `go test -c` by `make e2e` and run by test/conformance against the
// real cluster of internal/testutil/kubecluster.
//
// Must not import: kurma.dev/kurma (a module of its own).
package e2e
