// Package storetest is the conformance suite every store.Store backend
// must pass (boltstore and etcdstore run it from their tests). It is
// imported only by _test.go files.
//
// Must not import: `kurma.dev/kurma/internal/controller/api`,
// `kurma.dev/kurma/internal/controller/ipam`.
package storetest
