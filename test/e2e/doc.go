// Package e2e holds Kurma's end-to-end acceptance tests: they start the real
// kurmad binary (as root) with a temporary configuration — its own state
// directories and socket — and drive it with the real kurma CLI, running
// pods from docker:// (an in-process registry on 127.0.0.1), file:// (OCI
// layout and ACI) and http:// (a loopback file server) images.
//
// Only the _test.go files have content; the package imports nothing at run
// time and must never be imported.
package e2e
