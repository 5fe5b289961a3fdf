// Package kerrors holds the few error categories every Kurma package shares.
//
// Errors inside Kurma are wrapped with %w as they travel up; code that needs
// to know what went wrong asks with errors.Is(err, kerrors.NotFound) and
// never compares error strings. Categories are mapped to HTTP status codes,
// CNI error codes or CLI exit codes only at those edges (see HTTPStatus).
//
// It lives under pkg/ so that users of the public packages (the controller
// client in pkg/controllerapi above all) can test the errors those return
// with errors.Is.
//
// This package is a leaf.
// Must not import: `kurma.dev/kurma/...`, `net/http`.
package kerrors

import (
	"errors"
	"fmt"
)

// HTTP status codes HTTPStatus returns, spelled out so that this leaf does
// not pull net/http (and crypto/tls with it) into every binary: the
// stager's call-ins start measurably faster without those package inits.
const (
	statusOK                  = 200
	statusBadRequest          = 400
	statusUnauthorized        = 401
	statusNotFound            = 404
	statusConflict            = 409
	statusInternalServerError = 500
	statusServiceUnavailable  = 503
	statusGatewayTimeout      = 504
)

// The categories. Each is a sentinel: wrap it, never return it bare when a
// more precise message can be given (use New or Wrap).
var (
	// NotFound: the named object (pod, image, port, subnet...) does not exist.
	NotFound = errors.New("not found")
	// Conflict: the object exists already, or the request clashes with
	// current state (duplicate name, address in use, stale revision).
	Conflict = errors.New("conflict")
	// Invalid: the caller's input is malformed or violates a rule.
	Invalid = errors.New("invalid argument")
	// Unauthorized: missing or wrong credentials.
	Unauthorized = errors.New("unauthorized")
	// Unavailable: a dependency is down or not ready; retrying may succeed.
	Unavailable = errors.New("unavailable")
	// Exhausted: a pool (addresses, MACs, ports) has nothing left to give.
	Exhausted = errors.New("resource exhausted")
	// Timeout: an operation did not finish within its limit.
	Timeout = errors.New("timed out")
)

// New returns an error in category cat with a formatted message. The
// category text is not repeated in the message: errors.Is finds it.
func New(cat error, format string, args ...any) error {
	return &catError{cat: cat, msg: fmt.Sprintf(format, args...)}
}

type catError struct {
	cat error
	msg string
}

func (e *catError) Error() string { return e.msg }
func (e *catError) Unwrap() error { return e.cat }

// HTTPStatus maps an error's category to an HTTP status code; errors of no
// category are 500.
func HTTPStatus(err error) int {
	switch {
	case err == nil:
		return statusOK
	case errors.Is(err, NotFound):
		return statusNotFound
	case errors.Is(err, Conflict), errors.Is(err, Exhausted):
		return statusConflict
	case errors.Is(err, Invalid):
		return statusBadRequest
	case errors.Is(err, Unauthorized):
		return statusUnauthorized
	case errors.Is(err, Unavailable):
		return statusServiceUnavailable
	case errors.Is(err, Timeout):
		return statusGatewayTimeout
	}
	return statusInternalServerError
}

// Type names the category for JSON error bodies ("NotFound", "Conflict"...);
// "Internal" when the error has none.
func Type(err error) string {
	for _, c := range []struct {
		cat  error
		name string
	}{
		{NotFound, "NotFound"}, {Conflict, "Conflict"}, {Invalid, "Invalid"},
		{Unauthorized, "Unauthorized"}, {Unavailable, "Unavailable"},
		{Exhausted, "Exhausted"}, {Timeout, "Timeout"},
	} {
		if errors.Is(err, c.cat) {
			return c.name
		}
	}
	return "Internal"
}

// FromType is the inverse of Type, used by API clients to rebuild a
// categorised error from a JSON error body.
func FromType(typ, msg string) error {
	cats := map[string]error{
		"NotFound": NotFound, "Conflict": Conflict, "Invalid": Invalid,
		"Unauthorized": Unauthorized, "Unavailable": Unavailable,
		"Exhausted": Exhausted, "Timeout": Timeout,
	}
	if c, ok := cats[typ]; ok {
		return &catError{cat: c, msg: msg}
	}
	return errors.New(msg)
}
