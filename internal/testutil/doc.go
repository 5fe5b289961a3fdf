// Package testutil holds helpers that tests across Kurma share: gating root
// tests, creating real network namespaces that clean themselves up, and
// finding the binaries that `make build` produced.
//
// Every helper that creates a resource registers its own t.Cleanup. Only
// _test.go files may import this package; it must not import any Kurma
// package other than kerrors.
package testutil
