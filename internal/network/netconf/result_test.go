package netconf

import (
	"errors"
	"strings"
	"testing"

	"kurma.dev/kurma/pkg/kerrors"
)

func TestParseResult(t *testing.T) {
	tests := []struct {
		name, out string
		ips       []string
		gw        string
		routes    int
	}{
		{"kurma spec ip4/ip6, no version", `{"ip4":{"ip":"10.1.2.3/16","gateway":"10.1.0.1","routes":[{"dst":"0.0.0.0/0"}]},"ip6":{"ip":"fd00::5/64"}}`,
			[]string{"10.1.2.3/16", "fd00::5/64"}, "10.1.0.1", 1},
		{"0.2.0", `{"cniVersion":"0.2.0","ip4":{"ip":"10.1.2.4/24"}}`, []string{"10.1.2.4/24"}, "", 0},
		{"0.3.1", `{"cniVersion":"0.3.1","interfaces":[{"name":"eth0","sandbox":"/proc/1/ns/net"}],"ips":[{"version":"4","address":"10.1.2.5/24","gateway":"10.1.2.1","interface":0}]}`,
			[]string{"10.1.2.5/24"}, "10.1.2.1", 0},
		{"0.4.0", `{"cniVersion":"0.4.0","ips":[{"version":"4","address":"10.1.2.6/24"}],"routes":[{"dst":"0.0.0.0/0","gw":"10.1.2.1"}]}`,
			[]string{"10.1.2.6/24"}, "", 1},
		{"1.0.0", `{"cniVersion":"1.0.0","interfaces":[{"name":"eth0"}],"ips":[{"address":"10.1.2.7/24","gateway":"10.1.2.1","interface":0}],"dns":{"nameservers":["10.1.2.1"]}}`,
			[]string{"10.1.2.7/24"}, "10.1.2.1", 0},
		{"1.1.0 with whitespace", "\n {\"cniVersion\":\"1.1.0\",\"ips\":[{\"address\":\"fd00::9/64\"}]}\n", []string{"fd00::9/64"}, "", 0},
		{"no ips", `{"cniVersion":"1.0.0"}`, nil, "", 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := ParseResult([]byte(tc.out))
			if err != nil {
				t.Fatal(err)
			}
			if len(r.IPs) != len(tc.ips) {
				t.Fatalf("got %d IPs, want %v", len(r.IPs), tc.ips)
			}
			for i, want := range tc.ips {
				if got := r.IPs[i].Address.String(); got != want {
					t.Errorf("ip[%d] = %s, want %s", i, got, want)
				}
			}
			if tc.gw != "" && r.IPs[0].Gateway.String() != tc.gw {
				t.Errorf("gateway %v, want %s", r.IPs[0].Gateway, tc.gw)
			}
			if len(r.Routes) != tc.routes {
				t.Errorf("%d routes, want %d", len(r.Routes), tc.routes)
			}
			if r.CNIVersion != "1.0.0" && r.CNIVersion != "1.1.0" {
				t.Errorf("internal version %q", r.CNIVersion)
			}
		})
	}
}

func TestParseResultErrors(t *testing.T) {
	tests := []struct{ name, out, want string }{
		{"empty", "  ", "empty"},
		{"not json", "oops", "JSON object"},
		{"array", "[]", "JSON object"},
		{"bad version", `{"cniVersion":"9.9.9","ips":[]}`, "9.9.9"},
		{"bad ip", `{"cniVersion":"1.0.0","ips":[{"address":"nope"}]}`, "plugin result"},
		{"cni error", `{"cniVersion":"1.0.0","code":7,"msg":"bad config"}`, "bad config"},
		{"trailing", `{"cniVersion":"1.0.0"}{}`, "trailing"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseResult([]byte(tc.out))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
			if tc.name != "cni error" && !errors.Is(err, kerrors.Invalid) {
				t.Errorf("error %v is not Invalid", err)
			}
		})
	}
}

func FuzzParseResult(f *testing.F) {
	f.Add([]byte(`{"ip4":{"ip":"10.1.2.3/16","gateway":"10.1.0.1","routes":[{"dst":"0.0.0.0/0"}]}}`))
	f.Add([]byte(`{"cniVersion":"0.3.1","interfaces":[{"name":"eth0"}],"ips":[{"version":"4","address":"10.1.2.5/24","interface":0}]}`))
	f.Add([]byte(`{"cniVersion":"0.4.0","ips":[{"version":"6","address":"fd00::1/64","interface":3}]}`))
	f.Add([]byte(`{"cniVersion":"1.0.0","ips":[{"address":"10.1.2.7/24","interface":-1}],"dns":{}}`))
	f.Add([]byte(`{"code":11,"msg":"later"}`))
	f.Fuzz(func(t *testing.T, out []byte) {
		r, err := ParseResult(out)
		if err != nil {
			return
		}
		for _, ip := range r.IPs {
			if ip.Address.IP == nil {
				t.Fatalf("accepted result with an empty address: %s", out)
			}
		}
	})
}
