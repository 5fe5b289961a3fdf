package netconf

import (
	"fmt"

	"kurma.dev/kurma/pkg/kerrors"
)

// Select returns the networks a pod is attached to, in order: the named
// ones when names is non-empty, else every default network. The reserved
// names "host" and "none" are the caller's business and are rejected here.
// An unknown or repeated name is an error (NotFound, Invalid).
func Select(nets []Network, names []string) ([]Network, error) {
	if len(names) == 0 {
		var out []Network
		for _, n := range nets {
			if n.Default {
				out = append(out, n)
			}
		}
		return out, nil
	}
	byName := make(map[string]int, len(nets))
	for i, n := range nets {
		byName[n.Name] = i
	}
	out := make([]Network, 0, len(names))
	seen := make(map[string]bool, len(names))
	for _, name := range names {
		if name == NetworkHost || name == NetworkNone {
			return nil, kerrors.New(kerrors.Invalid, "network %q cannot be combined with other networks", name)
		}
		if seen[name] {
			return nil, kerrors.New(kerrors.Invalid, "network %q is listed twice", name)
		}
		seen[name] = true
		i, ok := byName[name]
		if !ok {
			return nil, kerrors.New(kerrors.NotFound, "network %q is not configured", name)
		}
		out = append(out, nets[i])
	}
	return out, nil
}

// InterfaceNames renders the containerInterface of each network for one pod,
// in order, checking every name against "lo" and the names rendered before
// it. A network without containerInterface gets "" (add/del then receive
// no interface argument). opts.Index and opts.Network are set per network;
// opts.Existing is extended with "lo" and the earlier names.
func InterfaceNames(nets []Network, opts RenderOptions) ([]string, error) {
	existing := append([]string{"lo"}, opts.Existing...)
	out := make([]string, len(nets))
	for i, n := range nets {
		if n.Interface == nil {
			continue
		}
		o := opts
		o.Index, o.Network, o.Existing = i, n.Name, existing
		name, err := n.Interface.Render(o)
		if err != nil {
			return nil, fmt.Errorf("network %q: %w", n.Name, err)
		}
		out[i] = name
		existing = append(existing, name)
	}
	return out, nil
}
