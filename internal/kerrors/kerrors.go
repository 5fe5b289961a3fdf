// Package kerrors re-exports pkg/kerrors, the home of Kurma's error
// categories, for the packages that still import it from here. The values
// are the same sentinels, so errors.Is matches across both import paths.
// New code imports kurma.dev/kurma/pkg/kerrors.
//
// This package is a leaf apart from pkg/kerrors.
// Must not import: `kurma.dev/kurma/...` (except
// `kurma.dev/kurma/pkg/kerrors`).
package kerrors

import "kurma.dev/kurma/pkg/kerrors"

// The categories, identical to pkg/kerrors's.
var (
	NotFound     = kerrors.NotFound
	Conflict     = kerrors.Conflict
	Invalid      = kerrors.Invalid
	Unauthorized = kerrors.Unauthorized
	Unavailable  = kerrors.Unavailable
	Exhausted    = kerrors.Exhausted
	Timeout      = kerrors.Timeout
)

// New is pkg/kerrors.New.
func New(cat error, format string, args ...any) error { return kerrors.New(cat, format, args...) }

// HTTPStatus is pkg/kerrors.HTTPStatus.
func HTTPStatus(err error) int { return kerrors.HTTPStatus(err) }

// Type is pkg/kerrors.Type.
func Type(err error) string { return kerrors.Type(err) }

// FromType is pkg/kerrors.FromType.
func FromType(typ, msg string) error { return kerrors.FromType(typ, msg) }
