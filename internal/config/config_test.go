package config

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"kurma.dev/kurma/pkg/kerrors"
)

func TestParse(t *testing.T) {
	base := defaultsFor("/opt/kurma/bin")
	tests := []struct {
		name    string
		in      string
		wantErr string
		check   func(t *testing.T, c *Config)
	}{
		{name: "empty keeps defaults", in: "", check: func(t *testing.T, c *Config) {
			if c.PodsDir != "/var/lib/kurma/pods" || c.Socket != DefaultSocket {
				t.Errorf("defaults changed: %+v", c)
			}
			if c.StagerImage != "file:///opt/kurma/bin/images/kurma-stager.aci" {
				t.Errorf("stager image %q", c.StagerImage)
			}
			if c.TrustedKeys[0] != "/opt/kurma/bin/keys/stager.pub" {
				t.Errorf("keys %v", c.TrustedKeys)
			}
			if time.Duration(c.ReadyTimeout) != DefaultReadyTimeout {
				t.Errorf("ready timeout %v", c.ReadyTimeout)
			}
		}},
		{name: "yaml overrides", in: "podsDir: /tmp/p\nstagerConfig:\n  fs: overlay\nreadyTimeout: 5s\n", check: func(t *testing.T, c *Config) {
			if c.PodsDir != "/tmp/p" || c.ImagesDir != "/var/lib/kurma/images" {
				t.Errorf("dirs %q %q", c.PodsDir, c.ImagesDir)
			}
			if string(c.StagerConfig) != `{"fs":"overlay"}` {
				t.Errorf("stagerConfig %s", c.StagerConfig)
			}
			if time.Duration(c.ReadyTimeout) != 5*time.Second {
				t.Errorf("timeout %v", c.ReadyTimeout)
			}
		}},
		{name: "json with podNetworks", in: `{"podNetworks":[{"name":"a","aci":"x","extra":1}],"readyTimeout":2}`, check: func(t *testing.T, c *Config) {
			if len(c.PodNetworks) != 1 || !strings.Contains(string(c.PodNetworks[0]), `"extra":1`) {
				t.Errorf("networks %s", c.PodNetworks)
			}
			if time.Duration(c.ReadyTimeout) != 2*time.Second {
				t.Errorf("timeout %v", c.ReadyTimeout)
			}
		}},
		{name: "pod_networks", in: "pod_networks:\n- name: a\n  aci: x\n", check: func(t *testing.T, c *Config) {
			if len(c.PodNetworks) != 1 {
				t.Errorf("networks %s", c.PodNetworks)
			}
		}},
		{name: "initial pods", in: "initialPods:\n- name: web\n  apps:\n  - image: file:///x.aci\n", check: func(t *testing.T, c *Config) {
			if len(c.InitialPods) != 1 || c.InitialPods[0].Apps[0].Image != "file:///x.aci" {
				t.Errorf("pods %+v", c.InitialPods)
			}
		}},
		{name: "unknown key", in: "podDir: /x\n", wantErr: `unknown field "podDir"`},
		{name: "unknown nested key", in: "initialPods:\n- name: a\n  aps: []\n", wantErr: `unknown field "aps"`},
		{name: "both network spellings", in: "pod_networks: []\npodNetworks: []\n", wantErr: "use one"},
		{name: "relative dir", in: "podsDir: pods\n", wantErr: "absolute"},
		{name: "bad duration", in: "readyTimeout: soon\n", wantErr: "duration"},
		{name: "negative duration", in: "readyTimeout: -1s\n", wantErr: "negative"},
		{name: "not an object", in: "- a\n- b\n", wantErr: "object"},
		{name: "bad yaml", in: "a: [\n", wantErr: "YAML"},
		{name: "duplicate initial pod", in: "initialPods:\n- name: a\n  apps: [{image: x}]\n- name: a\n  apps: [{image: x}]\n", wantErr: "duplicate"},
		{name: "pod without apps", in: "initialPods:\n- name: a\n", wantErr: "at least one app"},
		{name: "network not object", in: "pod_networks: [1]\n", wantErr: "must be an object"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse([]byte(tc.in), base)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want containing %q", err, tc.wantErr)
				}
				if !errors.Is(err, kerrors.Invalid) {
					t.Errorf("error %v is not Invalid", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, c)
		})
	}
	if base.PodsDir != "/var/lib/kurma/pods" {
		t.Errorf("Parse modified its base")
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "kurmad.yaml")
	if err := os.WriteFile(p, []byte("socket: /tmp/x.sock\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Load(p)
	if err != nil {
		t.Fatal(err)
	}
	if c.Socket != "/tmp/x.sock" {
		t.Errorf("socket %q", c.Socket)
	}
	if _, err := Load(filepath.Join(dir, "missing.yaml")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
	d, err := Load("")
	if err != nil || d.Socket != DefaultSocket {
		t.Errorf("Load(\"\") = %+v, %v", d, err)
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"", "podsDir: /a\n", `{"podNetworks":[{"name":"a"}]}`, "readyTimeout: 3\n",
		"initialPods:\n- name: a\n  apps: [{image: x}]\n", "stagerConfig: {a: 1}\n", "- x\n",
	} {
		f.Add([]byte(s))
	}
	base := defaultsFor("/opt/kurma")
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(data, base)
		if err != nil {
			if !errors.Is(err, kerrors.Invalid) {
				t.Fatalf("error without category: %v", err)
			}
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("accepted config fails validation: %v", err)
		}
	})
}

// TestDeployConfig: the shipped deploy/kurmad.yaml is valid and, with every
// key commented out, is the defaults; uncommented, its examples parse too.
func TestDeployConfig(t *testing.T) {
	path := filepath.Join("..", "..", "deploy", "kurmad.yaml")
	c, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(c, Default()) {
		t.Errorf("deploy/kurmad.yaml differs from the defaults: %+v", c)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, l := range strings.Split(string(raw), "\n") {
		// "# text" is a comment; "#key: ..." and "#  key: ..." (nested) are
		// settings commented out.
		if rest, ok := strings.CutPrefix(l, "#"); ok && (!strings.HasPrefix(rest, " ") || strings.HasPrefix(rest, "  ")) {
			l = rest
		}
		lines = append(lines, l)
	}
	if _, err := Parse([]byte(strings.Join(lines, "\n")), Default()); err != nil {
		t.Errorf("deploy/kurmad.yaml with its settings uncommented: %v", err)
	}
}
