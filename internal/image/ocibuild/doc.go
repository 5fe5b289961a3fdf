// Package ocibuild makes small, reproducible OCI images from files: one
// layer per call, entries sorted, every timestamp, owner and name field
// fixed, so that the same files give the same digest on every machine. It
// is a thin layer over go-containerregistry (which does the manifests,
// the config, compression and the two output forms: an OCI image layout
// and a `docker save` tarball); archive/tar writes the layer.
//
// hack/kurma-image uses it for the image Kurma's Kubernetes install runs
// (docs/install-kubernetes.md).
//
// Must not import: `kurma.dev/kurma/internal/pod`,
// `kurma.dev/kurma/internal/api/...`, `kurma.dev/kurma/internal/network/...`,
// `kurma.dev/kurma/internal/agent/...`,
// `kurma.dev/kurma/internal/controller/...`, `kurma.dev/kurma/internal/kube/...`.
package ocibuild
