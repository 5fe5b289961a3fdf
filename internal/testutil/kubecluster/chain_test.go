package kubecluster

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestChainPortmap(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		types    []string
		err      string
	}{
		{"bridge", string(BridgeConfList("br0", "10.244.0.0/24", "/tmp/x")), []string{"bridge", "portmap"}, ""},
		{"two plugins", `{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"a"},{"type":"b"}]}`, []string{"a", "b", "portmap"}, ""},
		{"not json", `{`, nil, "chain portmap"},
		{"single plugin config", `{"cniVersion":"1.0.0","name":"n","type":"bridge"}`, nil, "no plugins list"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := ChainPortmap([]byte(tc.in))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var conf struct {
				Plugins []struct {
					Type         string          `json:"type"`
					Backend      string          `json:"backend"`
					Capabilities map[string]bool `json:"capabilities"`
				} `json:"plugins"`
			}
			if err := json.Unmarshal(out, &conf); err != nil {
				t.Fatal(err)
			}
			if len(conf.Plugins) != len(tc.types) {
				t.Fatalf("plugins %+v, want types %v", conf.Plugins, tc.types)
			}
			for i, p := range conf.Plugins {
				if p.Type != tc.types[i] {
					t.Fatalf("plugin %d: %q, want %q", i, p.Type, tc.types[i])
				}
			}
			last := conf.Plugins[len(conf.Plugins)-1]
			if last.Backend != "nftables" || !last.Capabilities["portMappings"] {
				t.Fatalf("portmap %+v", last)
			}
		})
	}
}
