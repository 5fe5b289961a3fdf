package podtypes

import (
	"strings"

	"kurma.dev/kurma/pkg/appc"
	"kurma.dev/kurma/pkg/kerrors"
)

// Validate checks everything about a spec that needs no host and no image
// store: the pod, volume, app and environment names, that each app has an
// image, the volumes' kinds and sources, the mounts, and the networks. It
// is the one validator of a spec: the CLI (for spec files), the API (for
// every request) and the pod manager (for every pod, the daemon's own
// included) call it, and add only what they alone can check (the API:
// daemon-only options; the pod manager: a host volume's source exists).
// Errors wrap kerrors.Invalid and name the field.
func (s *Spec) Validate() error {
	inv := func(format string, args ...any) error {
		return kerrors.New(kerrors.Invalid, format, args...)
	}
	if s.Name != "" && !ValidName(s.Name) {
		return inv("invalid pod name %q: use letters, digits, '_', '.', '-' (at most 63)", s.Name)
	}
	if len(s.Apps) == 0 {
		return inv("pod has no apps")
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
		if len(s.Networks) > 1 && (n == "host" || n == "none") {
			return inv("network %q cannot be combined with others", n)
		}
	}
	return nil
}
