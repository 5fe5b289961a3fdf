package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"kurma.dev/kurma/internal/kerrors"
	"kurma.dev/kurma/internal/pod/podtypes"
	"kurma.dev/kurma/pkg/appc"
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

// ValidateSpec checks what the API can check of a pod spec without the
// image store: names, images given, environment names, volumes and mounts.
// The pod manager checks the rest (images exist, stager trust).
func ValidateSpec(s *podtypes.Spec) error {
	inv := func(format string, args ...any) error {
		return kerrors.New(kerrors.Invalid, format, args...)
	}
	if s.Name != "" && !ValidPodName(s.Name) {
		return inv("invalid pod name %q: use letters, digits, '_', '.', '-' (at most 63)", s.Name)
	}
	if len(s.Apps) == 0 {
		return inv("pod has no apps")
	}
	if opt := s.Reserved(); opt != "" {
		return inv("%s is reserved for the daemon's networking pod", opt)
	}
	vols := map[string]bool{}
	for i, v := range s.Volumes {
		if !appc.ValidACName(v.Name) {
			return inv("volume %d: invalid name %q (lower-case letters, digits, '-')", i, v.Name)
		}
		if vols[v.Name] {
			return inv("duplicate volume %q", v.Name)
		}
		vols[v.Name] = true
		switch v.Kind {
		case "empty":
			if v.Source != "" {
				return inv("volume %q: an empty volume has no source", v.Name)
			}
		case "host":
			if !strings.HasPrefix(v.Source, "/") || strings.ContainsRune(v.Source, 0) {
				return inv("volume %q: host source %q must be an absolute path", v.Name, v.Source)
			}
		default:
			return inv("volume %q: unknown kind %q (empty or host)", v.Name, v.Kind)
		}
	}
	apps := map[string]bool{}
	for i, a := range s.Apps {
		if a.Name != "" {
			if !appc.ValidACName(a.Name) {
				return inv("app %d: invalid name %q (lower-case letters, digits, '-')", i, a.Name)
			}
			if apps[a.Name] {
				return inv("duplicate app %q", a.Name)
			}
			apps[a.Name] = true
		}
		if strings.TrimSpace(a.Image) == "" {
			return inv("app %d: no image", i)
		}
		if len(a.Exec) > 0 && a.Exec[0] == "" {
			return inv("app %d: empty executable", i)
		}
		for _, e := range a.Env {
			if !appc.ValidEnvName(e.Name) {
				return inv("app %d: invalid environment variable name %q", i, e.Name)
			}
		}
		for _, m := range a.Mounts {
			if !vols[m.Volume] {
				return inv("app %d mounts unknown volume %q", i, m.Volume)
			}
			if !strings.HasPrefix(m.Path, "/") {
				return inv("app %d: mount path %q is not absolute", i, m.Path)
			}
		}
	}
	for _, n := range s.Networks {
		if strings.TrimSpace(n) == "" {
			return inv("empty network name")
		}
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
