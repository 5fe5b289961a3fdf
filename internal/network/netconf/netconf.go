package netconf

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"strings"

	"kurma.dev/kurma/pkg/kerrors"
)

// Keys of a pod_networks entry that belong to Kurma. They are removed from
// the plugin's configuration; everything else (including "name", which CNI
// plugins need too) is passed to the plugin untouched.
const (
	KeyName               = "name"
	KeyACI                = "aci"
	KeyDefault            = "default"
	KeyContainerInterface = "containerInterface"
)

// Reserved network names: a pod spec uses them to ask for the host's network
// namespace or for loopback only (see pod.Spec.Networks).
const (
	NetworkHost = "host"
	NetworkNone = "none"
)

// MaxNameLen bounds a network name; names end up in cache file names and
// log lines.
const MaxNameLen = 64

// IsToken reports whether s is non-empty, starts with an ASCII letter or
// digit, and holds only letters, digits and the bytes in extra. It replaces
// regular expressions so that the plugin binaries start fast.
func IsToken(s, extra string) bool {
	if s == "" || !isAlnum(s[0]) {
		return false
	}
	for i := 1; i < len(s); i++ {
		if !isAlnum(s[i]) && strings.IndexByte(extra, s[i]) < 0 {
			return false
		}
	}
	return true
}

func isAlnum(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
}

// Network is one validated entry of pod_networks.
type Network struct {
	// Name is unique among the daemon's networks.
	Name string
	// ACI locates the plugin image: file://, http(s)://, docker:// or a
	// bare image name.
	ACI string
	// Default networks are attached when a pod asks for none.
	Default bool
	// ContainerInterface is the template text as configured; empty when the
	// plugin needs no interface name (loopback-like plugins).
	ContainerInterface string
	// Interface is ContainerInterface compiled; nil when it is empty.
	Interface *IfaceTemplate
	// Config is the JSON object given to the plugin on stdin: the entry
	// without Kurma's own keys (aci, default, containerInterface).
	Config json.RawMessage
}

// ValidateName reports whether s may name a network.
func ValidateName(s string) error {
	switch {
	case s == "":
		return kerrors.New(kerrors.Invalid, "network name is empty")
	case len(s) > MaxNameLen:
		return kerrors.New(kerrors.Invalid, "network name %.20q... is longer than %d bytes", s, MaxNameLen)
	case s == NetworkHost || s == NetworkNone:
		return kerrors.New(kerrors.Invalid, "network name %q is reserved", s)
	case !IsToken(s, "_.-"):
		return kerrors.New(kerrors.Invalid, "network name %q may hold only letters, digits, '_', '.' and '-' and must start with a letter or digit", s)
	}
	return nil
}

// ValidateACI reports whether s is an image URI Kurma can fetch: file://
// with an absolute path, http(s):// with a host, docker:// with a
// repository, or a bare image name such as "kurma.dev/netplugin:1.0".
func ValidateACI(s string) error {
	if s == "" {
		return kerrors.New(kerrors.Invalid, "missing image (\"aci\")")
	}
	if !strings.Contains(s, "://") {
		if len(s) > 512 || !IsToken(s, "._/:@-") {
			return kerrors.New(kerrors.Invalid, "image %q is neither a URI nor a valid image name", s)
		}
		return nil
	}
	u, err := url.Parse(s)
	if err != nil {
		return kerrors.New(kerrors.Invalid, "image URI %q: %v", s, err)
	}
	switch u.Scheme {
	case "file":
		if u.Host != "" || !strings.HasPrefix(u.Path, "/") {
			return kerrors.New(kerrors.Invalid, "image URI %q: file:// needs an absolute path (file:///path/to/image.aci)", s)
		}
	case "http", "https":
		if u.Host == "" {
			return kerrors.New(kerrors.Invalid, "image URI %q has no host", s)
		}
	case "docker":
		if strings.Trim(u.Host+u.Path, "/") == "" {
			return kerrors.New(kerrors.Invalid, "image URI %q names no repository", s)
		}
	default:
		return kerrors.New(kerrors.Invalid, "image URI %q: unsupported scheme %q (want file, http, https or docker)", s, u.Scheme)
	}
	return nil
}

// ParseConfig extracts and parses the pod_networks list (or podNetworks)
// from the daemon's configuration document. A document with neither key
// yields no networks and no error; giving both is an error.
func ParseConfig(config []byte) ([]Network, error) {
	var doc struct {
		Snake json.RawMessage `json:"pod_networks"`
		Camel json.RawMessage `json:"podNetworks"`
	}
	if err := strictObject(config, &doc); err != nil {
		return nil, kerrors.New(kerrors.Invalid, "daemon config: %v", err)
	}
	raw := doc.Snake
	if isNull(raw) {
		raw = doc.Camel
	} else if !isNull(doc.Camel) {
		return nil, kerrors.New(kerrors.Invalid, "daemon config: give pod_networks or podNetworks, not both")
	}
	if isNull(raw) {
		return nil, nil
	}
	var entries []json.RawMessage
	if err := json.Unmarshal(raw, &entries); err != nil {
		return nil, kerrors.New(kerrors.Invalid, "pod_networks: want a list of objects: %v", err)
	}
	return Parse(entries)
}

// Parse validates a list of pod_networks entries. Names must be unique.
// Every error names the offending entry (by name, or by index when the name
// is missing).
func Parse(entries []json.RawMessage) ([]Network, error) {
	nets := make([]Network, 0, len(entries))
	seen := make(map[string]int, len(entries))
	for i, e := range entries {
		n, err := ParseEntry(e)
		if err != nil {
			return nil, fmt.Errorf("pod_networks[%d]%s: %w", i, nameHint(e), err)
		}
		if j, dup := seen[n.Name]; dup {
			return nil, fmt.Errorf("pod_networks[%d] %q: %w", i, n.Name,
				kerrors.New(kerrors.Conflict, "duplicate network name (also pod_networks[%d])", j))
		}
		seen[n.Name] = i
		nets = append(nets, n)
	}
	return nets, nil
}

// ParseEntry validates one pod_networks entry.
func ParseEntry(entry []byte) (Network, error) {
	var fields map[string]json.RawMessage
	if err := strictObject(entry, &fields); err != nil {
		return Network{}, kerrors.New(kerrors.Invalid, "entry: %v", err)
	}
	var n Network
	if err := stringField(fields, KeyName, &n.Name); err != nil {
		return Network{}, err
	}
	if err := ValidateName(n.Name); err != nil {
		return Network{}, err
	}
	if err := stringField(fields, KeyACI, &n.ACI); err != nil {
		return Network{}, err
	}
	if err := ValidateACI(n.ACI); err != nil {
		return Network{}, err
	}
	if raw, ok := fields[KeyDefault]; ok && !isNull(raw) {
		if err := json.Unmarshal(raw, &n.Default); err != nil {
			return Network{}, kerrors.New(kerrors.Invalid, "%q must be true or false", KeyDefault)
		}
	}
	if err := stringField(fields, KeyContainerInterface, &n.ContainerInterface); err != nil {
		return Network{}, err
	}
	if n.ContainerInterface != "" {
		t, err := CompileIface(n.ContainerInterface)
		if err != nil {
			return Network{}, fmt.Errorf("%q: %w", KeyContainerInterface, err)
		}
		n.Interface = t
	}
	if err := checkPluginConfig(fields); err != nil {
		return Network{}, err
	}
	delete(fields, KeyACI)
	delete(fields, KeyDefault)
	delete(fields, KeyContainerInterface)
	cfg, err := json.Marshal(fields)
	if err != nil {
		return Network{}, kerrors.New(kerrors.Invalid, "re-encode plugin config: %v", err)
	}
	n.Config = cfg
	return n, nil
}

// checkPluginConfig checks the few CNI keys Kurma relies on: a plugin type
// (or a conflist-style "plugins" chain) must be named, and cniVersion, when
// given, must be a string.
func checkPluginConfig(fields map[string]json.RawMessage) error {
	var typ, ver string
	if err := stringField(fields, "type", &typ); err != nil {
		return err
	}
	if err := stringField(fields, "cniVersion", &ver); err != nil {
		return err
	}
	raw, chained := fields["plugins"]
	if chained && !isNull(raw) {
		var plugins []map[string]json.RawMessage
		if err := json.Unmarshal(raw, &plugins); err != nil {
			return kerrors.New(kerrors.Invalid, "\"plugins\" must be a list of objects")
		}
		if len(plugins) == 0 {
			return kerrors.New(kerrors.Invalid, "\"plugins\" is empty")
		}
		for i, p := range plugins {
			var pt string
			if err := stringField(p, "type", &pt); err != nil || pt == "" {
				return kerrors.New(kerrors.Invalid, "plugins[%d] has no \"type\"", i)
			}
		}
		return nil
	}
	if typ == "" {
		return kerrors.New(kerrors.Invalid, "no plugin \"type\" (or \"plugins\" chain) in the network config")
	}
	return nil
}

func stringField(fields map[string]json.RawMessage, key string, dst *string) error {
	raw, ok := fields[key]
	if !ok || isNull(raw) {
		return nil
	}
	if err := json.Unmarshal(raw, dst); err != nil {
		return kerrors.New(kerrors.Invalid, "%q must be a string", key)
	}
	return nil
}

// strictObject decodes b, which must be exactly one JSON object.
func strictObject(b []byte, dst any) error {
	b = bytes.TrimSpace(b)
	if len(b) == 0 || b[0] != '{' {
		return fmt.Errorf("want a JSON object")
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(dst); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return fmt.Errorf("trailing data after the JSON object")
	}
	return nil
}

func isNull(raw json.RawMessage) bool {
	s := bytes.TrimSpace(raw)
	return len(s) == 0 || string(s) == "null"
}

// nameHint returns ` "name"` for error messages when the entry has a
// readable name.
func nameHint(entry []byte) string {
	var v struct {
		Name string `json:"name"`
	}
	if json.Unmarshal(entry, &v) == nil && v.Name != "" && len(v.Name) <= MaxNameLen {
		return fmt.Sprintf(" %q", v.Name)
	}
	return ""
}
