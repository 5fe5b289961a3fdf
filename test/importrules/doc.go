// Package importrules holds the test that enforces the import rules the
// package comments state (importrules_test.go). A rule is one sentence of a
// package comment in one of two fixed forms:
//
//	Must not import: `PATTERN`, `PATTERN` (except `PATTERN`, `PATTERN`).
//	Must not depend on: `PATTERN`, `PATTERN` (except `PATTERN`).
//
// A PATTERN is an import path; one ending in "/..." also matches every
// path below it. The "(except ...)" part, which exempts paths the patterns
// would match, is optional. "import" covers the package's own imports;
// "depend on" covers every package it depends on, directly or not (its
// non-test files, as `go list` reports them): for what must not be linked
// at all, such as net/http in the CLI. Prose may explain the rule around
// it.
//
// Must not import: `kurma.dev/kurma/...`.
package importrules
