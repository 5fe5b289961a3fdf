// Package controllerapi holds the wire types and the Go client of the Kurma
// network controller's REST API (docs/controller-api.md). The paths follow
// spec 003 exactly ("project/<pid>/ports", no /v1 prefix) and every body wraps
// its object in a key named after it, Neutron style: {"port":{...}},
// {"ports":[...]}, {"subnet":{...}}.
//
// The controller (internal/controller/...) and the host agent build on this
// package, and the mizarmp CNI plugin mirrors its JSON in its own small
// client (plugins/mizarmp/api.go, tested against these types), so changes
// must be additive: new optional fields and new methods only.
//
// Locking: a Client is safe for concurrent use; it holds no mutable state
// beyond its http.Client.
//
// Must not import: `kurma.dev/kurma/...` (except
// `kurma.dev/kurma/pkg/kerrors`).
package controllerapi
