// Command kurma-image writes the image Kurma's Kubernetes install runs
// (deploy/kubernetes, docs/install-kubernetes.md): kurma-agent,
// kurma-k8s-watcher, kurma-controller and the kurma-k8s CNI shim under
// /usr/local/bin, static, nothing else (no shell, no libc). It writes an
// OCI image layout and a `docker save`-style tarball and prints the
// image's digest and size. `make image` runs it on binaries built with
// CGO_ENABLED=0 -trimpath -buildvcs=false, so that the same sources and
// Go toolchain give the same digest.
//
// Must not import: `kurma.dev/kurma/internal/pod`,
// `kurma.dev/kurma/internal/agent/...`, `kurma.dev/kurma/internal/kube/...`.
package main
