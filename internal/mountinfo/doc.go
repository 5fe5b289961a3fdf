// Package mountinfo holds the small pieces of /proc/<pid>/mountinfo
// parsing that the daemon (internal/pod, internal/network/manager) and the
// stager (internal/stager) share, so the escape rules live in one place.
//
// It is a leaf: it imports only the standard library.
// Must not import: `kurma.dev/kurma/...`.
package mountinfo
