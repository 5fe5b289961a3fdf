package config

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"kurma.dev/kurma/internal/pod"
	"kurma.dev/kurma/pkg/kerrors"
)

// DefaultStateDir is the root of kurmad's on-disk state when no directory is
// configured.
const DefaultStateDir = "/var/lib/kurma"

// DefaultSocket is the API socket path when none is configured.
const DefaultSocket = "/run/kurma/kurma.sock"

// DefaultReadyTimeout bounds the wait for a stager's readiness.
const DefaultReadyTimeout = 60 * time.Second

// Config is kurmad's configuration.
type Config struct {
	// PodsDir holds one directory per pod (<PodsDir>/<uuid>).
	PodsDir string `json:"podsDir"`
	// ImagesDir is the image store's root.
	ImagesDir string `json:"imagesDir"`
	// VolumesDir holds the pods' empty volumes.
	VolumesDir string `json:"volumesDir"`
	// Socket is the API unix socket path; SocketGroup the group owning it
	// (name or number; empty: root).
	Socket      string `json:"socket"`
	SocketGroup string `json:"socketGroup,omitempty"`
	// StagerImage is the default stager image URI.
	StagerImage string `json:"stagerImage"`
	// TrustedKeys are paths of public keys trusted to sign stager images.
	TrustedKeys []string `json:"trustedKeys"`
	// StagerConfig is passed untouched into every stager manifest.
	StagerConfig json.RawMessage `json:"stagerConfig,omitempty"`
	// ReadyTimeout bounds the wait for a stager's readiness (Go duration
	// string in the file, e.g. "60s").
	ReadyTimeout Duration `json:"readyTimeout,omitempty"`
	// PrestartStager lets kurmad keep the default stager pre-started when
	// its image declares it may be (default true; docs/kurmad.md).
	PrestartStager *bool `json:"prestartStager,omitempty"`
	// PrefetchImages are pulled when kurmad starts.
	PrefetchImages []string `json:"prefetchImages,omitempty"`
	// InitialPods are created when kurmad starts (unless one with that name
	// exists already).
	InitialPods []pod.Spec `json:"initialPods,omitempty"`
	// PodNetworks are the raw pod_networks entries, parsed by the networking
	// package.
	PodNetworks []json.RawMessage `json:"pod_networks,omitempty"`
}

// Duration is a time.Duration written as a Go duration string ("60s") or a
// number of seconds.
type Duration time.Duration

// MarshalJSON writes the duration as a string.
func (d Duration) MarshalJSON() ([]byte, error) {
	return json.Marshal(time.Duration(d).String())
}

// UnmarshalJSON reads a duration string or a number of seconds.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		v, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("duration %q: %w", s, err)
		}
		*d = Duration(v)
		return nil
	}
	var n float64
	if err := json.Unmarshal(b, &n); err != nil {
		return fmt.Errorf("duration must be a string like \"60s\" or seconds: %s", b)
	}
	*d = Duration(n * float64(time.Second))
	return nil
}

// Default returns the configuration used when no file is given. The stager
// image and its trusted key are looked up next to the kurmad executable
// (<dir>/images/kurma-stager.aci and <dir>/keys/stager.pub), where `make`
// puts them.
func Default() *Config {
	exeDir := "/usr/lib/kurma"
	if exe, err := os.Executable(); err == nil {
		if r, err := filepath.EvalSymlinks(exe); err == nil {
			exe = r
		}
		exeDir = filepath.Dir(exe)
	}
	return defaultsFor(exeDir)
}

func defaultsFor(exeDir string) *Config {
	return &Config{
		PodsDir:      filepath.Join(DefaultStateDir, "pods"),
		ImagesDir:    filepath.Join(DefaultStateDir, "images"),
		VolumesDir:   filepath.Join(DefaultStateDir, "volumes"),
		Socket:       DefaultSocket,
		StagerImage:  "file://" + filepath.Join(exeDir, "images", "kurma-stager.aci"),
		TrustedKeys:  []string{filepath.Join(exeDir, "keys", "stager.pub")},
		ReadyTimeout: Duration(DefaultReadyTimeout),
	}
}

// Load reads the configuration file at path over the defaults. An empty path
// returns Default(). Errors wrap kerrors.Invalid (bad content) or the
// os error (unreadable file).
func Load(path string) (*Config, error) {
	if path == "" {
		return Default(), nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	c, err := Parse(b, Default())
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	return c, nil
}

// Parse decodes YAML or JSON data over base (which it does not modify) and
// validates the result. Relative directories are refused.
func Parse(data []byte, base *Config) (*Config, error) {
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, kerrors.New(kerrors.Invalid, "not YAML or JSON: %v", err)
	}
	js = bytes.TrimSpace(js)
	c := *base
	c.TrustedKeys = append([]string(nil), base.TrustedKeys...)
	if len(js) == 0 || string(js) == "null" {
		return &c, c.Validate()
	}
	// Accept the camelCase spelling of pod_networks too.
	var top map[string]json.RawMessage
	if err := json.Unmarshal(js, &top); err != nil {
		return nil, kerrors.New(kerrors.Invalid, "config must be an object: %v", err)
	}
	if v, ok := top["podNetworks"]; ok {
		if _, dup := top["pod_networks"]; dup {
			return nil, kerrors.New(kerrors.Invalid, "both pod_networks and podNetworks are set; use one")
		}
		delete(top, "podNetworks")
		top["pod_networks"] = v
		if js, err = json.Marshal(top); err != nil {
			return nil, fmt.Errorf("re-encode config: %w", err)
		}
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return nil, kerrors.New(kerrors.Invalid, "%s", strings.TrimPrefix(err.Error(), "json: "))
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &c, nil
}

// Validate checks the configuration's own rules (the networking and pod
// packages validate their parts when they use them).
func (c *Config) Validate() error {
	for _, d := range []struct{ name, v string }{
		{"podsDir", c.PodsDir}, {"imagesDir", c.ImagesDir},
		{"volumesDir", c.VolumesDir}, {"socket", c.Socket},
	} {
		if d.v == "" {
			return kerrors.New(kerrors.Invalid, "%s must not be empty", d.name)
		}
		if !filepath.IsAbs(d.v) {
			return kerrors.New(kerrors.Invalid, "%s must be an absolute path, got %q", d.name, d.v)
		}
	}
	if c.StagerImage == "" {
		return kerrors.New(kerrors.Invalid, "stagerImage must not be empty")
	}
	if c.ReadyTimeout < 0 {
		return kerrors.New(kerrors.Invalid, "readyTimeout must not be negative")
	}
	if len(c.StagerConfig) > 0 && !json.Valid(c.StagerConfig) {
		return kerrors.New(kerrors.Invalid, "stagerConfig is not valid JSON")
	}
	names := map[string]bool{}
	for i, p := range c.InitialPods {
		if p.Name == "" {
			return kerrors.New(kerrors.Invalid, "initialPods[%d]: name is required", i)
		}
		if names[p.Name] {
			return kerrors.New(kerrors.Invalid, "initialPods[%d]: duplicate pod name %q", i, p.Name)
		}
		names[p.Name] = true
		if len(p.Apps) == 0 {
			return kerrors.New(kerrors.Invalid, "initialPods[%d] (%s): at least one app is required", i, p.Name)
		}
	}
	for i, n := range c.PodNetworks {
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(n, &obj); err != nil {
			return kerrors.New(kerrors.Invalid, "pod_networks[%d] must be an object", i)
		}
	}
	return nil
}
