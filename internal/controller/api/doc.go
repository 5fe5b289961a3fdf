// Package api is the network controller's HTTP layer: routing (Go 1.22
// net/http patterns, paths exactly as spec 003 and docs/controller-api.md),
// bearer-token auth, strict JSON decoding, encoding of answers and errors
// (pkg/kerrors categories to status codes), NDJSON watch streams and the
// request metrics. Each handler decodes, calls internal/controller/core
// and encodes; the resource rules, the store and the IPAM cache live in
// the core.
//
// Locking: Server holds no mutable state of its own beyond its metrics.
//
// Must not be imported by the core, store or ipam packages; imports
// pkg/controllerapi for wire types.
package api
