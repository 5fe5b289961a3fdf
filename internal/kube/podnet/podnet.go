package podnet

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"

	"kurma.dev/kurma/pkg/kerrors"
)

// Annotation is the pod annotation key the watcher writes.
const Annotation = "kurma.dev/pod-networks"

// HostIDAnnotation is the Node annotation through which a node's agent
// announces its controller host id when it differs from the Node name.
const HostIDAnnotation = "kurma.dev/host-id"

// PortOwner is the device_owner of every port the watcher makes for a pod.
const PortOwner = "kurma.dev/k8s-watcher"

// PortID is the id of the controller port the watcher makes for the pod
// with this UID (its device_id is the UID, its owner PortOwner).
func PortID(podUID string) string { return "pod-" + podUID }

// DefaultNetwork is the key of the pod's primary interface.
const DefaultNetwork = "default"

// MaxSize bounds an encoded annotation (one network takes ~400 bytes).
const MaxSize = 16 << 10

// Route is one route of the pod's interface; NextHop empty means on-link.
// The field names follow OVN-Kubernetes ("dest", "nextHop").
type Route struct {
	Dest    string `json:"dest"`
	NextHop string `json:"nextHop,omitempty"`
}

// Network is the port of one pod interface.
type Network struct {
	// PortID, ProjectID and SubnetID name the controller port.
	PortID    string `json:"port_id"`
	ProjectID string `json:"project_id"`
	SubnetID  string `json:"subnet_id"`
	// MAC is the port's MAC address (the pod interface's).
	MAC string `json:"mac_address"`
	// IPs are the pod's addresses with the subnet's prefix length,
	// e.g. "10.32.0.5/16".
	IPs []string `json:"ip_addresses"`
	// Gateways are the default gateways, one per address family at most.
	Gateways []string `json:"gateway_ips,omitempty"`
	// Routes are extra routes; a default route via each gateway is
	// implied and not listed.
	Routes []Route `json:"routes,omitempty"`
	// PodUID is the UID of the pod the port was made for: a pod that
	// comes back under the same name (a StatefulSet) has another UID and
	// must not use this port.
	PodUID string `json:"pod_uid"`
	// HostID is the port's binding:host_id (the node agent's host id).
	HostID string `json:"host_id"`
}

// Networks is the annotation's value: interfaces by network name.
type Networks map[string]Network

// Default returns the primary interface's network.
func (ns Networks) Default() (Network, bool) {
	n, ok := ns[DefaultNetwork]
	return n, ok
}

// Prefixes returns the parsed IPs (valid after Validate).
func (n Network) Prefixes() []netip.Prefix {
	out := make([]netip.Prefix, 0, len(n.IPs))
	for _, s := range n.IPs {
		if p, err := netip.ParsePrefix(s); err == nil {
			out = append(out, p)
		}
	}
	return out
}

// HardwareAddr returns the parsed MAC (valid after Validate).
func (n Network) HardwareAddr() net.HardwareAddr {
	m, _ := net.ParseMAC(n.MAC)
	return m
}

func invalid(field, format string, args ...any) error {
	return kerrors.New(kerrors.Invalid, "%s: %s", field, fmt.Sprintf(format, args...))
}

// validWord checks an id: 1-128 characters of letters, digits and
// ".-_:" (the controller's id alphabet).
func validWord(field, s string) error {
	if s == "" || len(s) > 128 {
		return invalid(field, "want 1-128 characters, got %d", len(s))
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune(".-_:", c)) {
			return invalid(field, "%q: only letters, digits, '.', '-', '_', ':' allowed", s)
		}
	}
	return nil
}

// validName checks a network name: a DNS-1123 label.
func validName(s string) error {
	if s == "" || len(s) > 63 {
		return invalid("network name", "%q: want 1-63 characters", s)
	}
	for i, c := range s {
		ok := c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' && i > 0 && i < len(s)-1
		if !ok {
			return invalid("network name", "%q: want a DNS label (a-z, 0-9, '-')", s)
		}
	}
	return nil
}

// Validate checks every field of one network; field names in errors are
// prefixed with name.
func (n Network) Validate(name string) error {
	f := func(s string) string { return name + "." + s }
	for _, w := range []struct{ field, v string }{{"port_id", n.PortID}, {"project_id", n.ProjectID},
		{"subnet_id", n.SubnetID}, {"pod_uid", n.PodUID}, {"host_id", n.HostID}} {
		if err := validWord(f(w.field), w.v); err != nil {
			return err
		}
	}
	mac, err := net.ParseMAC(n.MAC)
	if err != nil || len(mac) != 6 || mac[0]&1 != 0 || bytes.Equal(mac, make([]byte, 6)) {
		return invalid(f("mac_address"), "%q is not a unicast ethernet address", n.MAC)
	}
	if len(n.IPs) == 0 || len(n.IPs) > 2 {
		return invalid(f("ip_addresses"), "want 1 or 2 addresses, got %d", len(n.IPs))
	}
	var pfx []netip.Prefix
	for _, s := range n.IPs {
		p, err := netip.ParsePrefix(s)
		if err != nil || p.Addr().Zone() != "" || p.Addr().Is4In6() {
			return invalid(f("ip_addresses"), "%q: want address/prefix", s)
		}
		if p.Addr() == p.Masked().Addr() && p.Bits() < p.Addr().BitLen()-1 {
			return invalid(f("ip_addresses"), "%q is its network's address", s)
		}
		for _, q := range pfx {
			if q.Addr().Is4() == p.Addr().Is4() {
				return invalid(f("ip_addresses"), "two addresses of one family (%s, %s)", q, p)
			}
		}
		pfx = append(pfx, p)
	}
	if len(n.Gateways) > len(pfx) {
		return invalid(f("gateway_ips"), "%d gateways for %d addresses", len(n.Gateways), len(pfx))
	}
	var gws []netip.Addr
	for _, s := range n.Gateways {
		g, err := netip.ParseAddr(s)
		if err != nil || g.Zone() != "" || g.Is4In6() {
			return invalid(f("gateway_ips"), "%q is not an address", s)
		}
		if !slices.ContainsFunc(pfx, func(p netip.Prefix) bool { return p.Contains(g) && p.Addr() != g }) {
			return invalid(f("gateway_ips"), "%s is not a neighbour inside %v", g, n.IPs)
		}
		if slices.ContainsFunc(gws, func(o netip.Addr) bool { return o.Is4() == g.Is4() }) {
			return invalid(f("gateway_ips"), "two gateways of one family")
		}
		gws = append(gws, g)
	}
	if len(n.Routes) > 64 {
		return invalid(f("routes"), "%d routes: at most 64", len(n.Routes))
	}
	for i, r := range n.Routes {
		d, err := netip.ParsePrefix(r.Dest)
		if err != nil || d.Masked() != d || d.Addr().Zone() != "" {
			return invalid(f(fmt.Sprintf("routes[%d].dest", i)), "%q: want a network prefix", r.Dest)
		}
		if r.NextHop == "" {
			continue
		}
		h, err := netip.ParseAddr(r.NextHop)
		if err != nil || h.Is4() != d.Addr().Is4() || h.Zone() != "" {
			return invalid(f(fmt.Sprintf("routes[%d].nextHop", i)), "%q: want an address of the destination's family", r.NextHop)
		}
		if !slices.ContainsFunc(pfx, func(p netip.Prefix) bool { return p.Contains(h) }) {
			return invalid(f(fmt.Sprintf("routes[%d].nextHop", i)), "%s is not reachable on-link from %v", h, n.IPs)
		}
	}
	return nil
}

// Validate checks every network; the default one must be present.
func (ns Networks) Validate() error {
	if _, ok := ns[DefaultNetwork]; !ok {
		return invalid(Annotation, "no %q network", DefaultNetwork)
	}
	if len(ns) > 8 {
		return invalid(Annotation, "%d networks: at most 8", len(ns))
	}
	for name, n := range ns {
		if err := validName(name); err != nil {
			return err
		}
		if err := n.Validate(name); err != nil {
			return err
		}
	}
	return nil
}

// Encode validates ns and returns the annotation's value.
func Encode(ns Networks) (string, error) {
	if err := ns.Validate(); err != nil {
		return "", err
	}
	b, err := json.Marshal(ns)
	if err != nil {
		return "", fmt.Errorf("encode %s: %w", Annotation, err)
	}
	if len(b) > MaxSize {
		return "", invalid(Annotation, "%d bytes: at most %d", len(b), MaxSize)
	}
	return string(b), nil
}

// Decode parses and validates an annotation value. Unknown fields,
// duplicate keys and trailing data are errors.
func Decode(s string) (Networks, error) {
	if len(s) > MaxSize {
		return nil, invalid(Annotation, "%d bytes: at most %d", len(s), MaxSize)
	}
	if err := noDuplicateKeys(s); err != nil {
		return nil, err
	}
	dec := json.NewDecoder(strings.NewReader(s))
	dec.DisallowUnknownFields()
	var ns Networks
	if err := dec.Decode(&ns); err != nil {
		return nil, invalid(Annotation, "%v", err)
	}
	if dec.More() {
		return nil, invalid(Annotation, "trailing data after the JSON object")
	}
	if ns == nil {
		return nil, invalid(Annotation, "want a JSON object")
	}
	if err := ns.Validate(); err != nil {
		return nil, err
	}
	for k, n := range ns { // one spelling of "none": nil
		if len(n.Gateways) == 0 {
			n.Gateways = nil
		}
		if len(n.Routes) == 0 {
			n.Routes = nil
		}
		ns[k] = n
	}
	return ns, nil
}

// noDuplicateKeys rejects objects that repeat a key (encoding/json keeps
// the last one silently, so two readers could disagree).
func noDuplicateKeys(s string) error {
	dec := json.NewDecoder(strings.NewReader(s))
	type frame struct {
		obj  bool
		keys map[string]bool
		key  bool // next string token is a key
	}
	var stack []*frame
	for {
		tok, err := dec.Token()
		if err != nil {
			return nil // syntax errors are reported by the real decode
		}
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		switch t := tok.(type) {
		case json.Delim:
			switch t {
			case '{', '[':
				if top != nil && top.obj {
					top.key = true
				}
				stack = append(stack, &frame{obj: t == '{', keys: map[string]bool{}, key: t == '{'})
				continue
			case '}', ']':
				stack = stack[:len(stack)-1]
				if len(stack) == 0 {
					return nil
				}
				continue
			}
		case string:
			if top != nil && top.obj && top.key {
				if top.keys[t] {
					return invalid(Annotation, "duplicate key %q", t)
				}
				top.keys[t] = true
				top.key = false
				continue
			}
		}
		if top != nil && top.obj {
			top.key = true
		}
	}
}
