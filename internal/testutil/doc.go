// Package testutil holds helpers that tests across Kurma share: gating root
// tests, creating real network namespaces that clean themselves up, and
// finding the binaries that `make build` produced.
//
// Every helper that creates a resource registers its own t.Cleanup. Only
// _test.go files may import this package.
// Must not import: `kurma.dev/kurma/...` (except
// `kurma.dev/kurma/pkg/kerrors`).
package testutil
