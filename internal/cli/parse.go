package cli

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"kurma.dev/kurma/pkg/appc"
	"kurma.dev/kurma/pkg/kerrors"
)

// ParseVolume parses a --volume value: "HOST:/path[:ro|rw]" where HOST is
// an absolute host path (a host volume), or "NAME:/path[:ro|rw]" (a named
// empty volume), or "/path" alone (an anonymous empty volume named after
// its index). It returns the volume and the app's mount.
func ParseVolume(s string, index int) (appc.Volume, appc.Mount, error) {
	inv := func(format string, args ...any) (appc.Volume, appc.Mount, error) {
		return appc.Volume{}, appc.Mount{}, kerrors.New(kerrors.Invalid, "--volume %q: "+format, append([]any{s}, args...)...)
	}
	parts := strings.Split(s, ":")
	var src, dst, mode string
	switch len(parts) {
	case 1:
		dst = parts[0]
	case 2:
		src, dst = parts[0], parts[1]
	case 3:
		src, dst, mode = parts[0], parts[1], parts[2]
	default:
		return inv("want SRC:/path[:ro]")
	}
	if !strings.HasPrefix(dst, "/") || strings.ContainsRune(dst, 0) {
		return inv("the mount path must be absolute")
	}
	dst = filepath.Clean(dst)
	var ro *bool
	switch mode {
	case "":
	case "ro", "rw":
		b := mode == "ro"
		ro = &b
	default:
		return inv("unknown mode %q (ro or rw)", mode)
	}
	v := appc.Volume{ReadOnly: ro}
	switch {
	case src == "":
		if len(parts) == 2 || len(parts) == 3 {
			return inv("empty source")
		}
		v.Name, v.Kind = "vol"+strconv.Itoa(index), "empty"
	case strings.HasPrefix(src, "/"):
		if strings.ContainsRune(src, 0) {
			return inv("bad host path")
		}
		v.Name, v.Kind, v.Source = "vol"+strconv.Itoa(index), "host", filepath.Clean(src)
	default:
		if !appc.ValidACName(src) {
			return inv("volume name %q: use lower-case letters, digits and '-', or an absolute host path", src)
		}
		v.Name, v.Kind = src, "empty"
	}
	return v, appc.Mount{Volume: v.Name, Path: dst}, nil
}

// ParseEnv parses --env values: "NAME=value", or "NAME" to copy the
// variable from kurma's own environment (skipped when unset).
func ParseEnv(vals []string) ([]appc.EnvVar, error) {
	var out []appc.EnvVar
	for _, kv := range vals {
		name, val, ok := strings.Cut(kv, "=")
		if !appc.ValidEnvName(name) {
			return nil, kerrors.New(kerrors.Invalid, "--env %q: invalid variable name %q", kv, name)
		}
		if !ok {
			v, set := os.LookupEnv(name)
			if !set {
				continue
			}
			val = v
		}
		out = append(out, appc.EnvVar{Name: name, Value: val})
	}
	return out, nil
}

// ParseUser splits "user[:group]".
func ParseUser(s string) (user, group string) {
	user, group, _ = strings.Cut(s, ":")
	return user, group
}

// parseNets splits repeated, comma-separated --net values.
func parseNets(vals []string) ([]string, error) {
	var out []string
	for _, v := range vals {
		for _, n := range strings.Split(v, ",") {
			n = strings.TrimSpace(n)
			if n == "" {
				return nil, fmt.Errorf("--net %q: empty network name: %w", v, kerrors.Invalid)
			}
			out = append(out, n)
		}
	}
	return out, nil
}
