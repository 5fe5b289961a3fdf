// Package wire holds what kurmad's API server (internal/api) and its Go
// client (internal/api/client) share: the request and response types, the
// JSON error body, request validation, and the frame protocol of streams.
//
// Both sides import it. The kurma CLI links it, and every package it links
// costs each command its start-up.
// Must not depend on: `net/http`, `kurma.dev/kurma/internal/api`,
// `kurma.dev/kurma/internal/api/client`, `kurma.dev/kurma/internal/pod`.
package wire
