package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/netip"
	"reflect"
	"strings"

	"kurma.dev/kurma/internal/controller/core"
	capi "kurma.dev/kurma/pkg/controllerapi"
	"kurma.dev/kurma/pkg/kerrors"
)

// maxBody bounds request bodies (a bulk of a few thousand ports fits).
const maxBody = 16 << 20

// maxBulk bounds the ports of one bulk create.
const maxBulk = 5000

// readBody reads a request body within the size limit.
func readBody(r *http.Request) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	if err != nil {
		return nil, kerrors.New(kerrors.Invalid, "read body: %v", err)
	}
	if len(b) > maxBody {
		return nil, kerrors.New(kerrors.Invalid, "body larger than %d bytes", maxBody)
	}
	return b, nil
}

// decodeStrict decodes exactly one JSON value into v, rejecting unknown
// fields (the error names the field) and trailing data.
func decodeStrict(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var se *json.SyntaxError
		var te *json.UnmarshalTypeError
		switch {
		case errors.As(err, &se):
			return kerrors.New(kerrors.Invalid, "bad JSON at offset %d: %v", se.Offset, err)
		case errors.As(err, &te):
			return kerrors.New(kerrors.Invalid, "bad JSON: field %q: want %s, got %s", te.Field, te.Type, te.Value)
		case errors.Is(err, io.EOF):
			return kerrors.New(kerrors.Invalid, "empty body")
		}
		return kerrors.New(kerrors.Invalid, "bad JSON: %s", strings.TrimPrefix(err.Error(), "json: "))
	}
	if dec.More() {
		return kerrors.New(kerrors.Invalid, "trailing data after the JSON body")
	}
	if _, err := dec.Token(); err != io.EOF {
		return kerrors.New(kerrors.Invalid, "trailing data after the JSON body")
	}
	return nil
}

// portsRequest is the body of POST project/<pid>/ports: exactly one of
// port and ports.
type portsRequest struct {
	Port  *capi.Port  `json:"port"`
	Ports []capi.Port `json:"ports"`
}

// DecodePorts parses a single or bulk port-create body; bulk reports
// whether it was {"ports":[...]}. Unknown keys are rejected (400).
func DecodePorts(b []byte) (ports []capi.Port, bulk bool, err error) {
	var req portsRequest
	if err := decodeStrict(b, &req); err != nil {
		return nil, false, err
	}
	switch {
	case req.Port != nil && req.Ports != nil:
		return nil, false, kerrors.New(kerrors.Invalid, `give "port" or "ports", not both`)
	case req.Port != nil:
		return []capi.Port{*req.Port}, false, nil
	case req.Ports != nil:
		if len(req.Ports) == 0 {
			return nil, true, kerrors.New(kerrors.Invalid, `"ports" is empty`)
		}
		if len(req.Ports) > maxBulk {
			return nil, true, kerrors.New(kerrors.Invalid, "bulk of %d ports exceeds %d", len(req.Ports), maxBulk)
		}
		return req.Ports, true, nil
	}
	return nil, false, kerrors.New(kerrors.Invalid, `body must be {"port":{...}} or {"ports":[...]}`)
}

// decodeWrapped decodes a body of the form {"<key>":{...}}, the Neutron-style
// envelope every single-object request uses, with decodeStrict's rules:
// unknown fields inside or beside the object are refused, and errors name
// fields by their full path ("vpc.name"). The envelope is a one-field struct
// built for key, so a missing object is told apart from an empty one.
func decodeWrapped[T any](b []byte, key string) (T, error) {
	var zero T
	envelope := reflect.StructOf([]reflect.StructField{{
		Name: "Object",
		Type: reflect.TypeFor[*T](),
		Tag:  reflect.StructTag(`json:"` + key + `"`),
	}})
	body := reflect.New(envelope)
	if err := decodeStrict(b, body.Interface()); err != nil {
		return zero, err
	}
	obj := body.Elem().Field(0)
	if obj.IsNil() {
		return zero, kerrors.New(kerrors.Invalid, "body must be {%q:{...}}", key)
	}
	return *obj.Interface().(*T), nil
}

// DecodeHost parses a PUT hosts/<id> body for host id.
func DecodeHost(id string, b []byte) (capi.Host, error) {
	h, err := decodeWrapped[capi.Host](b, "host")
	if err != nil {
		return capi.Host{}, err
	}
	if h.ID == "" {
		h.ID = id
	}
	if h.ID != id {
		return h, kerrors.New(kerrors.Invalid, "host id %q does not match the URL's %q", h.ID, id)
	}
	a, err := netip.ParseAddr(h.UnderlayIP)
	if err != nil {
		return h, kerrors.New(kerrors.Invalid, "underlay_ip %q: %v", h.UnderlayIP, err)
	}
	h.UnderlayIP = a.String()
	return h, nil
}

// DecodeStatus parses a PUT .../status body.
func DecodeStatus(b []byte) (capi.PortStatusUpdate, error) {
	var u capi.PortStatusUpdate
	if err := decodeStrict(b, &u); err != nil {
		return u, err
	}
	return u, core.ValidStatus(u)
}

// DecodeBinding parses a PUT .../binding body.
func DecodeBinding(b []byte) (capi.PortBindingUpdate, error) {
	var u capi.PortBindingUpdate
	if err := decodeStrict(b, &u); err != nil {
		return u, err
	}
	return u, core.ValidBinding(u)
}
