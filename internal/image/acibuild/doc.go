// Package acibuild writes ACIs and plain layer tarballs from host files,
// deterministically (sorted walk, fixed owner 0:0 and modification time),
// so an image built twice from the same inputs has the same ID. It backs
// cmd/kurma-acbuild and the image tests.
//
// A Builder is not safe for concurrent use.
//
// Must not import: `kurma.dev/kurma/...` (except `kurma.dev/kurma/pkg/appc`,
// `kurma.dev/kurma/pkg/kerrors`,
// `kurma.dev/kurma/internal/image/tarx`).
package acibuild
