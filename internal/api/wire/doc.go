// Package wire holds what kurmad's API server (internal/api) and its Go
// client (internal/api/client) share: the request and response types, the
// JSON error body, request validation, and the frame protocol of streams.
//
// Both sides import it; it must never import net/http, the server, the
// client or the pod runtime (internal/pod): the kurma CLI links it, and
// every package it links costs each command its start-up.
package wire
