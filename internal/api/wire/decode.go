package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"kurma.dev/kurma/internal/pod/podtypes"
	"kurma.dev/kurma/pkg/kerrors"
)

// MaxBodyBytes bounds every JSON request body.
const MaxBodyBytes = 1 << 20

// ValidPodName reports whether s may name a pod: letters, digits, '_', '.',
// '-', starting with a letter or digit, at most 63 bytes (names become
// directory and host names); see podtypes.ValidName.
func ValidPodName(s string) bool { return podtypes.ValidName(s) }

// DecodeJSON reads exactly one JSON value of at most MaxBodyBytes into v,
// refusing unknown fields and trailing data. Errors are kerrors.Invalid.
func DecodeJSON(r io.Reader, v any) error {
	data, err := io.ReadAll(io.LimitReader(r, MaxBodyBytes+1))
	if err != nil {
		return kerrors.New(kerrors.Invalid, "read request body: %v", err)
	}
	if len(data) > MaxBodyBytes {
		return kerrors.New(kerrors.Invalid, "request body larger than %d bytes", MaxBodyBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return kerrors.New(kerrors.Invalid, "decode request body: %v", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return kerrors.New(kerrors.Invalid, "decode request body: trailing data after JSON value")
	}
	return nil
}

// DecodeCreatePodRequest reads and checks the body of POST /v1/pods. Every
// error wraps kerrors.Invalid and names the offending field.
func DecodeCreatePodRequest(r io.Reader) (*CreatePodRequest, error) {
	var req CreatePodRequest
	if err := DecodeJSON(r, &req); err != nil {
		return nil, err
	}
	if err := ValidateSpec(&req.Spec); err != nil {
		return nil, err
	}
	if (req.Remove || req.Stdin) && !req.Wait {
		return nil, kerrors.New(kerrors.Invalid, "remove and stdin need wait")
	}
	return &req, nil
}

// ValidateSpec checks a pod spec a client sent: Spec.Validate (the one
// validator, which the pod manager runs too) and the daemon-only options no
// client may set. The pod manager checks the rest (images exist, stager
// trust, host volume sources exist).
func ValidateSpec(s *podtypes.Spec) error {
	if err := s.Validate(); err != nil {
		return err
	}
	if opt := s.Reserved(); opt != "" {
		return kerrors.New(kerrors.Invalid, "%s is reserved for the daemon's networking pod", opt)
	}
	return nil
}

// ErrorBodyOf renders err as the API's JSON error.
func ErrorBodyOf(err error) ErrorBody {
	b := ErrorBody{Error: ErrorInfo{Type: kerrors.Type(err), Message: err.Error()}}
	var ec interface{ ExitCode() int }
	if errors.As(err, &ec) {
		b.Error.ExitCode = ec.ExitCode()
	}
	return b
}

// ExitCodeError is a decoded error that carries the exit code a client
// should end with (ErrorInfo.ExitCode).
type ExitCodeError struct {
	Code int
	Err  error
}

func (e *ExitCodeError) Error() string { return e.Err.Error() }
func (e *ExitCodeError) Unwrap() error { return e.Err }
func (e *ExitCodeError) ExitCode() int { return e.Code }

// Err turns a decoded error body back into a categorised error.
func (e ErrorInfo) Err() error {
	if e.Message == "" {
		e.Message = fmt.Sprintf("%s error", e.Type)
	}
	err := kerrors.FromType(e.Type, e.Message)
	if e.ExitCode != 0 {
		return &ExitCodeError{Code: e.ExitCode, Err: err}
	}
	return err
}
