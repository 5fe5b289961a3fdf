// Package api is kurmad's control API server: versioned (/v1)
// HTTP/JSON over a unix socket (0660, root-owned, group from the config).
//
// Why HTTP/JSON rather than gRPC: the API is local only, its callers are the
// kurma CLI and shell scripts (curl --unix-socket works), the standard
// library gives us everything (net/http, HTTP upgrade and hijack, chunked
// responses), and no generated code or protobuf toolchain is needed.
// Streams use two mechanisms:
//   - interactive streams (exec, attach, and a pod create with wait=true,
//     which serves `kurma run` in one round trip) switch the connection with
//     HTTP Upgrade ("kurma-stream") and then speak the frame protocol of
//     wire/stream.go: stdin, stdout, stderr and JSON control frames (resize,
//     stdin close, the exit code, errors);
//   - one-way streams (pull progress) are chunked NDJSON, and logs are a
//     chunked byte stream whose final error, if any, travels in the
//     Kurma-Error trailer.
//
// Errors are JSON {"error":{"type","message"}} with the HTTP status from
// kerrors.HTTPStatus; the client rebuilds them with kerrors.FromType so
// callers test them with errors.Is. docs/api.md documents every endpoint.
//
// Locking: Server holds no mutable state of its own beyond what net/http
// owns; each request runs in its own goroutine and the pod.Manager and
// image.Store it calls are safe for concurrent use.
//
// The wire types and frames are in internal/api/wire, the Go client the
// kurma CLI uses (HTTP/1.1 without net/http) in internal/api/client.
//
// It imports the pod and image contracts (interfaces and types) only,
// never their implementations or the CLI.
// Must not import: `kurma.dev/kurma/internal/cli`,
// `kurma.dev/kurma/internal/image`, `kurma.dev/kurma/internal/image/tarx`, `kurma.dev/kurma/internal/stager`,
// `kurma.dev/kurma/internal/pod/stageinit`.
package api
