package netconf

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/types/create"

	"kurma.dev/kurma/pkg/kerrors"
)

// MaxResultSize bounds a plugin's stdout that ParseResult accepts.
const MaxResultSize = 1 << 20

// Result is Kurma's internal form of a plugin's add result: the current CNI
// result type. Results in older forms are converted into it.
type Result = current.Result

// ParseResult reads what a plugin's add printed on stdout. It accepts the
// Kurma spec's {"ip4": ..., "ip6": ...} form (CNI 0.1.0/0.2.0, with or
// without cniVersion), CNI 0.3.x/0.4.0 and CNI 1.x results, and converts
// them to the current CNI result.
func ParseResult(out []byte) (*Result, error) {
	out = bytes.TrimSpace(out)
	if len(out) == 0 {
		return nil, kerrors.New(kerrors.Invalid, "plugin result is empty")
	}
	if len(out) > MaxResultSize {
		return nil, kerrors.New(kerrors.Invalid, "plugin result is larger than %d bytes", MaxResultSize)
	}
	var probe map[string]json.RawMessage
	if err := strictObject(out, &probe); err != nil {
		return nil, kerrors.New(kerrors.Invalid, "plugin result: %v", err)
	}
	if _, hasCode := probe["code"]; hasCode {
		if _, hasMsg := probe["msg"]; hasMsg {
			if perr, ok := ParseError(out); ok {
				return nil, fmt.Errorf("plugin returned an error instead of a result: %w", perr)
			}
		}
	}
	ver, err := create.DecodeVersion(out)
	if err != nil {
		return nil, kerrors.New(kerrors.Invalid, "plugin result: %v", err)
	}
	r, err := create.Create(ver, out)
	if err != nil {
		return nil, kerrors.New(kerrors.Invalid, "plugin result (cniVersion %q): %v", ver, err)
	}
	res, err := current.NewResultFromResult(r)
	if err != nil {
		return nil, kerrors.New(kerrors.Invalid, "plugin result (cniVersion %q): convert: %v", ver, err)
	}
	if err := validateResult(res); err != nil {
		return nil, fmt.Errorf("plugin result (cniVersion %q): %w", ver, err)
	}
	return res, nil
}

// validateResult rejects results that decode but say nothing usable: an IP
// entry without an address, an interface index out of range, a route
// without a destination.
func validateResult(r *Result) error {
	for i, ip := range r.IPs {
		if ip == nil || ip.Address.IP == nil || ip.Address.Mask == nil {
			return kerrors.New(kerrors.Invalid, "ips[%d] has no address", i)
		}
		if ip.Interface != nil && (*ip.Interface < 0 || *ip.Interface >= len(r.Interfaces)) {
			return kerrors.New(kerrors.Invalid, "ips[%d] names interface %d of %d", i, *ip.Interface, len(r.Interfaces))
		}
	}
	for i, rt := range r.Routes {
		if rt == nil || rt.Dst.IP == nil {
			return kerrors.New(kerrors.Invalid, "routes[%d] has no destination", i)
		}
	}
	for i, ifc := range r.Interfaces {
		if ifc == nil || ifc.Name == "" {
			return kerrors.New(kerrors.Invalid, "interfaces[%d] has no name", i)
		}
	}
	return nil
}

// ParseError reads a CNI error object ({"code": N, "msg": ...}) from a
// plugin's output. ok is false when out is not one.
func ParseError(out []byte) (perr *types.Error, ok bool) {
	var e types.Error
	if err := strictObject(bytes.TrimSpace(out), &e); err != nil || (e.Code == 0 && e.Msg == "") {
		return nil, false
	}
	return &e, true
}
