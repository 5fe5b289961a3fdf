// Command mkimage packs a folder as a one-layer image and writes it as a
// docker-save tarball under one or more names, for `ctr images import` on a
// node that reaches no registry (hack/conformance-images.sh builds the
// offline images of the upstream e2e suite with it).
//
// Usage:
//
//	mkimage -o out.tar -root DIR -tag NAME[,NAME...] [-entrypoint A,B] [-cmd A,B] [-env K=V,...]
//
// Must not import: `kurma.dev/kurma/...`.
package main
