package cniwire

import (
	"encoding/json"
	"testing"
)

func TestConfList(t *testing.T) {
	for _, tc := range []struct {
		name    string
		portmap bool
		types   []string
	}{
		{"driver only", false, []string{"kurma-k8s"}},
		{"portmap chained", true, []string{"kurma-k8s", "portmap"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var conf struct {
				CNIVersion string `json:"cniVersion"`
				Name       string `json:"name"`
				Plugins    []struct {
					Type         string          `json:"type"`
					Socket       string          `json:"socket"`
					Backend      string          `json:"backend"`
					Capabilities map[string]bool `json:"capabilities"`
				} `json:"plugins"`
			}
			if err := json.Unmarshal(ConfList("/run/x.sock", tc.portmap), &conf); err != nil {
				t.Fatal(err)
			}
			if conf.CNIVersion != "1.0.0" || conf.Name != "kurma" || len(conf.Plugins) != len(tc.types) {
				t.Fatalf("got %+v", conf)
			}
			for i, p := range conf.Plugins {
				if p.Type != tc.types[i] {
					t.Fatalf("plugin %d is %q, want %q", i, p.Type, tc.types[i])
				}
			}
			if conf.Plugins[0].Socket != "/run/x.sock" {
				t.Fatalf("socket %q", conf.Plugins[0].Socket)
			}
			if tc.portmap && (conf.Plugins[1].Backend != "nftables" || !conf.Plugins[1].Capabilities["portMappings"]) {
				t.Fatalf("portmap %+v", conf.Plugins[1])
			}
		})
	}
}
