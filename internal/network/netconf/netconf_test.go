package netconf

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"kurma.dev/kurma/pkg/kerrors"
)

const goodEntry = `{"name":"mynet","aci":"file:///opt/net.aci","default":true,"containerInterface":"eth0",
 "cniVersion":"1.0.0","type":"bridge","bridge":"mynet0","isGateway":true,"ipMasq":true,
 "ipam":{"type":"host-local","subnet":"10.10.0.0/16","routes":[{"dst":"0.0.0.0/0"}]}}`

func TestParseEntry(t *testing.T) {
	n, err := ParseEntry([]byte(goodEntry))
	if err != nil {
		t.Fatal(err)
	}
	if n.Name != "mynet" || n.ACI != "file:///opt/net.aci" || !n.Default || n.ContainerInterface != "eth0" || n.Interface == nil {
		t.Fatalf("unexpected network %+v", n)
	}
	var cfg map[string]any
	if err := json.Unmarshal(n.Config, &cfg); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{KeyACI, KeyDefault, KeyContainerInterface} {
		if _, ok := cfg[k]; ok {
			t.Errorf("plugin config still has Kurma key %q", k)
		}
	}
	for _, k := range []string{"name", "type", "bridge", "ipam", "cniVersion", "isGateway", "ipMasq"} {
		if _, ok := cfg[k]; !ok {
			t.Errorf("plugin config lost key %q", k)
		}
	}
	if cfg["ipam"].(map[string]any)["subnet"] != "10.10.0.0/16" {
		t.Errorf("ipam not passed untouched: %v", cfg["ipam"])
	}
}

func TestParseEntryErrors(t *testing.T) {
	tests := []struct {
		name, entry, want string
		cat               error
	}{
		{"not object", `[1]`, "JSON object", kerrors.Invalid},
		{"trailing", `{"name":"a"} {}`, "trailing", kerrors.Invalid},
		{"trailing brace", `{"name":"a","aci":"x","type":"bridge"}}`, "trailing", kerrors.Invalid},
		{"no name", `{"aci":"x","type":"bridge"}`, "name is empty", kerrors.Invalid},
		{"bad name", `{"name":"a b","aci":"x","type":"bridge"}`, "may hold only", kerrors.Invalid},
		{"reserved", `{"name":"host","aci":"x","type":"bridge"}`, "reserved", kerrors.Invalid},
		{"name type", `{"name":3,"aci":"x","type":"bridge"}`, "must be a string", kerrors.Invalid},
		{"no aci", `{"name":"a","type":"bridge"}`, "missing image", kerrors.Invalid},
		{"bad scheme", `{"name":"a","aci":"ftp://h/x","type":"bridge"}`, "unsupported scheme", kerrors.Invalid},
		{"relative file", `{"name":"a","aci":"file://rel/x.aci","type":"bridge"}`, "absolute path", kerrors.Invalid},
		{"http no host", `{"name":"a","aci":"http:///x","type":"bridge"}`, "no host", kerrors.Invalid},
		{"docker empty", `{"name":"a","aci":"docker://","type":"bridge"}`, "no repository", kerrors.Invalid},
		{"bare with space", `{"name":"a","aci":"my image","type":"bridge"}`, "neither a URI", kerrors.Invalid},
		{"default type", `{"name":"a","aci":"x","default":"yes","type":"bridge"}`, "true or false", kerrors.Invalid},
		{"no type", `{"name":"a","aci":"x"}`, "no plugin \"type\"", kerrors.Invalid},
		{"empty chain", `{"name":"a","aci":"x","plugins":[]}`, "is empty", kerrors.Invalid},
		{"chain no type", `{"name":"a","aci":"x","plugins":[{"bridge":"b"}]}`, "plugins[0]", kerrors.Invalid},
		{"bad template", `{"name":"a","aci":"x","type":"bridge","containerInterface":"{{.Nope"}`, "containerInterface", kerrors.Invalid},
		{"long iface", `{"name":"a","aci":"x","type":"bridge","containerInterface":"averyveryverylongname"}`, "longer than 15", kerrors.Invalid},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseEntry([]byte(tc.entry))
			if err == nil {
				t.Fatalf("no error for %s", tc.entry)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not mention %q", err, tc.want)
			}
			if !errors.Is(err, tc.cat) {
				t.Errorf("error %q is not in category %v", err, tc.cat)
			}
		})
	}
}

func TestParseConfig(t *testing.T) {
	tests := []struct {
		name, doc string
		names     []string
		wantErr   string
	}{
		{"snake", `{"pod_networks":[` + goodEntry + `]}`, []string{"mynet"}, ""},
		{"camel", `{"podNetworks":[` + goodEntry + `, {"name":"lo2","aci":"docker:///u/p:1","type":"loopback"}]}`, []string{"mynet", "lo2"}, ""},
		{"none", `{"other":1}`, nil, ""},
		{"both", `{"pod_networks":[],"podNetworks":[]}`, nil, "not both"},
		{"not list", `{"pod_networks":{}}`, nil, "list of objects"},
		{"duplicate", `{"pod_networks":[` + goodEntry + `,` + goodEntry + `]}`, nil, `pod_networks[1] "mynet": duplicate network name (also pod_networks[0])`},
		{"names entry", `{"pod_networks":[{"name":"broken","type":"bridge"}]}`, nil, `pod_networks[0] "broken": missing image`},
		{"bad json", `{"pod_networks":[`, nil, "daemon config"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			nets, err := ParseConfig([]byte(tc.doc))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, n := range nets {
				got = append(got, n.Name)
			}
			if strings.Join(got, ",") != strings.Join(tc.names, ",") {
				t.Errorf("names %v, want %v", got, tc.names)
			}
		})
	}
}

func TestDuplicateIsConflict(t *testing.T) {
	_, err := Parse([]json.RawMessage{json.RawMessage(goodEntry), json.RawMessage(goodEntry)})
	if !errors.Is(err, kerrors.Conflict) {
		t.Fatalf("duplicate: %v, want Conflict", err)
	}
}

func TestDefault(t *testing.T) {
	n, err := Default("file:///var/lib/kurma/kurma-netplugin.aci")
	if err != nil {
		t.Fatal(err)
	}
	if n.Name != DefaultName || !n.Default || n.ContainerInterface != "eth0" {
		t.Fatalf("default network %+v", n)
	}
	var cfg struct {
		Type, Bridge string
		IsGateway    bool `json:"isGateway"`
		IPMasq       bool `json:"ipMasq"`
		IPAM         struct{ Type, Subnet string }
	}
	if err := json.Unmarshal(n.Config, &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.Type != "bridge" || cfg.Bridge != "kurma0" || !cfg.IsGateway || !cfg.IPMasq || cfg.IPAM.Type != "host-local" || cfg.IPAM.Subnet != DefaultSubnet {
		t.Fatalf("default plugin config %s", n.Config)
	}
	if _, err := Default(""); err == nil {
		t.Fatal("Default with no image: no error")
	}
}

func FuzzParseConfig(f *testing.F) {
	f.Add([]byte(`{"pod_networks":[` + goodEntry + `]}`))
	f.Add([]byte(`{"podNetworks":[{"name":"a","aci":"x","plugins":[{"type":"bridge"},{"type":"portmap"}]}]}`))
	f.Add([]byte(`{"pod_networks":[{"name":"a","aci":"docker://r/x","type":"t","containerInterface":"k{{shortuuid}}{{random 3}}"}]}`))
	f.Add([]byte(`{"pod_networks":null}`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, doc []byte) {
		nets, err := ParseConfig(doc)
		if err != nil {
			return
		}
		seen := map[string]bool{}
		for _, n := range nets {
			if ValidateName(n.Name) != nil || ValidateACI(n.ACI) != nil {
				t.Fatalf("accepted invalid network %+v", n)
			}
			if seen[n.Name] {
				t.Fatalf("accepted duplicate %q", n.Name)
			}
			seen[n.Name] = true
			var cfg map[string]json.RawMessage
			if err := json.Unmarshal(n.Config, &cfg); err != nil {
				t.Fatalf("plugin config is not an object: %v", err)
			}
			if _, ok := cfg[KeyACI]; ok {
				t.Fatal("plugin config keeps aci")
			}
		}
	})
}
