// Package gcflag is the --gc-percent flag of Kurma's long-running
// Kubernetes-side daemons (kurma-agent, kurma-k8s-watcher): the Go
// garbage collector's target heap growth (GOGC), with a default lower
// than Go's 100 so that peak memory stays nearer the live heap, at the
// cost of more frequent collections (docs/kubernetes.md has the figures).
// An explicit flag wins over $GOGC, $GOGC over the default. It imports
// only the standard library.
package gcflag
