package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"reflect"
	"strings"

	"github.com/google/uuid"

	"kurma.dev/kurma/internal/controller/ipam"
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

// validID accepts ids safe as store key segments: 1-128 of [A-Za-z0-9._:-].
func validID(kind, id string) error {
	if id == "" || len(id) > 128 {
		return kerrors.New(kerrors.Invalid, "%s id %q: want 1-128 characters", kind, id)
	}
	for _, c := range id {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-' || c == ':'
		if !ok {
			return kerrors.New(kerrors.Invalid, "%s id %q: only letters, digits, '.', '_', '-', ':' allowed", kind, id)
		}
	}
	if id == "." || id == ".." {
		return kerrors.New(kerrors.Invalid, "%s id %q not allowed", kind, id)
	}
	return nil
}

// idOrNew validates a client-chosen id or generates one. Generated ids
// are time-ordered UUIDs (v7) so new keys append to the store's B+tree
// instead of dirtying random pages.
func idOrNew(kind, id string) (string, error) {
	if id == "" {
		u, err := uuid.NewV7()
		if err != nil {
			return uuid.NewString(), nil
		}
		return u.String(), nil
	}
	return id, validID(kind, id)
}

func checkLen(field, v string, max int) error {
	if len(v) > max {
		return kerrors.New(kerrors.Invalid, "%s longer than %d bytes", field, max)
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

var vnicTypes = map[string]bool{"": true, "normal": true, "macvtap": true, "direct": true, "baremetal": true, "smart-nic": true, "direct-physical": true, "virtio-forwarder": true}

// normalizePort validates the caller-settable fields of p (in project pid)
// and fills defaults; it does not resolve references.
func normalizePort(pid string, p *capi.Port) error {
	var err error
	if p.ID, err = idOrNew("port", p.ID); err != nil {
		return err
	}
	if p.ProjectID != "" && p.ProjectID != pid {
		return kerrors.New(kerrors.Invalid, "port %s: project_id %q does not match the URL's project %q", p.ID, p.ProjectID, pid)
	}
	if p.TenantID != "" && p.TenantID != pid {
		return kerrors.New(kerrors.Invalid, "port %s: tenant_id %q does not match the URL's project %q", p.ID, p.TenantID, pid)
	}
	p.ProjectID = pid
	if p.NetworkID == "" {
		return kerrors.New(kerrors.Invalid, "port %s: network_id is required", p.ID)
	}
	if err := validID("network", p.NetworkID); err != nil {
		return fmt.Errorf("port %s: %w", p.ID, err)
	}
	for _, c := range []struct {
		f, v string
		max  int
	}{{"name", p.Name, 255}, {"description", p.Description, 1024}, {"device_id", p.DeviceID, 255}, {"device_owner", p.DeviceOwner, 255},
		{"network_ns", p.NetworkNS, 4096}, {"veth_namespace", p.VethNamespace, 4096}, {"dns_domain", p.DNSDomain, 255}, {"dns_name", p.DNSName, 255}, {"binding:host_id", p.BindingHostID, 255}} {
		if err := checkLen(c.f, c.v, c.max); err != nil {
			return fmt.Errorf("port %s: %w", p.ID, err)
		}
	}
	if strings.ContainsAny(p.Name, "/\x00") || strings.ContainsAny(p.DeviceID, "/\x00") || strings.ContainsAny(p.BindingHostID, "/\x00") {
		return kerrors.New(kerrors.Invalid, "port %s: name, device_id and binding:host_id must not contain '/' or NUL", p.ID)
	}
	if p.VethName != "" {
		if len(p.VethName) > 15 || strings.ContainsAny(p.VethName, "/ \t\n\x00:") || p.VethName == "." || p.VethName == ".." {
			return kerrors.New(kerrors.Invalid, "port %s: veth_name %q is not a valid interface name", p.ID, p.VethName)
		}
	}
	if p.NetworkNS != "" && p.VethNamespace != "" && p.NetworkNS != p.VethNamespace {
		return kerrors.New(kerrors.Invalid, "port %s: network_ns and veth_namespace differ", p.ID)
	}
	if p.NetworkNS == "" {
		p.NetworkNS = p.VethNamespace
	}
	p.VethNamespace = p.NetworkNS
	if !vnicTypes[p.BindingVNICType] {
		return kerrors.New(kerrors.Invalid, "port %s: binding:vnic_type %q unknown", p.ID, p.BindingVNICType)
	}
	if p.BindingVNICType == "" {
		p.BindingVNICType = "normal"
	}
	if len(p.BindingProfile) > 0 {
		t := bytes.TrimSpace(p.BindingProfile)
		if bytes.Equal(t, []byte("null")) {
			p.BindingProfile = nil
		} else if len(t) == 0 || t[0] != '{' {
			return kerrors.New(kerrors.Invalid, "port %s: binding:profile must be an object or null", p.ID)
		} else {
			var c bytes.Buffer
			if err := json.Compact(&c, t); err != nil {
				return kerrors.New(kerrors.Invalid, "port %s: binding:profile: %v", p.ID, err)
			}
			p.BindingProfile = c.Bytes()
		}
	}
	if p.AdminStateUp == nil {
		t := true
		p.AdminStateUp = &t
	}
	var pairs []capi.AddressPair
	for _, ap := range p.AllowedAddressPairs {
		if ap.IPAddress == "" && ap.MACAddress == "" {
			continue // spec 003 sends [{}]
		}
		if _, err := netip.ParseAddr(ap.IPAddress); err != nil {
			if _, err := netip.ParsePrefix(ap.IPAddress); err != nil {
				return kerrors.New(kerrors.Invalid, "port %s: allowed_address_pairs ip_address %q", p.ID, ap.IPAddress)
			}
		}
		if ap.MACAddress != "" {
			m, err := ipam.ParseMAC(ap.MACAddress)
			if err != nil {
				return fmt.Errorf("port %s: allowed_address_pairs: %w", p.ID, err)
			}
			ap.MACAddress = m
		}
		pairs = append(pairs, ap)
	}
	p.AllowedAddressPairs = pairs
	if p.MACAddress != "" {
		m, err := ipam.ParseMAC(p.MACAddress)
		if err != nil {
			return fmt.Errorf("port %s: %w", p.ID, err)
		}
		p.MACAddress = m
	}
	if len(p.FixedIPs) > 1 {
		return kerrors.New(kerrors.Invalid, "port %s: at most one fixed_ips entry is supported", p.ID)
	}
	for i := range p.FixedIPs {
		f := &p.FixedIPs[i]
		f.CIDR, f.GatewayIP = "", ""
		if f.SubnetID != "" {
			if err := validID("subnet", f.SubnetID); err != nil {
				return fmt.Errorf("port %s: fixed_ips: %w", p.ID, err)
			}
		}
	}
	// Output-only fields are ignored on input.
	p.Status, p.StatusReason, p.VPCID, p.VNI, p.RevisionNumber = capi.StatusPending, "", "", 0, 0
	return nil
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
