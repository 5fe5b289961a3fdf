// Package appc holds the subset of the App Container (appc) schema that Kurma
// reads and writes: image manifests, pod manifests, image IDs and names.
//
// The upstream github.com/appc/spec module is archived and not served by the
// Go module proxy, so these types are written here from the appc spec
// (ace.md, aci.md, pods.md). JSON field names follow the spec exactly.
// Validation is strict where a value becomes a path or an identifier (image
// IDs, app and volume names) because manifests come from outside.
//
// This package is a leaf.
// Must not import: `kurma.dev/kurma/...`.
package appc
